package tcpfront

import (
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/rawsock"
)

// TestWaitRead checks the idle wait the front gives the pooler on real
// loopback sockets: it blocks while the client is quiet, returns once bytes
// arrive without consuming them, and returns when the client closes, when
// the session's stream is closed, and at a read deadline.
func TestWaitRead(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func(t *testing.T) (net.Conn, front.ReadWaiter, net.Conn) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
		stream := withWait(rawsock.Wrap(s), s)
		w, ok := stream.(front.ReadWaiter)
		if !ok {
			t.Skip("no idle wait on this platform")
		}
		return c, w, stream
	}
	wait := func(w front.ReadWaiter) chan error {
		done := make(chan error, 1)
		go func() { done <- w.WaitRead() }()
		return done
	}
	quiet := func(t *testing.T, done chan error) {
		t.Helper()
		select {
		case err := <-done:
			t.Fatalf("WaitRead returned (%v) while the client sent nothing", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	returns := func(t *testing.T, done chan error) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("WaitRead still blocked")
			return nil
		}
	}

	t.Run("data", func(t *testing.T) {
		c, w, stream := pair(t)
		done := wait(w)
		quiet(t, done)
		if _, err := c.Write([]byte("Q1")); err != nil {
			t.Fatal(err)
		}
		if err := returns(t, done); err != nil {
			t.Fatalf("WaitRead with bytes waiting: %v", err)
		}
		if err := w.WaitRead(); err != nil { // the bytes are still there
			t.Fatalf("second WaitRead: %v", err)
		}
		b := make([]byte, 2)
		if _, err := io.ReadFull(stream, b); err != nil || string(b) != "Q1" {
			t.Fatalf("read after WaitRead: %q, %v; want \"Q1\"", b, err)
		}
	})
	t.Run("client closes", func(t *testing.T) {
		c, w, stream := pair(t)
		done := wait(w)
		quiet(t, done)
		_ = c.Close()
		if err := returns(t, done); err != nil {
			t.Fatalf("WaitRead at end of file: %v", err)
		}
		if _, err := stream.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("read after the client closed: %v, want EOF", err)
		}
	})
	t.Run("stream closed", func(t *testing.T) {
		_, w, stream := pair(t)
		done := wait(w)
		quiet(t, done)
		_ = stream.Close()
		if err := returns(t, done); err == nil {
			t.Fatal("WaitRead on a closed stream returned no error")
		}
	})
	t.Run("deadline", func(t *testing.T) {
		_, w, stream := pair(t)
		_ = stream.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if err := returns(t, wait(w)); !os.IsTimeout(err) {
			t.Fatalf("WaitRead past the read deadline: %v, want a timeout", err)
		}
	})
}
