package lanes

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgtest"
)

var errTestLost = errors.New("test: connection lost")

// laneOfTwo borrows the one connection of a fresh pool and puts two
// riders' requests on it, a ahead of b, both written.
func laneOfTwo(t *testing.T, ctx context.Context, lim Limits) (*backend.Pool, *Pool, *Rider, *Rider) {
	t.Helper()
	pg := pgtest.New(t, pgtest.Options{})
	pool, err := backend.NewPool(ctx, backend.PoolConfig{ConnString: pg.SuperURL("postgres"), PoolSize: 1}, nil, backend.NewMetrics(nil))
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	t.Cleanup(pool.Close)
	lp := New(pool, errTestLost)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			conn.Destroy() // still lent: pool.Close would wait for it
		}
	})
	var slot *Lane
	a := lp.Lead(conn, new(Rider).Reset(1, true), "k", &slot)
	a.EndWrite()
	a.DoneWriting(lim)
	b := lp.Join(new(Rider).Reset(1, true), "k", lim)
	if b == nil {
		t.Fatal("the lane took no second rider")
	}
	b.EndWrite()
	b.DoneWriting(lim)
	a.TakeTurn()
	return pool, lp, a, b
}

// waitTotal waits until pool holds n connections.
func waitTotal(t *testing.T, pool *backend.Pool, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); pool.Stat().Total != n; {
		if time.Now().After(deadline) {
			t.Fatalf("pool holds %d connections after 10 s, want %d", pool.Stat().Total, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRetire: a retired lane's connection is never lent again, yet the
// requests already written behind the one that retired it are answered on
// it: the next rider gets its turn without error, no new rider joins, and
// the last rider's leaving destroys the connection. Leave with destroy,
// for contrast, fails the rider behind.
func TestRetire(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lim := Limits{Depth: 4, Fast: time.Second, Lat: &Latency{}}

	t.Run("Retire", func(t *testing.T) {
		pool, lp, a, b := laneOfTwo(t, ctx, lim)
		a.Retire()
		if rd := lp.Join(new(Rider).Reset(1, true), "k", lim); rd != nil {
			rd.EndWrite()
			t.Fatal("a retired lane took a new rider")
		}
		a.LeaveAt(time.Now(), false, lim)
		if _, err := b.AwaitTurn(); err != nil {
			t.Fatalf("the rider behind failed: %v", err)
		}
		if b.Detach() {
			t.Fatal("a retired lane's connection was detached for its last rider to keep")
		}
		if n := pool.Stat().Total; n != 1 {
			t.Fatalf("connection gone before the rider behind was answered (%d left)", n)
		}
		b.LeaveAt(time.Now(), false, lim)
		waitTotal(t, pool, 0)
	})

	t.Run("Destroy", func(t *testing.T) {
		pool, _, a, b := laneOfTwo(t, ctx, lim)
		a.LeaveAt(time.Now(), true, lim)
		if _, err := b.AwaitTurn(); !errors.Is(err, errTestLost) {
			t.Fatalf("the rider behind a destroyed connection got %v, want %v", err, errTestLost)
		}
		b.LeaveAt(time.Now(), false, lim)
		waitTotal(t, pool, 0)
	})
}
