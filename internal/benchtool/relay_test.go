package benchtool

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRelay checks the relay target's program logic against a scripted
// upstream that echoes: 20 clients at once each get their own upstream
// connection and their bytes back in order, a client that closes closes
// its upstream connection, and ending the context closes every connection
// and returns nil.
func TestRelay(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	upstreamClosed := make(chan struct{}, 64)
	var accepted sync.WaitGroup
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			accepted.Go(func() {
				_, _ = io.Copy(c, c) // echo until the relay closes
				_ = c.Close()
				upstreamClosed <- struct{}{}
			})
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Relay(ctx, ln, up.Addr().String()) }()

	const clients = 20
	conns := make([]net.Conn, clients)
	var wg sync.WaitGroup
	for i := range clients {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
		wg.Go(func() {
			msg := bytes.Repeat([]byte{byte('a' + i)}, 10000+i) // more than one read buffer
			if _, err := c.Write(msg); err != nil {
				t.Errorf("client %d: write: %v", i, err)
				return
			}
			got := make([]byte, len(msg))
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
				t.Errorf("client %d: echo %v, equal %v", i, err, bytes.Equal(got, msg))
			}
		})
	}
	wg.Wait()

	// One client leaves: its upstream connection goes too.
	_ = conns[0].Close()
	select {
	case <-upstreamClosed:
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream connection of a closed client stayed open")
	}

	// The end of the context closes the rest, on both sides.
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Relay returned %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Relay did not return after its context ended")
	}
	for i := 1; i < clients; i++ {
		_ = conns[i].SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := conns[i].Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
			t.Errorf("client %d after shutdown: read %v, want end of file", i, err)
		}
		_ = conns[i].Close()
	}
	for i := 1; i < clients; i++ {
		select {
		case <-upstreamClosed:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d upstream connections still open after shutdown", clients-i, clients-1)
		}
	}
	accepted.Wait()
}

// isReset reports a connection reset by the peer, which a close with
// unread data can cause instead of a clean end of file.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET)
}

// TestRelayTargetNeedsBinary checks that asking for the relay target
// without a usable --relay binary stops the tool at once with what to pass,
// before anything is started.
func TestRelayTargetNeedsBinary(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--targets", "pgquic,relay"}, "the relay target needs --relay PATH"},
		{[]string{"--targets", "relay", "--relay", filepath.Join(t.TempDir(), "missing")}, "--relay: "},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"--quick", "--pgquic", self}, tc.args...)
		if code := Main(context.Background(), args, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 1 and %q", tc.args, code, stderr.String(), tc.want)
		}
		if strings.Contains(stdout.String(), "starting PostgreSQL") {
			t.Errorf("%v: started PostgreSQL before refusing", tc.args)
		}
	}
}
