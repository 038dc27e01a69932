package quicfront

import (
	"context"
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

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/pgproto"
)

func startEdge(t *testing.T, d *Dialer) *Edge {
	t.Helper()
	e, err := NewEdge(EdgeConfig{Listen: "127.0.0.1:0", Dialer: d}, testLogger(t), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Listen(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Serve(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.Shutdown(ctx)
		<-done
	})
	return e
}

// TestEdgePgconn: pgconn over TCP to the edge, on over QUIC to the server.
// sslmode=prefer makes pgconn send an SSLRequest first, which the edge answers 'N'.
func TestEdgePgconn(t *testing.T) {
	h := newScriptedPG()
	s := startServer(t, ServerConfig{}, h)
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	e := startEdge(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://u@%s/db?sslmode=prefer", e.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if got, err := queryInt(ctx, c, i); err != nil || got != fmt.Sprint(i) {
			t.Fatalf("select %d: %q %v", i, got, err)
		}
	}
	// A CancelRequest from the local client travels on a fresh stream.
	go func() {
		select {
		case <-h.sleeping:
			_ = c.CancelRequest(ctx)
		case <-ctx.Done():
		}
	}()
	_, err = c.Exec(ctx, "select pg_sleep(60)").ReadAll()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("want query_canceled, got %v", err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "sessions closed on both sides", func() bool {
		return gaugeValue(t, s.reg, "pgquic_quic_streams") == 0 && d.Stats().Streams == 0
	})
}

// TestEdgeSSLRequestThenStartup does what libpq does: SSLRequest, 'N', then
// the StartupMessage on the same connection.
func TestEdgeSSLRequestThenStartup(t *testing.T) {
	s := startServer(t, ServerConfig{}, newScriptedPG())
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	e := startEdge(t, d)
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
	s := startServer(t, ServerConfig{}, newScriptedPG())
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	e := startEdge(t, d)
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
	u := mustUDP(t)
	addr := u.LocalAddr().String()
	_ = u.Close()
	d := newTestDialer(t, DialerConfig{Addr: addr, Insecure: true})
	e, err := NewEdge(EdgeConfig{Listen: "127.0.0.1:0", Dialer: d, StartupTimeout: time.Second}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Listen(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Serve(context.Background()) }()
	defer func() {
		_ = e.Shutdown(context.Background())
		<-done
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = pgconn.Connect(ctx, fmt.Sprintf("postgres://u@%s/db?sslmode=disable", e.Addr()))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "08006" {
		t.Fatalf("want 08006, got %v", err)
	}
}

// TestEdgeShutdownCutsAfterGrace: a session still open when the grace
// period ends is cut.
func TestEdgeShutdownCutsAfterGrace(t *testing.T) {
	s := startServer(t, ServerConfig{}, newScriptedPG())
	d := newTestDialer(t, DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint()})
	e, err := NewEdge(EdgeConfig{Listen: "127.0.0.1:0", Dialer: d}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Listen(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Serve(context.Background()) }()
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
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := queryInt(ctx, c, 1); err == nil {
		t.Fatal("session survived edge shutdown")
	}
	if _, err := net.DialTimeout("tcp", e.Addr().String(), time.Second); err == nil {
		t.Fatal("edge still accepts")
	}
}
