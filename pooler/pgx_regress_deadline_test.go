package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgquic/pgquic/pooler"
)

// TestServerWriteDeadlineNotLeaked: when a client leaves, session.close
// writes the cleanup (ROLLBACK and/or the reset query) to the server
// connection under a 5-second write deadline and then returns the
// connection to the pool without clearing that deadline. The next session
// lent that connection can write to it for at most 5 seconds; after that
// every write fails with an i/o timeout that flushAll only logs (at debug)
// while the relay keeps waiting for a reply that never comes, so the client
// hangs with the server idle. Found by pgx's own suite through session mode:
// TestConnStress, TestListenNotifyWhileBusyIsSafe,
// TestConnQueryErrorWhileReturningRows, stdlib's TestSQLOpenFromPool hung
// until pgx's -timeout, and TestNumericBinaryEncodeLargeDigitCount got
// "unexpected EOF" (a message larger than the write buffer made the write
// fail inside handle, which ended the session without a word).
func TestServerWriteDeadlineNotLeaked(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode pooler.Mode
		// leave is what the first client does before it disconnects.
		leave string
	}{
		// Session mode always runs the reset query at the end.
		{"session", pooler.ModeSession, ""},
		// Transaction mode cleans up (ROLLBACK) only after a client left
		// inside a transaction.
		{"transaction", pooler.ModeTransaction, "begin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One server connection, so the second client gets the first's.
			h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{Mode: tc.mode}})
			ctx := testCtx(t, 2*time.Minute)

			a := h.connect(ctx, t)
			var pidA uint32
			if err := a.QueryRow(ctx, "select pg_backend_pid()").Scan(&pidA); err != nil {
				t.Fatal(err)
			}
			if tc.leave != "" {
				if _, err := a.Exec(ctx, tc.leave); err != nil {
					t.Fatal(err)
				}
			}
			_ = a.PgConn().Conn().Close() // leave without Terminate: the pooler cleans up
			h.waitSessions(t, 0)

			b := h.connect(ctx, t)
			// Outlive the 5 s the cleanup's write deadline allowed.
			time.Sleep(6 * time.Second)
			for i := range 3 {
				qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				var pidB uint32
				err := b.QueryRow(qctx, "select pg_backend_pid()").Scan(&pidB)
				cancel()
				if err != nil {
					t.Fatalf("query %d on the reused server connection: %v (the pooler's writes to the server time out)", i, err)
				}
				if pidB != pidA {
					t.Fatalf("pool of one gave a different server connection: %d then %d", pidA, pidB)
				}
			}
		})
	}
}
