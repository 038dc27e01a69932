package quicfront

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/internal/quicwire"
)

// dialFrom opens a QUIC connection to s from a UDP socket bound to the
// loopback address from, so tests can play several client hosts (Linux
// routes all of 127.0.0.0/8 to lo). The client sends keep-alives every
// 50 ms, so the server's idle timeout never closes the connection; it is
// closed at cleanup.
func dialFrom(t *testing.T, s *testServer, from string) *quic.Conn {
	t.Helper()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(from)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: udp}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := tr.Dial(ctx, s.Addr(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{DefaultALPN}},
		&quic.Config{MaxIdleTimeout: time.Minute, KeepAlivePeriod: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	t.Cleanup(func() {
		_ = conn.CloseWithError(0, "")
		_ = tr.Close()
		_ = udp.Close()
	})
	return conn
}

// closedWith waits, at most within, for conn to end and returns the
// application error code the server closed it with; it fails the test if
// the connection is still open then or ended some other way.
func closedWith(t *testing.T, conn *quic.Conn, within time.Duration) pgproto.QUICErrorCode {
	t.Helper()
	select {
	case <-conn.Context().Done():
	case <-time.After(within):
		t.Fatalf("connection from %s still open after %v", conn.LocalAddr(), within)
	}
	var ae *quic.ApplicationError
	if cause := context.Cause(conn.Context()); !errors.As(cause, &ae) || !ae.Remote {
		t.Fatalf("connection from %s ended by %v, want a CONNECTION_CLOSE from the server", conn.LocalAddr(), cause)
	}
	return pgproto.QUICErrorCode(ae.ErrorCode)
}

// TestFirstStreamTimeout: a connection that never opens a stream, kept
// alive by PINGs, is closed with no_stream_timeout once FirstStreamTimeout
// has passed since it was accepted, and its connection slot is free again;
// a connection that opened a stream in time is not closed by it.
func TestFirstStreamTimeout(t *testing.T) {
	const timeout = 400 * time.Millisecond
	s := startServer(t, ServerConfig{FirstStreamTimeout: timeout, MaxConns: 2, MaxConnsPerSource: 2}, quictest.Echo{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	used := dialFrom(t, s, "127.0.0.1")
	roundTrip(t, ctx, used)

	start := time.Now()
	silent := dialFrom(t, s, "127.0.0.1")
	quictest.Eventually(t, 5*time.Second, "two connections", func() bool {
		return quictest.GaugeValue(t, s.reg, "pgquic_quic_connections") == 2
	})
	if code := closedWith(t, silent, timeout+5*time.Second); code != pgproto.QUICNoStreamTimeout {
		t.Fatalf("silent connection closed with %v, want %v", code, pgproto.QUICNoStreamTimeout)
	}
	if took := time.Since(start); took < timeout*3/4 {
		t.Fatalf("silent connection closed after %v, before FirstStreamTimeout %v", took, timeout)
	}
	quictest.Eventually(t, 5*time.Second, "the silent connection's slot freed", func() bool {
		return quictest.GaugeValue(t, s.reg, "pgquic_quic_connections") == 1
	})
	// The slot it held takes a new connection (MaxConns is 2).
	next := dialFrom(t, s, "127.0.0.1")
	roundTrip(t, ctx, next)

	// The connection that opened a stream in time outlives the timeout.
	if err := used.Context().Err(); err != nil {
		t.Fatalf("connection that opened a stream was closed: %v", context.Cause(used.Context()))
	}
	roundTrip(t, ctx, used)
}

// TestMaxConnsPerSource: one source (127.0.0.1) holding its
// MaxConnsPerSource connections, none of which opens a stream, gets its
// next connection closed with too_many_conns, while another source
// (127.0.0.2) still connects and runs a session; once one of the first
// source's connections closes, that source connects again.
func TestMaxConnsPerSource(t *testing.T) {
	s := startServer(t, ServerConfig{MaxConns: 10, MaxConnsPerSource: 2, FirstStreamTimeout: time.Minute}, quictest.Echo{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	a1 := dialFrom(t, s, "127.0.0.1")
	dialFrom(t, s, "127.0.0.1")
	quictest.Eventually(t, 5*time.Second, "two connections", func() bool {
		return quictest.GaugeValue(t, s.reg, "pgquic_quic_connections") == 2
	})
	over := dialFrom(t, s, "127.0.0.1")
	if code := closedWith(t, over, 10*time.Second); code != pgproto.QUICTooManyConns {
		t.Fatalf("third connection from 127.0.0.1 closed with %v, want %v", code, pgproto.QUICTooManyConns)
	}
	if got := quictest.GaugeValue(t, s.reg, "pgquic_quic_connections_refused_total"); got != 1 {
		t.Fatalf("connections_refused_total = %v, want 1", got)
	}

	other := dialFrom(t, s, "127.0.0.2")
	roundTrip(t, ctx, other)
	if err := other.Context().Err(); err != nil {
		t.Fatalf("connection from another source was closed: %v", context.Cause(other.Context()))
	}

	_ = a1.CloseWithError(quicwire.AppCode(pgproto.QUICNoError), "")
	quictest.Eventually(t, 5*time.Second, "the closed connection's slot freed", func() bool {
		return quictest.GaugeValue(t, s.reg, "pgquic_quic_connections") == 2
	})
	again := dialFrom(t, s, "127.0.0.1")
	roundTrip(t, ctx, again)
}
