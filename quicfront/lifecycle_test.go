package quicfront

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/quicclient"
)

func fixedCertConfig(t *testing.T) *tls.Config {
	t.Helper()
	cert, err := GenerateSelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}}
}

// TestServerRestartRedial: a gracefully restarted server closes its
// connections; the dialer notices and re-dials for the next session.
func TestServerRestartRedial(t *testing.T) {
	tc := fixedCertConfig(t)
	s1 := startServer(t, ServerConfig{TLSConfig: tc}, quictest.NewScriptedPG())
	addr := s1.Addr().String()
	d := newTestDialer(t, quicclient.DialerConfig{Addr: addr, PinSHA256: s1.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, quictest.PgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := quictest.QueryInt(ctx, c, 1); err != nil {
		t.Fatal(err)
	}
	_ = c.Close(ctx)

	s1.stop(t)
	quictest.Eventually(t, 10*time.Second, "dialer to notice the closed connection", func() bool { return d.Stats().Conns == 0 })

	startServer(t, ServerConfig{Addr: addr, TLSConfig: tc}, quictest.NewScriptedPG())
	c = quictest.Connect(t, ctx, d)
	if got, err := quictest.QueryInt(ctx, c, 2); err != nil || got != "2" {
		t.Fatalf("after restart: %q %v", got, err)
	}
}

// TestServerCrashRedial: a server that vanished without closing its
// connections is detected through a stateless reset from its successor
// (same certificate, so same reset key), well before the idle timeout.
func TestServerCrashRedial(t *testing.T) {
	tc := fixedCertConfig(t)
	s1 := startServer(t, ServerConfig{TLSConfig: tc}, quictest.NewScriptedPG())
	addr := s1.Addr().String()
	d := newTestDialer(t, quicclient.DialerConfig{Addr: addr, PinSHA256: s1.Fingerprint(), IdleTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, quictest.PgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close(ctx)
	quictest.Eventually(t, 10*time.Second, "session end", func() bool { return quictest.GaugeValue(t, s1.reg, "pgquic_quic_streams") == 0 })

	// Crash: drop the socket without CONNECTION_CLOSE.
	s1.mu.Lock()
	tr, udp := s1.tr, s1.udp
	s1.mu.Unlock()
	_ = tr.Close()
	_ = udp.Close()

	startServer(t, ServerConfig{Addr: addr, TLSConfig: tc}, quictest.NewScriptedPG())
	start := time.Now()
	for {
		c, err = pgconn.ConnectConfig(ctx, quictest.PgConfig(t, d))
		if err == nil {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("no recovery after crash: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer c.Close(ctx)
	if got, err := quictest.QueryInt(ctx, c, 5); err != nil || got != "5" {
		t.Fatalf("after crash: %q %v", got, err)
	}
}

func TestMaxConnsRefused(t *testing.T) {
	s := startServer(t, ServerConfig{MaxConns: 1}, quictest.Echo{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d1 := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), Insecure: true, Conns: 1})
	c, err := d1.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d2 := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), Insecure: true, Conns: 1})
	c2, err := d2.Dial(ctx)
	if err == nil {
		// The stream may open before the refusal arrives; the session then fails.
		_, _ = c2.Write(quictest.StartupBytes())
		_, err = c2.Read(make([]byte, 1))
		_ = c2.Close()
	}
	if code, ok := quicclient.RemoteErrorCode(err); !ok || code != quicclient.ErrCodeTooManyConns {
		t.Fatalf("want too_many_conns, got %v", err)
	}
	if got := quictest.GaugeValue(t, s.reg, "pgquic_quic_connections_refused_total"); got < 1 {
		t.Fatalf("connections_refused_total = %v", got)
	}
}

func TestStartupTimeout(t *testing.T) {
	s := startServer(t, ServerConfig{StreamStartupTimeout: 200 * time.Millisecond}, quictest.Echo{})
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), Insecure: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := d.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte{0, 0}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Read(make([]byte, 1))
	if code, ok := quicclient.RemoteErrorCode(err); !ok || code != quicclient.ErrCodeStartupTimeout {
		t.Fatalf("want startup_timeout reset, got %v", err)
	}
	if got := quictest.GaugeValue(t, s.reg, "pgquic_quic_streams_abandoned_total"); got != 1 {
		t.Fatalf("streams_abandoned_total = %v", got)
	}
	if got := quictest.GaugeValue(t, s.reg, "pgquic_quic_streams_refused_total"); got != 0 {
		t.Fatalf("streams_refused_total = %v after a client's silence, want 0: the server refused nothing", got)
	}
}

// TestShutdownDrains: running sessions finish, new streams are refused with
// server_shutdown, and the connection closes when its last session ends.
func TestShutdownDrains(t *testing.T) {
	s := startServer(t, ServerConfig{}, quictest.NewScriptedPG())
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, quictest.PgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		done <- s.Shutdown(sctx)
	}()
	quictest.Eventually(t, 10*time.Second, "draining", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.draining
	})
	// The running session still works.
	if got, err := quictest.QueryInt(ctx, c, 9); err != nil || got != "9" {
		t.Fatalf("running session broke during drain: %q %v", got, err)
	}
	// A new session on the same connection is refused.
	nc, err := d.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = nc.Write(quictest.StartupBytes())
	_, err = nc.Read(make([]byte, 1))
	if code, ok := quicclient.RemoteErrorCode(err); !ok || code != quicclient.ErrCodeServerShutdown {
		t.Fatalf("want server_shutdown for a new stream, got %v", err)
	}
	_ = nc.Close()
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned while a session ran: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	_ = c.Close(ctx)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown did not return after the last session ended")
	}
	quictest.Eventually(t, 10*time.Second, "dialer sees the closed connection", func() bool { return d.Stats().Conns == 0 })
}

// TestShutdownGraceExpires: a session that does not end is cut when the
// grace period passes.
func TestShutdownGraceExpires(t *testing.T) {
	s := startServer(t, ServerConfig{}, quictest.NewScriptedPG())
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := quictest.Connect(t, ctx, d)
	sctx, scancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer scancel()
	if err := s.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want deadline exceeded", err)
	}
	if _, err := quictest.QueryInt(ctx, c, 1); err == nil {
		t.Fatal("session survived a forced shutdown")
	}
}

// TestServeContextCancel stops the server hard through Serve's context.
func TestServeContextCancel(t *testing.T) {
	s, err := NewServer(ServerConfig{Addr: "127.0.0.1:0"}, quictest.NewScriptedPG(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(sctx) }()
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := quictest.Connect(t, ctx, d)
	scancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return")
	}
	if _, err := quictest.QueryInt(ctx, c, 1); err == nil {
		t.Fatal("session survived")
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []ServerConfig{
		{},
		{Addr: "127.0.0.1:0", MaxStreamsPerConn: 100},
		{Addr: "127.0.0.1:0", MaxConns: -1},
		{Addr: "127.0.0.1:0", MaxConnsPerSource: -1},
		{Addr: "127.0.0.1:0", FirstStreamTimeout: -time.Second},
	} {
		if _, err := NewServer(cfg, quictest.Echo{}, nil, nil); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	s, err := NewServer(ServerConfig{Addr: "127.0.0.1:0"}, quictest.Echo{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.ALPN != DefaultALPN || c.MaxConns != 1000 || c.MaxStreamsPerConn != 1000 || c.StreamStartupTimeout != 10*time.Second ||
		c.IdleTimeout != 60*time.Second || c.KeepAlivePeriod != 15*time.Second || c.Allow0RTT ||
		c.MaxConnsPerSource != 250 || c.FirstStreamTimeout != 15*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	if s.quicCfg.MaxIncomingUniStreams != -1 || s.quicCfg.EnableDatagrams || s.tlsConf.MinVersion != tls.VersionTLS13 || s.tlsConf.NextProtos[0] != DefaultALPN {
		t.Fatal("quic/tls settings")
	}
	if len(s.Fingerprint()) != 64 {
		t.Fatalf("fingerprint %q", s.Fingerprint())
	}
}

// TestAllow0RTTServer: the early listener path still runs sessions (after
// the handshake completed).
func TestAllow0RTTServer(t *testing.T) {
	s := startServer(t, ServerConfig{Allow0RTT: true}, quictest.NewScriptedPG())
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := quictest.Connect(t, ctx, d)
	if got, err := quictest.QueryInt(ctx, c, 4); err != nil || got != "4" {
		t.Fatalf("%q %v", got, err)
	}
}
