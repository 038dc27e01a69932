package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestFailedSetOfOneClientKeepsAnothersSettings: client A's SET that the
// server rejects (an unknown parameter, a name the server refuses, a bad
// value) must not reach client B on the same server connection (pool of
// one). B set enable_seqscan off earlier; each of its later statements must
// run with it off. The pooler recorded A's rejected name as set on the
// connection, so B's next parameter sync named it in a RESET, which the
// server refused, rolling back the whole sync: B's statement ran with the
// connection's values, not its own (PostgreSQL's tsearch test saw a Seq
// Scan for an EXPLAIN that expected an index).
func TestFailedSetOfOneClientKeepsAnothersSettings(t *testing.T) {
	ctx, a, b := sharingPair(t, "SET enable_seqscan = off")
	for _, bad := range []string{
		"SET no_such_variable TO 42",
		`SET custom."bad-guc" = 42`,
		`SET special."weird name" = 'foo'`,
		"SET seq_page_cost TO 'NaN'",
		"SET plpgsql.extra_foo_warnings = true",
		"RESET no_such_variable",
		"SET LOCAL no_such_variable TO 1",
		"SELECT 1; SET no_such_variable TO 42",
	} {
		// A loads plpgsql first, so the reserved prefix is refused.
		if _, err := a.PgConn().Exec(ctx, "DO $$BEGIN END$$").ReadAll(); err != nil {
			t.Fatal(err)
		}
		if _, err := a.PgConn().Exec(ctx, bad).ReadAll(); err == nil {
			t.Fatalf("A: %s: the server accepted it; the test needs a refusal", bad)
		}
		for _, proto := range []string{"simple", "extended"} {
			var got string
			if proto == "simple" {
				got = simpleOne(ctx, t, b.PgConn(), "SHOW enable_seqscan")
			} else {
				got = extendedOne(ctx, t, b.PgConn(), "SELECT current_setting('enable_seqscan')")
			}
			if got != "off" {
				t.Errorf("after A's %q, B (%s): enable_seqscan = %q, want off", bad, proto, got)
			}
			// A runs again in between, so B has to sync each time.
			if _, err := a.PgConn().Exec(ctx, bad).ReadAll(); err == nil {
				t.Fatalf("A: %s accepted the second time", bad)
			}
		}
	}
}

// TestSyncRefusedByOneProcessIsNotPipelined: a value one server process
// accepted another may refuse (temp_buffers, once that process used
// temporary tables). The pooler used to pipeline the set_config of such a
// value ahead of the client's statement; the server refused it, the sync
// rolled back, and the statement ran with the value an earlier client left.
// Then the pooler waited for the answer to such a sync, and the refusal
// reached the client as the server's error in place of its statement.
// Now the refusing connection is closed and the sync tried once more on
// another server process (a new one here, the pool having one), so B
// runs with its own value, as it would on a session of its own.
func TestSyncRefusedByOneProcessIsNotPipelined(t *testing.T) {
	ctx, a, b := sharingPair(t, "SET temp_buffers = '16MB'")
	pidB := simpleOne(ctx, t, b.PgConn(), "SELECT pg_backend_pid()")
	// A uses a temporary table in a transaction block (which keeps it
	// unpinned): the server process's local buffers now exist, at the
	// default size.
	if _, err := a.PgConn().Exec(ctx, "BEGIN; CREATE TEMP TABLE t_sync_refused (i int) ON COMMIT DROP; INSERT INTO t_sync_refused VALUES (1); COMMIT").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if pidA := simpleOne(ctx, t, a.PgConn(), "SELECT pg_backend_pid()"); pidA != pidB {
		t.Fatalf("A runs on server process %s, B ran on %s: the test needs them to share it", pidA, pidB)
	}
	for _, proto := range []string{"simple", "extended"} {
		var err error
		var got string
		if proto == "simple" {
			var rs []*pgconn.Result
			rs, err = b.PgConn().Exec(ctx, "SHOW temp_buffers").ReadAll()
			if err == nil {
				got = string(rs[0].Rows[0][0])
			}
		} else {
			res := b.PgConn().ExecParams(ctx, "SELECT current_setting('temp_buffers')", nil, nil, nil, nil).Read()
			err = res.Err
			if err == nil {
				got = string(res.Rows[0][0])
			}
		}
		if err != nil || got != "16MB" {
			t.Errorf("B (%s): temp_buffers = %q, %v; want 16MB, set on another server process", proto, got, err)
		}
		// A uses temporary tables again on whatever process it has.
		if _, err := a.PgConn().Exec(ctx, "BEGIN; CREATE TEMP TABLE t_sync_refused (i int) ON COMMIT DROP; INSERT INTO t_sync_refused VALUES (1); COMMIT").ReadAll(); err != nil {
			t.Fatal(err)
		}
		// A borrows the connection again, so B has to sync again.
		simpleOne(ctx, t, a.PgConn(), "SELECT 1")
	}
	// B's connection is in step with the server, and B's value did not
	// reach A.
	if b.PgConn().IsClosed() {
		t.Error("B's connection was closed")
	}
	if got := simpleOne(ctx, t, a.PgConn(), "SHOW temp_buffers"); got != "8MB" {
		t.Errorf("A: temp_buffers = %q, want the default 8MB", got)
	}
}

// sharingPair returns clients A and B of one pool with a single server
// connection, B having run set. B has an application_name of its own, so
// its first server connection needed a parameter sync, and with that its
// later syncs may be pipelined (the pooler pipelines them only once a
// server accepted the client's values).
func sharingPair(t *testing.T, set string) (context.Context, *pgx.Conn, *pgx.Conn) {
	t.Helper()
	ctx := testCtx(t, 2*time.Minute)
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	a := h.connect(ctx, t)
	b := h.connectWith(ctx, t, func(c *pgx.ConnConfig) { c.RuntimeParams["application_name"] = "params_failed_set_b" })
	if _, err := b.PgConn().Exec(ctx, set).ReadAll(); err != nil {
		t.Fatalf("B: %s: %v", set, err)
	}
	return ctx, a, b
}
