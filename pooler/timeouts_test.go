package pooler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/pooler"
)

// pollUntil calls cond every 20 ms until it holds, failing the test after
// the deadline.
func pollUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIdleTransactionTimeout: a client that leaves a transaction open and
// goes quiet is ended with FATAL 25P03, as PostgreSQL's
// idle_in_transaction_session_timeout does; its transaction is rolled back
// and the server connection goes back to the pool clean, for the next
// client of a pool of one.
func TestIdleTransactionTimeout(t *testing.T) {
	c := sharedCluster(t)
	h := newHarness(t, harnessOpts{cluster: c, poolSize: 1, cfg: pooler.Config{
		Mode: pooler.ModeTransaction, IdleTransactionTimeout: 300 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := direct(ctx, t, c)
	if _, err := d.Exec(ctx, "CREATE TABLE IF NOT EXISTS idle_tx (v int)"); err != nil {
		t.Fatal(err)
	}

	conn := h.connect(ctx, t)
	var pid int32
	if _, err := conn.Exec(ctx, "BEGIN; INSERT INTO idle_tx VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	// The pooler rolls back once the timeout ends the session: the
	// server process leaves "idle in transaction".
	pollUntil(t, 10*time.Second, "the server connection to leave its transaction", func() bool {
		var state string
		err := d.QueryRow(ctx, "SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state)
		return err == nil && state == "idle"
	})
	_, err := conn.Exec(ctx, "SELECT 1")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "25P03" || pe.Severity != "FATAL" {
		t.Fatalf("after the timeout: %v, want FATAL 25P03", err)
	}
	var n int
	if err := d.QueryRow(ctx, "SELECT count(*) FROM idle_tx").Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows left by the timed-out transaction: %d (%v), want 0", n, err)
	}
	// The pool's only connection serves the next client.
	next := h.connect(ctx, t)
	if _, err := next.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	// A client busy inside a transaction (waiting for the server, not
	// idle) is not ended, however long its statement takes.
	if _, err := next.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := next.Exec(ctx, "SELECT pg_sleep(0.8)"); err != nil {
		t.Fatalf("a statement longer than the idle timeout: %v", err)
	}
	if _, err := next.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
}

// TestClientIdleTimeout: a client idle outside a transaction is ended with
// FATAL 57P05, as PostgreSQL's idle_session_timeout does, while one that
// keeps working is not.
func TestClientIdleTimeout(t *testing.T) {
	c := sharedCluster(t)
	h := newHarness(t, harnessOpts{cluster: c, poolSize: 2, cfg: pooler.Config{
		Mode: pooler.ModeTransaction, ClientIdleTimeout: 400 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	busy := h.connect(ctx, t)
	idle := h.connect(ctx, t)
	if _, err := idle.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	// busy sends a query every 100 ms until the idle one is gone.
	pollUntil(t, 10*time.Second, "the idle session to end", func() bool {
		if _, err := busy.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("a working client was ended: %v", err)
		}
		time.Sleep(80 * time.Millisecond)
		return h.pooler.Sessions() == 1
	})
	_, err := idle.Exec(ctx, "SELECT 1")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57P05" {
		t.Fatalf("idle client after the timeout: %v, want FATAL 57P05", err)
	}
	if _, err := busy.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("working client: %v", err)
	}
}

// TestQueryTimeout: a request the server does not answer within
// query_timeout is cancelled with the server's 57014, and the session and
// its server connection go on working.
func TestQueryTimeout(t *testing.T) {
	c := sharedCluster(t)
	for _, mode := range []pooler.Mode{pooler.ModeTransaction, pooler.ModeSession} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: c, poolSize: 1, cfg: pooler.Config{
				Mode: mode, QueryTimeout: 300 * time.Millisecond}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			conn := h.connect(ctx, t)
			start := time.Now()
			_, err := conn.Exec(ctx, "SELECT pg_sleep(30)")
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "57014" {
				t.Fatalf("pg_sleep(30) with a 300 ms query_timeout: %v, want 57014", err)
			}
			if el := time.Since(start); el > 10*time.Second {
				t.Fatalf("cancelled only after %v", el)
			}
			// Extended protocol too, and the session still works after.
			if _, err := conn.Exec(ctx, "SELECT pg_sleep($1)", 30); !errors.As(err, &pe) || pe.Code != "57014" {
				t.Fatalf("extended pg_sleep: %v, want 57014", err)
			}
			var n int
			if err := conn.QueryRow(ctx, "SELECT 41 + 1").Scan(&n); err != nil || n != 42 {
				t.Fatalf("after the timeouts: %d, %v", n, err)
			}
			// Requests shorter than the timeout are left alone, many in a row.
			for range 20 {
				if _, err := conn.Exec(ctx, "SELECT pg_sleep(0.01)"); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
