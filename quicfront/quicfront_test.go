package quicfront

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/internal/quicwire"
	"github.com/pgquic/pgquic/quicclient"
)

func TestPgconnOverQUIC(t *testing.T) {
	h := quictest.NewScriptedPG()
	s := startServer(t, ServerConfig{}, h)
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := pgconn.ConnectConfig(ctx, quictest.PgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		got, err := quictest.QueryInt(ctx, c, i)
		if err != nil {
			t.Fatal(err)
		}
		if got != fmt.Sprint(i) {
			t.Fatalf("select %d returned %q", i, got)
		}
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	peer := h.Peers()[0]
	if peer.Transport != "quic" || !peer.Secure || peer.StartTLS != nil || peer.Addr == nil {
		t.Fatalf("unexpected peer %+v", peer)
	}
	quictest.Eventually(t, 10*time.Second, "streams gauge back to 0", func() bool {
		return quictest.GaugeValue(t, s.reg, "pgquic_quic_streams") == 0
	})
	if got := quictest.GaugeValue(t, s.reg, "pgquic_quic_streams_total"); got != 1 {
		t.Fatalf("streams_total = %v, want 1", got)
	}
}

// TestManyPgconnSessions runs many concurrent pgconn sessions over a few connections.
func TestManyPgconnSessions(t *testing.T) {
	const n = 200
	s := startServer(t, ServerConfig{}, quictest.NewScriptedPG())
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			c, err := pgconn.ConnectConfig(ctx, quictest.PgConfig(t, d))
			if err != nil {
				errs <- err
				return
			}
			defer c.Close(ctx)
			for j := range 5 {
				got, err := quictest.QueryInt(ctx, c, i*10+j)
				if err != nil {
					errs <- err
					return
				}
				if got != fmt.Sprint(i*10+j) {
					errs <- fmt.Errorf("got %s", got)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st := d.Stats(); st.Conns != 3 {
		t.Fatalf("dialer used %d connections, want 3", st.Conns)
	}
}

func rawClientConn(t *testing.T, s *testServer) (*quic.Conn, *quic.Transport) {
	t.Helper()
	tr := &quic.Transport{Conn: quictest.MustUDP(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := tr.Dial(ctx, s.Addr(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{DefaultALPN}}, &quic.Config{MaxIdleTimeout: time.Minute, KeepAlivePeriod: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.CloseWithError(0, "")
		_ = tr.Close()
		_ = tr.Conn.Close()
	})
	return conn, tr
}

// TestAbandonedStreamsDoNotLeak opens 500 streams that are reset or
// abandoned at various points and checks that the server releases their
// goroutines and credit.
func TestAbandonedStreamsDoNotLeak(t *testing.T) {
	s := startServer(t, ServerConfig{StreamStartupTimeout: 500 * time.Millisecond}, quictest.Echo{})
	conn, _ := rawClientConn(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	// Warm up so lazily started goroutines are in the baseline.
	roundTrip(t, ctx, conn)
	settle := func() int {
		var n int
		for range 10 {
			runtime.GC()
			time.Sleep(50 * time.Millisecond)
			n = runtime.NumGoroutine()
		}
		return n
	}
	quictest.Eventually(t, 10*time.Second, "idle server", func() bool { return quictest.GaugeValue(t, s.reg, "pgquic_quic_streams") == 0 })
	base := settle()

	msg := quictest.StartupBytes()
	var abandoned []*quic.Stream
	for i := range 500 {
		str, err := conn.OpenStreamSync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch i % 3 {
		case 0: // partial startup, then reset
			_, _ = str.Write(msg[:2])
			str.CancelWrite(quicwire.StreamCode(pgproto.QUICAborted))
			str.CancelRead(quicwire.StreamCode(pgproto.QUICAborted))
		case 1: // partial startup, then silence: the server times it out
			_, _ = str.Write(msg[:3])
			abandoned = append(abandoned, str)
		case 2: // full startup reaches the handler, then reset
			_, _ = str.Write(msg)
			time.Sleep(time.Millisecond)
			str.CancelWrite(quicwire.StreamCode(pgproto.QUICAborted))
			str.CancelRead(quicwire.StreamCode(pgproto.QUICAborted))
		}
	}
	quictest.Eventually(t, 30*time.Second, "server streams gauge back to 0", func() bool {
		return quictest.GaugeValue(t, s.reg, "pgquic_quic_streams") == 0
	})
	// An abandoned stream learns it was reset for startup timeout.
	_, err := abandoned[0].Read(make([]byte, 1))
	if code, ok := quicclient.RemoteErrorCode(err); !ok || code != quicclient.ErrCodeStartupTimeout {
		t.Fatalf("abandoned stream: got %v, want startup timeout reset", err)
	}
	const tolerance = 10
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := settle()
		if n <= base+tolerance {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines: %d before, %d after\n%s", base, n, buf[:runtime.Stack(buf, true)])
		}
	}
	// All credit is back: a full MaxStreamsPerConn of streams can be open at once.
	var wg sync.WaitGroup
	var hold sync.WaitGroup
	hold.Add(DefaultMaxStreamsPerConn)
	errs := make(chan error, DefaultMaxStreamsPerConn)
	strs := make(chan *quic.Stream, DefaultMaxStreamsPerConn)
	for range DefaultMaxStreamsPerConn {
		wg.Go(func() {
			defer hold.Done()
			octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
			defer ocancel()
			str, err := conn.OpenStreamSync(octx)
			if err != nil {
				errs <- err
				return
			}
			strs <- str
			if _, err := str.Write(msg); err != nil {
				errs <- err
				return
			}
			if _, err := io.ReadFull(str, make([]byte, len(msg))); err != nil {
				// On a loaded machine a stream may miss the short startup
				// timeout; its credit was granted, which is what counts here.
				if code, ok := quicclient.RemoteErrorCode(err); !ok || code != quicclient.ErrCodeStartupTimeout {
					errs <- err
				}
			}
		})
	}
	hold.Wait()
	close(strs)
	for str := range strs {
		_ = str.Close()
		str.CancelRead(0)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, str := range abandoned {
		str.CancelWrite(0)
	}
}

func roundTrip(t *testing.T, ctx context.Context, conn *quic.Conn) {
	t.Helper()
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msg := quictest.StartupBytes()
	if _, err := str.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(str, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	_ = str.Close()
	if _, err := io.ReadAll(str); err != nil {
		t.Fatal(err)
	}
}
