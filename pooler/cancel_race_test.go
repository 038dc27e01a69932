package pooler_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
)

// cancelGate is a TCP relay in front of PostgreSQL that holds every
// CancelRequest until the test opens the gate, so a test can make the
// pooler's cancel arrive as late as it likes. Other connections pass
// straight through.
type cancelGate struct {
	ln     net.Listener
	target string
	held   chan struct{} // one value per CancelRequest being held
	open   chan struct{} // closed to let held requests through
	once   sync.Once
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func newCancelGate(t testing.TB, c *pgtest.Cluster) *cancelGate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &cancelGate{
		ln:     ln,
		target: net.JoinHostPort(c.Host, strconv.Itoa(c.Port)),
		held:   make(chan struct{}, 16),
		open:   make(chan struct{}),
	}
	g.wg.Go(g.accept)
	t.Cleanup(g.close)
	return g
}

// url is a connection string that reaches PostgreSQL through the gate.
func (g *cancelGate) url(c *pgtest.Cluster) string {
	return "postgres://" + c.SuperUser + ":" + c.SuperPassword + "@" + g.ln.Addr().String() + "/postgres?sslmode=disable"
}

func (g *cancelGate) release() { g.once.Do(func() { close(g.open) }) }

func (g *cancelGate) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		_ = c.Close()
		return false
	}
	g.conns = append(g.conns, c)
	return true
}

func (g *cancelGate) close() {
	g.release()
	_ = g.ln.Close()
	g.mu.Lock()
	g.closed = true
	for _, c := range g.conns {
		_ = c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
}

func (g *cancelGate) accept() {
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		if !g.track(c) {
			return
		}
		g.wg.Go(func() { g.relay(c) })
	}
}

func (g *cancelGate) relay(c net.Conn) {
	defer c.Close()
	var hdr [8]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	if binary.BigEndian.Uint32(hdr[4:8]) == 80877102 { // CancelRequest
		g.held <- struct{}{}
		<-g.open
	}
	s, err := net.Dial("tcp", g.target)
	if err != nil || !g.track(s) {
		return
	}
	defer s.Close()
	if _, err := s.Write(hdr[:]); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(c, s)
		_ = c.Close()
		close(done)
	}()
	_, _ = io.Copy(s, c)
	_ = s.Close()
	<-done
}

// gatedHarness is newHarness with the server pool reached through gate.
func gatedHarness(t testing.TB, c *pgtest.Cluster, gate *cancelGate, poolSize int) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := backend.NewManager(ctx, backend.ManagerConfig{
		Routes:   []backend.Route{{Database: "*", PoolConfig: backend.PoolConfig{ConnString: gate.url(c)}}},
		Defaults: backend.PoolConfig{PoolSize: poolSize, MinPool: poolSize},
	}, nil, nil)
	if err != nil {
		cancel()
		t.Fatalf("backend.NewManager: %v", err)
	}
	p, err := pooler.New(pooler.Config{}, mgr, nil, nil)
	if err != nil {
		cancel()
		t.Fatalf("pooler.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	h := &harness{t: t, cluster: c, mgr: mgr, pooler: p, ln: ln, cancel: cancel}
	h.wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			h.wg.Go(func() {
				_ = p.Serve(ctx, conn, pooler.Peer{Addr: conn.RemoteAddr(), Transport: "tcp"})
			})
		}
	})
	t.Cleanup(h.close)
	return h
}

// TestCancelNeverHitsTheNextBorrower is the regression test for the cancel
// race: client A's CancelRequest is forwarded while A's query runs, but
// reaches PostgreSQL only after that query has finished on its own (the gate
// holds it). The server connection (the pool has one) must not be lent to
// client B before the server has processed A's cancel; otherwise the cancel
// lands on B's query. Before the fix the pooler dropped the session lock
// between choosing the connection and dialing, and B's pg_sleep was
// cancelled (57014).
func TestCancelNeverHitsTheNextBorrower(t *testing.T) {
	c := sharedCluster(t)
	gate := newCancelGate(t, c)
	h := gatedHarness(t, c, gate, 1)
	ctx := testCtx(t, time.Minute)

	direct, err := pgx.Connect(ctx, c.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	count := func(sql string) int {
		t.Helper()
		var n int
		if err := direct.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	if _, err := direct.Exec(ctx, "SELECT pg_advisory_lock(4242)"); err != nil {
		t.Fatal(err)
	}

	a := h.connect(ctx, t).PgConn()
	b := h.connect(ctx, t).PgConn()

	// A waits for the lock the direct session holds: a query that ends
	// exactly when the test says so.
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Exec(ctx, "SELECT pg_advisory_xact_lock(4242)").ReadAll()
		aDone <- err
	}()
	waitState(t, "A waiting for the advisory lock", func() bool {
		return count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT pg_advisory_xact_lock%'`) == 1
	})

	cancelDone := make(chan error, 1)
	go func() { cancelDone <- a.CancelRequest(ctx) }()
	select {
	case <-gate.held:
	case <-ctx.Done():
		t.Fatal("the pooler did not forward A's CancelRequest")
	}

	// A's query now finishes by itself while its cancel is in flight.
	if _, err := direct.Exec(ctx, "SELECT pg_advisory_unlock(4242)"); err != nil {
		t.Fatal(err)
	}
	if err := <-aDone; err != nil {
		t.Fatalf("A's query: %v", err)
	}

	bDone := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, "SELECT pg_sleep(0.5)").ReadAll()
		bDone <- err
	}()
	// Before the fix B gets the connection at once and its query starts;
	// after it, B waits until the cancel is done. Look for the bad state for
	// a while, then let the cancel through.
	lent := false
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if count(`SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(0.5)' AND state = 'active'`) == 1 {
			lent = true
			break
		}
	}
	gate.release()
	if err := <-cancelDone; err != nil {
		t.Fatalf("A's CancelRequest: %v", err)
	}
	if err := <-bDone; err != nil {
		t.Fatalf("B's query (lent the connection while A's cancel was in flight: %v): %v", lent, err)
	}
	if lent {
		t.Fatal("the server connection was lent to B while A's cancel was still in flight")
	}
}

// TestCancelStressNoStrayCancels runs clients whose queries are cancelled by
// pgx when their context expires, about when the query finishes, next to
// clients that never cancel, on a pool of two: no client may ever see 57014
// for a query it did not cancel, and no connection may break.
func TestCancelStressNoStrayCancels(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2})
	ctx := testCtx(t, 2*time.Minute)
	run := 6 * time.Second
	if os.Getenv("PGQUIC_QUICK") == "1" {
		run = 2 * time.Second
	}
	const cancellers, innocents = 8, 8
	var cancelled, innocentDone atomic.Int64
	errs := make(chan error, cancellers+innocents)
	var wg sync.WaitGroup
	stop := time.Now().Add(run)
	for i := range cancellers + innocents {
		conn := h.connectWith(ctx, t, cancelHandler)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for time.Now().Before(stop) {
				if i < cancellers {
					qctx, cancel := context.WithTimeout(ctx, time.Duration(1+rng.IntN(12))*time.Millisecond)
					_, err := conn.Exec(qctx, "SELECT pg_sleep(0.005)")
					cancel()
					switch {
					case err == nil:
					case pgCode(err) == "57014":
						cancelled.Add(1)
					case errors.Is(err, context.DeadlineExceeded) && !conn.PgConn().IsClosed():
						// expired before the query was sent
					default:
						errs <- err
						return
					}
					continue
				}
				if _, err := conn.Exec(ctx, "SELECT pg_sleep(0.002)"); err != nil {
					errs <- err
					return
				}
				innocentDone.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("query failed: %v (SQLSTATE %q)", err, pgCode(err))
	}
	if cancelled.Load() == 0 {
		t.Fatal("no query was cancelled: the test did not exercise the race")
	}
	t.Logf("%d queries cancelled by their own clients, %d uncancelled queries of other clients succeeded", cancelled.Load(), innocentDone.Load())
}

// waitState polls cond until it holds, failing the test after 30 s.
func waitState(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
