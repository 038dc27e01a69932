package edge

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/internal/quictest/quicserver"
	"github.com/pgquic/pgquic/quicclient"
	"github.com/pgquic/pgquic/quicfront"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newTestDialer returns a client Dialer to s, closed at cleanup.
func newTestDialer(t testing.TB, cfg quicclient.DialerConfig) *quicclient.Dialer {
	t.Helper()
	d, err := quicclient.NewDialer(cfg, quictest.Logger(t))
	return quictest.Closing(t, d, err)
}

// startEdge runs an edge with cfg on a free loopback port until the test
// ends.
func startEdge(t *testing.T, cfg Config) (*Edge, *quictest.Running) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	e, err := New(cfg, quictest.Logger(t), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return e, quictest.Run(t, e)
}

// TestEdgePgconn: pgconn over TCP to the edge, on over QUIC to the server.
// sslmode=prefer makes pgconn send an SSLRequest first, which the edge answers 'N'.
func TestEdgePgconn(t *testing.T) {
	h := quictest.NewScriptedPG()
	s, reg := quicserver.Start(t, quicfront.ServerConfig{}, h)
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	e, _ := startEdge(t, Config{Dialer: d})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://u@%s/db?sslmode=prefer", e.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if got, err := quictest.QueryInt(ctx, c, i); err != nil || got != fmt.Sprint(i) {
			t.Fatalf("select %d: %q %v", i, got, err)
		}
	}
	// A CancelRequest from the local client travels on a fresh stream.
	quictest.CancelSleep(t, ctx, h, c)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	quictest.Eventually(t, 10*time.Second, "sessions closed on both sides", func() bool {
		return quictest.GaugeValue(t, reg, "pgquic_quic_streams") == 0 && d.Stats().Streams == 0
	})
}

// TestEdgeSSLRequestThenStartup does what libpq does: SSLRequest, 'N', then
// the StartupMessage on the same connection.
func TestEdgeSSLRequestThenStartup(t *testing.T) {
	s, _ := quicserver.Start(t, quicfront.ServerConfig{}, quictest.NewScriptedPG())
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	e, _ := startEdge(t, Config{Dialer: d})
	conn, err := net.Dial("tcp", e.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	for _, code := range []uint32{pgproto.GSSEncRequestCode, pgproto.SSLRequestCode} {
		req := make([]byte, 8)
		binary.BigEndian.PutUint32(req[0:4], 8)
		binary.BigEndian.PutUint32(req[4:8], code)
		if _, err := conn.Write(req); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(conn, b); err != nil || b[0] != 'N' {
			t.Fatalf("encryption request %d: %q %v", code, b, err)
		}
	}
	fe := pgproto3.NewFrontend(conn, conn)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: map[string]string{"user": "u", "database": "db"}})
	fe.Send(&pgproto3.Query{String: "select 11"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var got string
	rfq := 0
	for rfq < 2 {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			got = string(m.Values[0])
		case *pgproto3.ReadyForQuery:
			rfq++
		case *pgproto3.ErrorResponse:
			t.Fatal(m.Message)
		}
	}
	if got != "11" {
		t.Fatalf("got %q", got)
	}
	fe.Send(&pgproto3.Terminate{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	// Half-close: our FIN reaches the server, whose close comes back as EOF.
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(conn); err != nil || len(rest) != 0 {
		t.Fatalf("after Terminate: %q %v", rest, err)
	}
}

// TestEdgePsql runs the real libpq client through the edge.
func TestEdgePsql(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("psql is required under CI: %v", err)
		}
		t.Skip("psql not installed")
	}
	s, _ := quicserver.Start(t, quicfront.ServerConfig{}, quictest.NewScriptedPG())
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	e, _ := startEdge(t, Config{Dialer: d})
	host, port, _ := net.SplitHostPort(e.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, psql, "-X", "-Atc", "select 5",
		fmt.Sprintf("host=%s port=%s user=u dbname=db sslmode=prefer", host, port)).CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	if strings.TrimSpace(string(out)) != "5" {
		t.Fatalf("psql output %q", out)
	}
}

// TestEdgeUnreachablePooler: the local client gets a FATAL 08006 error.
func TestEdgeUnreachablePooler(t *testing.T) {
	// A UDP port with nothing behind it.
	u := quictest.MustUDP(t)
	addr := u.LocalAddr().String()
	_ = u.Close()
	d := newTestDialer(t, quicclient.DialerConfig{Addr: addr, Insecure: true})
	e, _ := startEdge(t, Config{Dialer: d, StartupTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://u@%s/db?sslmode=disable", e.Addr()))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgproto.CodeConnectionFailure {
		t.Fatalf("want 08006, got %v", err)
	}
}

// TestEdgeShutdownCutsAfterGrace: a session still open when the grace
// period ends is cut.
func TestEdgeShutdownCutsAfterGrace(t *testing.T) {
	s, _ := quicserver.Start(t, quicfront.ServerConfig{}, quictest.NewScriptedPG())
	d := newTestDialer(t, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	e, run := startEdge(t, Config{Dialer: d})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://u@%s/db?sslmode=disable", e.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	sctx, scancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer scancel()
	if err := e.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v", err)
	}
	if err := run.Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := quictest.QueryInt(ctx, c, 1); err == nil {
		t.Fatal("session survived edge shutdown")
	}
	if _, err := net.DialTimeout("tcp", e.Addr().String(), time.Second); err == nil {
		t.Fatal("edge still accepts")
	}
}

// TestEdgeCertNeedsLocalAuth: an edge whose Dialer presents a client
// certificate must authenticate its clients itself (a pooler trusting the
// certificate asks no password), and LocalStartup needs LocalAuth.
func TestEdgeCertNeedsLocalAuth(t *testing.T) {
	cert, err := quicfront.GenerateSelfSigned("edge")
	if err != nil {
		t.Fatal(err)
	}
	d := newTestDialer(t, quicclient.DialerConfig{Addr: "127.0.0.1:1", Insecure: true,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}})
	if d.CertFingerprint() != quicclient.Fingerprint(cert.Certificate[0]) {
		t.Fatalf("CertFingerprint = %q", d.CertFingerprint())
	}
	if _, err := New(Config{Listen: "127.0.0.1:0", Dialer: d}, nil, nil); err == nil || !strings.Contains(err.Error(), "LocalAuth is required") {
		t.Errorf("New with a certificate and no LocalAuth: %v", err)
	}
	plain := newTestDialer(t, quicclient.DialerConfig{Addr: "127.0.0.1:1", Insecure: true})
	if _, err := New(Config{Listen: "127.0.0.1:0", Dialer: plain, LocalStartup: true}, nil, nil); err == nil {
		t.Error("LocalStartup without LocalAuth accepted")
	}
}
