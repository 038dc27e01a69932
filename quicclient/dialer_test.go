package quicclient

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
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/internal/quictest/quicserver"
	"github.com/pgquic/pgquic/internal/quicwire"
	"github.com/pgquic/pgquic/quicfront"
)

// TestConnLossIsolated: closing one QUIC connection fails its sessions only.
func TestConnLossIsolated(t *testing.T) {
	s, _ := quicserver.Start(t, quicfront.ServerConfig{}, quictest.NewScriptedPG())
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := quictest.Connect(t, ctx, d)
	b := quictest.Connect(t, ctx, d)
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
	_ = c0.conn.CloseWithError(quicwire.AppCode(ErrCodeInternal), "test closes one connection")
	if _, err := quictest.QueryInt(ctx, a, 1); err == nil {
		t.Fatal("session on the closed connection still works")
	}
	if got, err := quictest.QueryInt(ctx, b, 2); err != nil || got != "2" {
		t.Fatalf("session on the other connection broke: %q %v", got, err)
	}
	c := quictest.Connect(t, ctx, d)
	if got, err := quictest.QueryInt(ctx, c, 3); err != nil || got != "3" {
		t.Fatalf("new session: %q %v", got, err)
	}
	// pgconn sends a CancelRequest when it abandons the broken session; that
	// stream (or the next session) re-dials the lost connection.
	quictest.Eventually(t, 10*time.Second, "two live connections again", func() bool { return d.Stats().Conns == 2 })
}

func TestPinVerification(t *testing.T) {
	s, _ := quicserver.Start(t, quicfront.ServerConfig{}, quictest.Echo{})
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
	s, _ := quicserver.Start(t, quicfront.ServerConfig{TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}}}}, quictest.Echo{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), CAFile: caFile})
	c, err := d.Dial(ctx)
	if err != nil {
		t.Fatalf("CA-signed server rejected: %v", err)
	}
	msg := quictest.StartupBytes()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()

	// A server with another (self-signed) certificate fails CA verification.
	other, _ := quicserver.Start(t, quicfront.ServerConfig{}, quictest.Echo{})
	d2 := newTestDialer(t, DialerConfig{Addr: other.Addr().String(), CAFile: caFile})
	if _, err := d2.Dial(ctx); err == nil {
		t.Fatal("server outside the CA accepted")
	}
}

// TestPgxReadmeExample runs the README's pgx setup (simple protocol, since
// the scripted server speaks only that).
func TestPgxReadmeExample(t *testing.T) {
	s, _ := quicserver.Start(t, quicfront.ServerConfig{}, quictest.NewScriptedPG())
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The scripted server speaks only the simple protocol.
	const url = "postgres://u@quic/db?sslmode=disable&default_query_exec_mode=simple_protocol"

	t.Run("pgx", func(t *testing.T) {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DialFunc = d.DialFunc()
		cfg.LookupFunc = d.LookupFunc()
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, "select 42").Scan(&n); err != nil || n != 42 {
			t.Fatalf("got %d, %v", n, err)
		}
	})
	t.Run("pgxpool", func(t *testing.T) {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DialFunc = d.DialFunc()
		cfg.ConnConfig.LookupFunc = d.LookupFunc()
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var n int
		if err := pool.QueryRow(ctx, "select 43").Scan(&n); err != nil || n != 43 {
			t.Fatalf("got %d, %v", n, err)
		}
	})
	t.Run("database/sql", func(t *testing.T) {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DialFunc = d.DialFunc()
		cfg.LookupFunc = d.LookupFunc()
		db := stdlib.OpenDB(*cfg)
		defer db.Close()
		var n int
		if err := db.QueryRowContext(ctx, "select 44").Scan(&n); err != nil || n != 44 {
			t.Fatalf("got %d, %v", n, err)
		}
	})
}

func TestCancelRequestGoesThroughDialer(t *testing.T) {
	h := quictest.NewScriptedPG()
	s, _ := quicserver.Start(t, quicfront.ServerConfig{}, h)
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := quictest.Connect(t, ctx, d)
	quictest.CancelSleep(t, ctx, h, c)
	if h.Cancels.Load() != 1 {
		t.Fatalf("cancels = %d", h.Cancels.Load())
	}
	if got, err := quictest.QueryInt(ctx, c, 3); err != nil || got != "3" {
		t.Fatalf("session unusable after cancel: %q %v", got, err)
	}
}

// TestManyConcurrentStreams holds 1200 sessions open at once over two
// connections with a soft cap of 600 streams each.
func TestManyConcurrentStreams(t *testing.T) {
	const n, conns, perConn = 1200, 2, 600
	s, reg := quicserver.Start(t, quicfront.ServerConfig{}, quictest.Echo{})
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint(), Conns: conns, MaxStreamsPerConn: perConn})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	msg := quictest.StartupBytes()
	var opened, release sync.WaitGroup
	opened.Add(n)
	release.Add(1)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, err := d.Dial(ctx)
			if err != nil {
				opened.Done()
				errs <- err
				return
			}
			defer c.Close()
			if _, err := c.Write(msg); err != nil {
				opened.Done()
				errs <- err
				return
			}
			buf := make([]byte, len(msg))
			if _, err := io.ReadFull(c, buf); err != nil {
				opened.Done()
				errs <- err
				return
			}
			opened.Done()
			release.Wait()
		})
	}
	opened.Wait()
	st := d.Stats()
	serverStreams := quictest.GaugeValue(t, reg, "pgquic_quic_streams")
	release.Done()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st.Conns != conns || st.Streams != n {
		t.Fatalf("dialer stats %+v, want %d conns, %d streams", st, conns, n)
	}
	// Every stream wrote and read a startup packet: at least one packet each
	// way per connection, at most a few per stream.
	if st.PacketsSent < uint64(conns) || st.PacketsReceived < uint64(conns) || st.PacketsSent > uint64(10*n+100) {
		t.Fatalf("dialer stats %+v: packet counts out of range for %d streams", st, n)
	}
	d.mu.Lock()
	for _, cc := range d.slots {
		if cc != nil && cc.open > perConn {
			t.Errorf("a connection carried %d streams, cap %d", cc.open, perConn)
		}
	}
	d.mu.Unlock()
	if serverStreams != n {
		t.Fatalf("server streams gauge %v, want %d", serverStreams, n)
	}
	if got := quictest.GaugeValue(t, reg, "pgquic_quic_connections"); got != conns {
		t.Fatalf("server connections gauge %v, want %d", got, conns)
	}
	quictest.Eventually(t, 20*time.Second, "streams gauge back to 0", func() bool {
		return quictest.GaugeValue(t, reg, "pgquic_quic_streams") == 0
	})
}
