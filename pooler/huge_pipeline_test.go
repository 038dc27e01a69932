package pooler_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/pooler"
)

// TestHugePipeline sends one batch far larger than the socket buffers, with
// replies that fill the server's send buffer before the client has finished
// sending (pgx's TestConnExecBatchHuge does the same). The pooler must keep
// replies flowing while it writes to the server; it once deadlocked here
// because it held its session lock during the blocking write.
//
// What it catches is a stall, not slowness: the batch takes from seconds to
// minutes depending on the machine's load, so it fails when no byte has
// moved between the client and the pooler for stallAfter (a deadlock moves
// none), not after a fixed time.
func TestHugePipeline(t *testing.T) {
	const stallAfter = time.Minute
	for _, mode := range []pooler.Mode{pooler.ModeTransaction, pooler.ModeSession} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2, cfg: pooler.Config{Mode: mode}})
			ctx := testCtx(t, 10*time.Minute)
			var moved atomic.Int64
			pc := connectCounting(ctx, t, h.url(), &moved)
			const n = 100_000
			batch := &pgconn.Batch{}
			for i := range n {
				batch.ExecParams("select $1::text, repeat('x', 100)", [][]byte{[]byte(fmt.Sprint(i))}, nil, nil, nil)
			}
			bctx, cancel := context.WithCancelCause(ctx)
			watched := watchProgress(bctx, &moved, stallAfter, cancel)
			start := time.Now()
			results, err := pc.ExecBatch(bctx, batch).ReadAll()
			cancel(nil)
			<-watched
			if err != nil {
				t.Fatalf("huge batch after %s: %v (%v)", time.Since(start).Round(time.Second), err, context.Cause(bctx))
			}
			if len(results) != n {
				t.Fatalf("%d results, want %d", len(results), n)
			}
			for i, r := range results {
				if r.Err != nil || len(r.Rows) != 1 || string(r.Rows[0][0]) != fmt.Sprint(i) {
					t.Fatalf("result %d: %v %q", i, r.Err, r.Rows)
				}
			}
			t.Logf("%d pipelined queries in %s, %d bytes through the client's socket",
				n, time.Since(start).Round(time.Millisecond), moved.Load())
		})
	}
}

// connectCounting opens a pgconn connection to url whose socket adds every
// byte it reads or writes to moved.
func connectCounting(ctx context.Context, t *testing.T, url string, moved *atomic.Int64) *pgconn.PgConn {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, moved: moved}, nil
	}
	pc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect through pooler: %v", err)
	}
	t.Cleanup(func() { _ = pc.Close(context.Background()) })
	return pc
}

// countingConn counts the bytes moved through a net.Conn.
type countingConn struct {
	net.Conn
	moved *atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.moved.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.moved.Add(int64(n))
	return n, err
}

// watchProgress cancels ctx, with a cause that says so, when moved has not
// changed for stallAfter. The returned channel is closed once it has
// stopped watching, after ctx ends.
func watchProgress(ctx context.Context, moved *atomic.Int64, stallAfter time.Duration, cancel context.CancelCauseFunc) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		last, since := moved.Load(), time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if n := moved.Load(); n != last {
				last, since = n, time.Now()
			} else if time.Since(since) >= stallAfter {
				cancel(fmt.Errorf("stalled: no byte moved between the client and the pooler for %s (%d bytes before)", stallAfter, n))
				return
			}
		}
	}()
	return done
}
