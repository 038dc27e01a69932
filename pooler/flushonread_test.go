package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgquic/pgquic/pooler"
)

// TestRequestToADeadServerFails covers the read that flushes its own
// request (backend.Conn.FlushOnRead): it waits for the socket to become
// readable without first trying it, so bytes that came before it began
// raise no wake-up of their own. A server connection a client holds (an
// open transaction, or session mode) is not looked at before the client's
// next request, so when its server process has been terminated meanwhile,
// the FATAL error and the end of the stream are already there when that
// request is written. The client must hear of it at once, in both
// protocols, and not wait for a reply that will never come. The request
// before it takes over flushOnReadAfter, so in an open transaction the
// pooler does leave the flush to the read; in session mode the replies
// are read by the relay goroutine, which flushes first, and the client
// must hear of it just the same.
func TestRequestToADeadServerFails(t *testing.T) {
	c := sharedCluster(t)
	for _, mode := range []struct {
		name string
		cfg  pooler.Config
		tx   bool
	}{
		{"transaction mode, open transaction", pooler.Config{}, true},
		{"session mode", pooler.Config{Mode: pooler.ModeSession}, false},
	} {
		for _, qm := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
			t.Run(mode.name+"/"+qm.String(), func(t *testing.T) {
				ctx := testCtx(t, time.Minute)
				h := newHarness(t, harnessOpts{cluster: c, poolSize: 1, cfg: mode.cfg})
				conn := h.connect(ctx, t)
				if mode.tx {
					if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
						t.Fatal(err)
					}
				}
				var pid int32
				if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", qm).Scan(&pid); err != nil {
					t.Fatal(err)
				}
				// A request that takes over a millisecond: the next
				// one's flush is left to the read of its reply.
				if _, err := conn.Exec(ctx, "SELECT pg_sleep(0.005)", qm); err != nil {
					t.Fatal(err)
				}
				d := direct(ctx, t, c)
				if _, err := d.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
					t.Fatal(err)
				}
				waitGone(ctx, t, d, pid)

				qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				var n int
				err := conn.QueryRow(qctx, "SELECT 2", qm).Scan(&n)
				if qctx.Err() != nil {
					t.Fatalf("the request to a terminated server got no answer in 5 s (err %v)", err)
				}
				if code := pgCode(err); code != "57P01" && code != "08006" {
					t.Fatalf("the request to a terminated server: %v, want 57P01 or 08006", err)
				}
				// The pool replaces the connection for the next client.
				other := h.connect(ctx, t)
				if err := other.QueryRow(ctx, "SELECT 3", qm).Scan(&n); err != nil || n != 3 {
					t.Fatalf("a new client after the terminated server: %d, %v", n, err)
				}
			})
		}
	}
}
