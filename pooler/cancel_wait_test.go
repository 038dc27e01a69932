package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgquic/pgquic/pooler"
)

// TestCancelWhileWaitingForServer: a CancelRequest for a request that is
// still queued for a server connection ends the wait with 57014, as
// PgBouncer does, instead of being ignored.
func TestCancelWhileWaitingForServer(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{AcquireTimeout: 20 * time.Second}})
	ctx := testCtx(t, time.Minute)
	holder := h.connect(ctx, t)
	tx, err := holder.Begin(ctx) // holds the only server connection
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	waiter := h.connectWith(ctx, t, cancelHandler)
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	_, err = waiter.Exec(qctx, "select 42")
	elapsed := time.Since(start)
	cancel()
	if pgCode(err) != "57014" {
		t.Fatalf("queued request: got %v after %s, want 57014", err, elapsed)
	}
	if elapsed > 5*time.Second {
		t.Fatalf("cancel took %s", elapsed)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := waiter.QueryRow(ctx, "select $1::int", 7).Scan(&n); err != nil || n != 7 {
		t.Fatalf("after cancel: %d %v", n, err)
	}
}
