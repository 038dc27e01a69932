package pooler_test

import (
	"context"
	"fmt"
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
func TestHugePipeline(t *testing.T) {
	for _, mode := range []pooler.Mode{pooler.ModeTransaction, pooler.ModeSession} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2, cfg: pooler.Config{Mode: mode}})
			ctx := testCtx(t, 2*time.Minute)
			pc := h.connect(ctx, t).PgConn()
			const n = 100_000
			batch := &pgconn.Batch{}
			for i := range n {
				batch.ExecParams("select $1::text, repeat('x', 100)", [][]byte{[]byte(fmt.Sprint(i))}, nil, nil, nil)
			}
			bctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			results, err := pc.ExecBatch(bctx, batch).ReadAll()
			if err != nil {
				t.Fatalf("huge batch: %v", err)
			}
			if len(results) != n {
				t.Fatalf("%d results, want %d", len(results), n)
			}
			for i, r := range results {
				if r.Err != nil || len(r.Rows) != 1 || string(r.Rows[0][0]) != fmt.Sprint(i) {
					t.Fatalf("result %d: %v %q", i, r.Err, r.Rows)
				}
			}
		})
	}
}
