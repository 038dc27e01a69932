package quicfront

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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
	s1 := startServer(t, ServerConfig{TLSConfig: tc}, newScriptedPG())
	addr := s1.Addr().String()
	d := newTestDialer(t, DialerConfig{Addr: addr, PinSHA256: s1.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, pgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queryInt(ctx, c, 1); err != nil {
		t.Fatal(err)
	}
	_ = c.Close(ctx)

	s1.stop(t)
	eventually(t, 10*time.Second, "dialer to notice the closed connection", func() bool { return d.Stats().Conns == 0 })

	startServer(t, ServerConfig{Addr: addr, TLSConfig: tc}, newScriptedPG())
	c, err = pgconn.ConnectConfig(ctx, pgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if got, err := queryInt(ctx, c, 2); err != nil || got != "2" {
		t.Fatalf("after restart: %q %v", got, err)
	}
}

// TestServerCrashRedial: a server that vanished without closing its
// connections is detected through a stateless reset from its successor
// (same certificate, so same reset key), well before the idle timeout.
func TestServerCrashRedial(t *testing.T) {
	tc := fixedCertConfig(t)
	s1 := startServer(t, ServerConfig{TLSConfig: tc}, newScriptedPG())
	addr := s1.Addr().String()
	d := newTestDialer(t, DialerConfig{Addr: addr, PinSHA256: s1.Fingerprint(), IdleTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, pgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close(ctx)
	eventually(t, 10*time.Second, "session end", func() bool { return gaugeValue(t, s1.reg, "pgquic_quic_streams") == 0 })

	// Crash: drop the socket without CONNECTION_CLOSE.
	s1.mu.Lock()
	tr, udp := s1.tr, s1.udp
	s1.mu.Unlock()
	_ = tr.Close()
	_ = udp.Close()

	startServer(t, ServerConfig{Addr: addr, TLSConfig: tc}, newScriptedPG())
	start := time.Now()
	for {
		c, err = pgconn.ConnectConfig(ctx, pgConfig(t, d))
		if err == nil {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("no recovery after crash: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer c.Close(ctx)
	if got, err := queryInt(ctx, c, 5); err != nil || got != "5" {
		t.Fatalf("after crash: %q %v", got, err)
	}
}

// TestConnLossIsolated: closing one QUIC connection fails its sessions only.
func TestConnLossIsolated(t *testing.T) {
	s := startServer(t, ServerConfig{}, newScriptedPG())
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := pgconn.ConnectConfig(ctx, pgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	b, err := pgconn.ConnectConfig(ctx, pgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	d.mu.Lock()
	c0, c1 := d.slots[0], d.slots[1]
	d.mu.Unlock()
	if c0 == nil || c1 == nil || c0.open != 1 || c1.open != 1 {
		t.Fatal("sessions were not spread over two connections")
	}
	// a was dialed first, so it lives on slot 0.
	if a.Conn().LocalAddr().String() != c0.conn.LocalAddr().String() {
		t.Fatal("unexpected placement")
	}
	_ = c0.conn.CloseWithError(appCode(ErrCodeInternal), "test closes one connection")
	if _, err := queryInt(ctx, a, 1); err == nil {
		t.Fatal("session on the closed connection still works")
	}
	if got, err := queryInt(ctx, b, 2); err != nil || got != "2" {
		t.Fatalf("session on the other connection broke: %q %v", got, err)
	}
	c, err := pgconn.ConnectConfig(ctx, pgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if got, err := queryInt(ctx, c, 3); err != nil || got != "3" {
		t.Fatalf("new session: %q %v", got, err)
	}
	// pgconn sends a CancelRequest when it abandons the broken session; that
	// stream (or the next session) re-dials the lost connection.
	eventually(t, 10*time.Second, "two live connections again", func() bool { return d.Stats().Conns == 2 })
}

func TestPinVerification(t *testing.T) {
	s := startServer(t, ServerConfig{}, echoHandler{})
	fp := s.Fingerprint()
	var colons []string
	for i := 0; i < len(fp); i += 2 {
		colons = append(colons, strings.ToUpper(fp[i:i+2]))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	good := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: "SHA256:" + strings.Join(colons, ":")})
	c, err := good.Dial(ctx)
	if err != nil {
		t.Fatalf("right pin rejected: %v", err)
	}
	_ = c.Close()

	wrong := []byte(fp)
	if wrong[0] == '0' {
		wrong[0] = '1'
	} else {
		wrong[0] = '0'
	}
	bad := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: string(wrong)})
	if _, err := bad.Dial(ctx); err == nil {
		t.Fatal("wrong pin accepted")
	} else if !errors.Is(err, ErrPinMismatch) && !strings.Contains(err.Error(), "pinned") {
		t.Fatalf("wrong pin: unexpected error %v", err)
	}

	if _, err := NewDialer(DialerConfig{Addr: "127.0.0.1:1", PinSHA256: "abc"}, nil); err == nil {
		t.Fatal("malformed pin accepted")
	}
	if _, err := NewDialer(DialerConfig{Addr: "127.0.0.1:1"}, nil); err == nil {
		t.Fatal("no verification mode accepted")
	}
	if _, err := NewDialer(DialerConfig{Addr: "127.0.0.1:1", Insecure: true, PinSHA256: fp}, nil); err == nil {
		t.Fatal("two verification modes accepted")
	}
}

func TestCAFile(t *testing.T) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "pooler"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, ServerConfig{TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}}}}, echoHandler{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), CAFile: caFile})
	c, err := d.Dial(ctx)
	if err != nil {
		t.Fatalf("CA-signed server rejected: %v", err)
	}
	msg := startupBytes()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()

	// A server with another (self-signed) certificate fails CA verification.
	other := startServer(t, ServerConfig{}, echoHandler{})
	d2 := newTestDialer(t, DialerConfig{Addr: other.Addr().String(), CAFile: caFile})
	if _, err := d2.Dial(ctx); err == nil {
		t.Fatal("server outside the CA accepted")
	}
}

func TestMaxConnsRefused(t *testing.T) {
	s := startServer(t, ServerConfig{MaxConns: 1}, echoHandler{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d1 := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), Insecure: true, Conns: 1})
	c, err := d1.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d2 := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), Insecure: true, Conns: 1})
	c2, err := d2.Dial(ctx)
	if err == nil {
		// The stream may open before the refusal arrives; the session then fails.
		_, _ = c2.Write(startupBytes())
		_, err = c2.Read(make([]byte, 1))
		_ = c2.Close()
	}
	if code, ok := RemoteErrorCode(err); !ok || code != ErrCodeTooManyConns {
		t.Fatalf("want too_many_conns, got %v", err)
	}
	if got := gaugeValue(t, s.reg, "pgquic_quic_conns_refused_total"); got < 1 {
		t.Fatalf("conns_refused_total = %v", got)
	}
}

func TestStartupTimeout(t *testing.T) {
	s := startServer(t, ServerConfig{StreamStartupTimeout: 200 * time.Millisecond}, echoHandler{})
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), Insecure: true})
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
	if code, ok := RemoteErrorCode(err); !ok || code != ErrCodeStartupTimeout {
		t.Fatalf("want startup_timeout reset, got %v", err)
	}
	if got := gaugeValue(t, s.reg, "pgquic_quic_streams_refused_total"); got != 1 {
		t.Fatalf("streams_refused_total = %v", got)
	}
}

// TestShutdownDrains: running sessions finish, new streams are refused with
// server_shutdown, and the connection closes when its last session ends.
func TestShutdownDrains(t *testing.T) {
	s := startServer(t, ServerConfig{}, newScriptedPG())
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, pgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		done <- s.Shutdown(sctx)
	}()
	eventually(t, 10*time.Second, "draining", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.draining
	})
	// The running session still works.
	if got, err := queryInt(ctx, c, 9); err != nil || got != "9" {
		t.Fatalf("running session broke during drain: %q %v", got, err)
	}
	// A new session on the same connection is refused.
	nc, err := d.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = nc.Write(startupBytes())
	_, err = nc.Read(make([]byte, 1))
	if code, ok := RemoteErrorCode(err); !ok || code != ErrCodeServerShutdown {
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
	eventually(t, 10*time.Second, "dialer sees the closed connection", func() bool { return d.Stats().Conns == 0 })
}

// TestShutdownGraceExpires: a session that does not end is cut when the
// grace period passes.
func TestShutdownGraceExpires(t *testing.T) {
	s := startServer(t, ServerConfig{}, newScriptedPG())
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, pgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	sctx, scancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer scancel()
	if err := s.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want deadline exceeded", err)
	}
	if _, err := queryInt(ctx, c, 1); err == nil {
		t.Fatal("session survived a forced shutdown")
	}
}

// TestServeContextCancel stops the server hard through Serve's context.
func TestServeContextCancel(t *testing.T) {
	s, err := NewServer(ServerConfig{Addr: "127.0.0.1:0"}, newScriptedPG(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(sctx) }()
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, pgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	scancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return")
	}
	if _, err := queryInt(ctx, c, 1); err == nil {
		t.Fatal("session survived")
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []ServerConfig{
		{},
		{Addr: "127.0.0.1:0", MaxStreamsPerConn: 100},
		{Addr: "127.0.0.1:0", MaxConns: -1},
	} {
		if _, err := NewServer(cfg, echoHandler{}, nil, nil); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	s, err := NewServer(ServerConfig{Addr: "127.0.0.1:0"}, echoHandler{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.ALPN != DefaultALPN || c.MaxConns != 1000 || c.MaxStreamsPerConn != 1000 || c.StreamStartupTimeout != 10*time.Second ||
		c.IdleTimeout != 60*time.Second || c.KeepAlivePeriod != 15*time.Second || c.Allow0RTT {
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
	s := startServer(t, ServerConfig{Allow0RTT: true}, newScriptedPG())
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, pgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if got, err := queryInt(ctx, c, 4); err != nil || got != "4" {
		t.Fatalf("%q %v", got, err)
	}
}
