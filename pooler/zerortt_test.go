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
	mu        sync.Mutex
	confirmed chan struct{} // the next session's; confirm closes it
	gone      atomic.Bool
}

// confirm confirms the handshake of the sessions started so far.
func (f *earlyFront) confirm() {
	f.mu.Lock()
	close(f.confirmed)
	f.mu.Unlock()
}

// reset makes the sessions started from now on unconfirmed again.
func (f *earlyFront) reset() {
	f.mu.Lock()
	f.confirmed = make(chan struct{})
	f.mu.Unlock()
}

func (f *earlyFront) channel() chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.confirmed
}

func newEarlyFront(t *testing.T, p *pooler.Pooler) *earlyFront {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &earlyFront{ln: ln, confirmed: make(chan struct{})}
	var wg sync.WaitGroup
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			conns = append(conns, conn)
			f.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = p.Serve(context.Background(), conn, pooler.Peer{
					Addr: conn.RemoteAddr(), Transport: "quic", Secure: true,
					HandshakeConfirmed: f.channel(),
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
	t.Cleanup(func() {
		_ = ln.Close()
		f.mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		f.mu.Unlock()
		wg.Wait()
	})
	return f
}

func (f *earlyFront) url() string {
	return "postgres://postgres:postgres@" + f.ln.Addr().String() + "/postgres?sslmode=disable"
}

// zeroRTTHarness is a pooler with a metrics registry, its early front and
// a table t0rtt(v int) to write to through it.
func zeroRTTHarness(t *testing.T, ctx context.Context, policy pooler.ZeroRTTPolicy) (*harness, *earlyFront, *prometheus.Registry, *pgx.Conn) {
	t.Helper()
	reg := prometheus.NewRegistry()
	// One server connection: what a 0-RTT request leaves on it, the next
	// request finds.
	h := newHarness(t, harnessOpts{cfg: pooler.Config{Mode: pooler.ModeTransaction, ZeroRTT: policy}, cluster: sharedCluster(t), poolSize: 1, reg: reg})
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
	_, f, reg, direct := zeroRTTHarness(t, ctx, nil)
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
	f.confirm()
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
	h, f, reg, direct := zeroRTTHarness(t, ctx, readOnlyFor("postgres"))
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

// readOnlyFor is a ZeroRTTPolicy allowing read-only 0-RTT requests on
// one database.
type readOnlyFor string

func (db readOnlyFor) ZeroRTTReadOnly(database, _ string) bool { return database == string(db) }

// TestZeroRTTReadOnly: with zero_rtt read-only, a plain read in 0-RTT is
// answered before the handshake is confirmed, with ReadyForQuery 'I' and
// an error as the client's own; writes (INSERT, nextval) and what is not
// one plain statement (CREATE TABLE, SET) wait and then run exactly once;
// the one server connection is left idle, outside any transaction, and
// not read-only.
func TestZeroRTTReadOnly(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	h, f, reg, direct := zeroRTTHarness(t, ctx, readOnlyFor("postgres"))
	if _, err := direct.Exec(ctx, "DROP SEQUENCE IF EXISTS s0rtt; CREATE SEQUENCE s0rtt"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = direct.Exec(context.Background(), "DROP SEQUENCE IF EXISTS s0rtt; DROP TABLE IF EXISTS c0rtt")
	})
	conn, err := pgx.Connect(ctx, f.url())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { conn.Close(context.Background()) }()
	simple := pgx.QueryExecModeSimpleProtocol

	var v int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM t0rtt", simple).Scan(&v); err != nil || v != 0 {
		t.Fatalf("read-only query before the confirmation = %d, %v", v, err)
	}
	if st := conn.PgConn().TxStatus(); st != 'I' {
		t.Fatalf("ReadyForQuery after a 0-RTT read: %q, want 'I'", st)
	}
	if _, err := conn.Exec(ctx, "SELECT 1/0", simple); pgCode(err) != "22012" {
		t.Fatalf("an error in a 0-RTT read: %v, want 22012", err)
	}
	if st := conn.PgConn().TxStatus(); st != 'I' {
		t.Fatalf("ReadyForQuery after a 0-RTT error: %q, want 'I'", st)
	}
	if got := metricSum(t, reg, "pgquic_pooler_zero_rtt_requests_total"); got != 2 {
		t.Fatalf("zero_rtt_requests_total = %v after two accepted reads, want 2", got)
	}
	// The client has its answer at the request's ReadyForQuery; the
	// pooler's COMMIT follows it on the server connection.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var idleInTx int
		if err := direct.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'").Scan(&idleInTx); err != nil {
			t.Fatal(err)
		}
		if idleInTx == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("server connections idle in a transaction: %d", idleInTx)
		}
	}

	for _, w := range []struct {
		sql, check string
		want       int
	}{
		{"INSERT INTO t0rtt VALUES (1)", "SELECT count(*) FROM t0rtt", 1},
		{"SELECT nextval('s0rtt')", "SELECT last_value FROM s0rtt WHERE is_called", 1},
		{"CREATE TABLE c0rtt (x int)", "SELECT count(*) FROM pg_class WHERE relname = 'c0rtt'", 1},
		// Runs in a READ ONLY transaction, but notifies at commit: held.
		{"SELECT pg_notify('c0rtt', 'x'), count(*) FROM c0rtt", "SELECT count(*) FROM c0rtt", 0},
	} {
		before := metricSum(t, reg, "pgquic_pooler_zero_rtt_requests_total")
		done := make(chan error, 1)
		go func() {
			_, err := conn.Exec(ctx, w.sql, simple)
			done <- err
		}()
		waitMetric(t, reg, "pgquic_pooler_zero_rtt_requests_total", before+1)
		var n int
		if err := direct.QueryRow(ctx, w.check).Scan(&n); err == nil && n != 0 {
			t.Fatalf("%s: ran (%s = %d) before the confirmation", w.sql, w.check, n)
		}
		select {
		case err := <-done:
			t.Fatalf("%s returned before the confirmation: %v", w.sql, err)
		default:
		}
		// Confirm for this write only: a new channel for the next.
		f.confirm()
		if err := <-done; err != nil {
			t.Fatalf("%s after the confirmation: %v", w.sql, err)
		}
		if err := direct.QueryRow(ctx, w.check).Scan(&n); err != nil || n != w.want {
			t.Fatalf("%s: %s = %d (%v), want exactly %d", w.sql, w.check, n, err, w.want)
		}
		f.reset()
		conn.Close(ctx)
		if conn, err = pgx.Connect(ctx, f.url()); err != nil {
			t.Fatal(err)
		}
	}
	if err := conn.QueryRow(ctx, "SELECT v FROM t0rtt", simple).Scan(&v); err != nil || v != 1 {
		t.Fatalf("a read of the row in 0-RTT = %d, %v", v, err)
	}
	_ = h
}
