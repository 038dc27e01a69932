package pooler_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/pooler"
)

// earlyFront serves the harness's pooler on a loopback listener of its
// own, telling it that each session's data is replayable until the test
// closes confirmed, the way the QUIC front describes a 0-RTT connection;
// gone makes Probe report the client gone (its connection died before the
// handshake completed).
type earlyFront struct {
	ln        net.Listener
	confirmed chan struct{}
	gone      atomic.Bool
}

func newEarlyFront(t *testing.T, p *pooler.Pooler) *earlyFront {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &earlyFront{ln: ln, confirmed: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = p.Serve(context.Background(), conn, pooler.Peer{
					Addr: conn.RemoteAddr(), Transport: "quic", Secure: true,
					HandshakeConfirmed: f.confirmed,
					Probe: func() error {
						if f.gone.Load() {
							return errors.New("connection lost before the handshake completed")
						}
						return nil
					},
				})
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return f
}

func (f *earlyFront) url() string {
	return "postgres://postgres:postgres@" + f.ln.Addr().String() + "/postgres?sslmode=disable"
}

// zeroRTTHarness is a pooler with a metrics registry, its early front and
// a table t0rtt(v int) to write to through it.
func zeroRTTHarness(t *testing.T, ctx context.Context) (*harness, *earlyFront, *prometheus.Registry, *pgx.Conn) {
	t.Helper()
	reg := prometheus.NewRegistry()
	h := newHarness(t, harnessOpts{cfg: pooler.Config{Mode: pooler.ModeTransaction}, cluster: sharedCluster(t), poolSize: 2, reg: reg})
	direct, err := pgx.Connect(ctx, h.cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close(context.Background()) })
	if _, err := direct.Exec(ctx, "DROP TABLE IF EXISTS t0rtt; CREATE TABLE t0rtt (v int)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = direct.Exec(context.Background(), "DROP TABLE IF EXISTS t0rtt") })
	return h, newEarlyFront(t, h.pooler), reg, direct
}

func countRows(t *testing.T, ctx context.Context, direct *pgx.Conn) int {
	t.Helper()
	var n int
	if err := direct.QueryRow(ctx, "SELECT count(*) FROM t0rtt").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestZeroRTTDeferred: a session on replayable data starts (startup and
// authentication are answered at once), its write is held, counted as
// deferred, and runs exactly once when the handshake is confirmed.
func TestZeroRTTDeferred(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	_, f, reg, direct := zeroRTTHarness(t, ctx)
	conn, err := pgx.Connect(ctx, f.url()) // completes before the confirmation
	if err != nil {
		t.Fatalf("startup before the handshake's confirmation: %v", err)
	}
	defer conn.Close(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "INSERT INTO t0rtt VALUES (1)", pgx.QueryExecModeSimpleProtocol)
		done <- err
	}()
	waitMetric(t, reg, "pgquic_pooler_zero_rtt_requests_total", 1)
	if n := countRows(t, ctx, direct); n != 0 {
		t.Fatalf("%d rows before the handshake was confirmed, want 0", n)
	}
	select {
	case err := <-done:
		t.Fatalf("the INSERT returned before the confirmation: %v", err)
	default:
	}
	close(f.confirmed)
	if err := <-done; err != nil {
		t.Fatalf("INSERT after the confirmation: %v", err)
	}
	if n := countRows(t, ctx, direct); n != 1 {
		t.Fatalf("%d rows after the confirmation, want exactly 1", n)
	}
	// Once confirmed, the session runs as any other.
	var v int
	if err := conn.QueryRow(ctx, "SELECT v FROM t0rtt").Scan(&v); err != nil || v != 1 {
		t.Fatalf("SELECT after the confirmation = %d, %v", v, err)
	}
}

// TestZeroRTTNeverConfirmed: when the connection dies before its handshake
// is confirmed (a replayed flight: the replayer cannot finish the
// handshake), the held requests never run and the session ends, its
// server connection back in the pool.
func TestZeroRTTNeverConfirmed(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	h, f, reg, direct := zeroRTTHarness(t, ctx)
	conn, err := pgx.Connect(ctx, f.url())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, "INSERT INTO t0rtt VALUES (1); INSERT INTO t0rtt VALUES (2)", pgx.QueryExecModeSimpleProtocol)
		done <- err
	}()
	waitMetric(t, reg, "pgquic_pooler_zero_rtt_requests_total", 1)
	f.gone.Store(true)
	if err := <-done; err == nil {
		t.Fatal("the held request succeeded on a connection that was never confirmed")
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.pooler.Sessions() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("pooler still has %d sessions after the unconfirmed client was gone", h.pooler.Sessions())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := countRows(t, ctx, direct); n != 0 {
		t.Fatalf("%d rows written by a session never confirmed, want 0", n)
	}
}
