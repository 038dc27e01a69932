package pooler_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
)

// Run-time parameters as a client connected directly would see them: server
// defaults as they are now, RESET going back to the client's startup values,
// and a client's own session-level SETs following it from one server
// connection to the next in transaction mode, never reaching other clients.

// freshDatabase creates (again) a database of the shared cluster for one
// test, so ALTER DATABASE cannot disturb other tests, and drops it at the
// end.
func freshDatabase(ctx context.Context, t *testing.T, c *pgtest.Cluster, name string) {
	t.Helper()
	drop := "DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"
	if err := c.Exec(ctx, drop); err != nil {
		t.Fatal(err)
	}
	if err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Exec(cctx, drop); err != nil {
			t.Errorf("dropping %s: %v", name, err)
		}
	})
}

// inDatabase is a connectWith edit choosing the database.
func inDatabase(db string, more ...func(*pgx.ConnConfig)) func(*pgx.ConnConfig) {
	return func(c *pgx.ConnConfig) {
		c.Database = db
		for _, f := range more {
			f(c)
		}
	}
}

// TestServerDefaultsNotCachedPastTheirConnections: after ALTER DATABASE ...
// SET timezone and the replacement of every server connection of the
// database, a new client through the pooler is told, and runs with, the new
// default, as a client connecting directly is. The pooler used to keep the
// parameters of the first connection it ever opened for the life of the
// process.
func TestServerDefaultsNotCachedPastTheirConnections(t *testing.T) {
	cluster := sharedCluster(t)
	for _, mode := range []pooler.Mode{pooler.ModeTransaction, pooler.ModeSession} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := testCtx(t, 2*time.Minute)
			db := "fid_defaults_" + string(mode)
			freshDatabase(ctx, t, cluster, db)
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 2, cfg: pooler.Config{Mode: mode}})

			a := h.connectWith(ctx, t, inDatabase(db))
			before := simpleOne(ctx, t, a.PgConn(), "SHOW timezone")
			if before == "Asia/Tokyo" {
				t.Fatalf("the cluster's default time zone is already %q", before)
			}
			if err := a.Close(ctx); err != nil {
				t.Fatal(err)
			}
			h.waitNoneInUse(t)

			if err := cluster.Exec(ctx, "ALTER DATABASE "+db+" SET timezone = 'Asia/Tokyo'"); err != nil {
				t.Fatal(err)
			}
			if err := cluster.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '"+db+"'"); err != nil {
				t.Fatal(err)
			}
			dc := direct(ctx, t, cluster)
			// pg_terminate_backend only signals: wait until the processes
			// are gone, so their sockets are closed when the pool looks.
			waitState(t, "the terminated server processes to exit", func() bool {
				var n int
				if err := dc.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", db).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n == 0
			})
			if err := dc.Close(ctx); err != nil {
				t.Fatal(err)
			}

			// The pool notices its terminated connections within a round of
			// its background loop (or at the next Acquire); from then on
			// every new client must get the new default.
			deadline := time.Now().Add(30 * time.Second)
			var reported, shown string
			for {
				b := h.connectWith(ctx, t, inDatabase(db))
				reported = b.PgConn().ParameterStatus("TimeZone")
				shown = simpleOne(ctx, t, b.PgConn(), "SHOW timezone")
				_ = b.Close(ctx)
				if reported == "Asia/Tokyo" && shown == "Asia/Tokyo" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("30s after every server connection was replaced, a new client is told TimeZone %q and SHOW timezone gives %q; want Asia/Tokyo like a direct client", reported, shown)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// TestResetReturnsToStartupValue: RESET of a parameter the client gave in
// its startup packet, and RESET ALL, bring back the startup value, as on a
// direct connection, for a reported parameter (DateStyle, whose new value
// the client is also told) and an unreported one (work_mem), in both
// pooling modes and both query protocols. The expected values are checked
// against PostgreSQL itself first.
func TestResetReturnsToStartupValue(t *testing.T) {
	cluster := sharedCluster(t)
	startup := func(c *pgx.ConnConfig) {
		c.RuntimeParams["datestyle"] = "Postgres, MDY"
		c.RuntimeParams["options"] = "-c work_mem=3MB"
	}
	steps := []struct{ run, show, want string }{
		{"RESET datestyle", "SHOW datestyle", "Postgres, MDY"},
		{"SET datestyle = 'German'", "SHOW datestyle", "German, DMY"},
		{"RESET datestyle", "SHOW datestyle", "Postgres, MDY"},
		{"SET work_mem = '5MB'", "SHOW work_mem", "5MB"},
		{"RESET work_mem", "SHOW work_mem", "3MB"},
		{"SET datestyle = 'SQL'; SET work_mem = '6MB'", "SHOW work_mem", "6MB"},
		{"RESET ALL", "SHOW datestyle", "Postgres, MDY"},
		{"SELECT 1", "SHOW work_mem", "3MB"},
		{"SET work_mem = '9MB'", "SHOW work_mem", "9MB"},
		{"DISCARD ALL", "SHOW work_mem", "3MB"},
	}
	check := func(ctx context.Context, t *testing.T, conn *pgx.Conn, extended bool) {
		t.Helper()
		pc := conn.PgConn()
		for _, st := range steps {
			if extended && st.run != "SET datestyle = 'SQL'; SET work_mem = '6MB'" {
				if res := pc.ExecParams(ctx, st.run, nil, nil, nil, nil).Read(); res.Err != nil {
					t.Fatalf("%s: %v", st.run, res.Err)
				}
			} else if _, err := pc.Exec(ctx, st.run).ReadAll(); err != nil {
				t.Fatalf("%s: %v", st.run, err)
			}
			got := simpleOne(ctx, t, pc, st.show)
			if extended {
				got = extendedOne(ctx, t, pc, st.show)
			}
			if got != st.want {
				t.Errorf("after %q: %s = %q, want %q", st.run, st.show, got, st.want)
			}
		}
		if got := pc.ParameterStatus("DateStyle"); got != "Postgres, MDY" {
			t.Errorf("the last DateStyle the client was told is %q, want %q", got, "Postgres, MDY")
		}
	}

	t.Run("direct", func(t *testing.T) {
		ctx := testCtx(t, time.Minute)
		cfg, err := pgx.ParseConfig(cluster.SuperURL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		startup(cfg)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		check(ctx, t, conn, false)
	})
	for _, mode := range []pooler.Mode{pooler.ModeTransaction, pooler.ModeSession} {
		for _, extended := range []bool{false, true} {
			name := string(mode) + "/simple"
			if extended {
				name = string(mode) + "/extended"
			}
			t.Run(name, func(t *testing.T) {
				ctx := testCtx(t, time.Minute)
				h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 2, cfg: pooler.Config{Mode: mode}})
				check(ctx, t, h.connectWith(ctx, t, startup), extended)
			})
		}
	}
}

// onOtherServer runs f while the client's next transaction cannot land on
// server process pid: two other clients of a pool of two open a
// transaction each, and the one that did not get pid ends its own first, so
// the client's next transaction gets that connection.
func onOtherServer(ctx context.Context, t *testing.T, h *harness, pid string, f func()) {
	t.Helper()
	var holders [2]*pgx.Conn
	var pids [2]string
	for i := range holders {
		holders[i] = h.connect(ctx, t)
		if _, err := holders[i].Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		pids[i] = simpleOne(ctx, t, holders[i].PgConn(), "SELECT pg_backend_pid()")
	}
	free := 0
	if pids[0] == pid {
		free = 1
	}
	if pids[free] == pid {
		t.Fatalf("both holders run on server process %s", pid)
	}
	if _, err := holders[free].Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	f()
	for _, c := range holders {
		_ = c.Close(ctx)
	}
	h.waitNoneInUse(t)
}

// TestSessionSetFollowsClient: in transaction mode a client's session-level
// SET, set_config(..., false) and RESET outside a transaction block stay in
// force in its later transactions on other server connections, and no other
// client ever sees them. psycopg's pool tests SET
// default_transaction_read_only = on on one client and broke a hundred later
// tests through a pooler that let it leak.
func TestSessionSetFollowsClient(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 2})
	if err := cluster.Exec(ctx, "DROP TABLE IF EXISTS fid_follow; CREATE TABLE fid_follow (v int)"); err != nil {
		t.Fatal(err)
	}

	a := h.connect(ctx, t)
	pa := a.PgConn()
	for _, sql := range []string{
		"SET work_mem = '7MB'",
		"SELECT pg_catalog.set_config('statement_timeout', '42s', false)",
		"SET default_transaction_read_only = on",
		`SET search_path = "we'ird ""schema""", public`,
		"SET myapp.tenant = 't''1'",
		"SET TIME ZONE 'Asia/Tokyo'",
	} {
		if _, err := pa.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("A: %s: %v", sql, err)
		}
	}
	pidSet := simpleOne(ctx, t, pa, "SELECT pg_backend_pid()")
	h.waitNoneInUse(t) // transaction mode does not pin A after its SETs
	want := map[string]string{"work_mem": "7MB", "statement_timeout": "42s", "default_transaction_read_only": "on",
		"search_path": `"we'ird ""schema""", public`, "myapp.tenant": "t'1", "timezone": "Asia/Tokyo"}

	onOtherServer(ctx, t, h, pidSet, func() {
		if pid := simpleOne(ctx, t, pa, "SELECT pg_backend_pid()"); pid == pidSet {
			t.Fatalf("A's next transaction ran on %s again", pid)
		}
		for k, v := range want {
			if got := simpleOne(ctx, t, pa, "SHOW "+k); got != v {
				t.Errorf("A on another server connection, simple protocol: %s = %q, want its own %q", k, got, v)
			}
			if got := extendedOne(ctx, t, pa, "SHOW "+k); got != v {
				t.Errorf("A on another server connection, extended protocol: %s = %q, want its own %q", k, got, v)
			}
		}
		if _, err := a.Exec(ctx, "INSERT INTO fid_follow VALUES (1)"); pgCode(err) != "25006" {
			t.Errorf("A's INSERT with default_transaction_read_only on: %v, want SQLSTATE 25006", err)
		}
	})

	// Every other client, on either server connection, sees the defaults
	// and can write.
	for i := range 4 {
		b := h.connect(ctx, t)
		for k, v := range want {
			if got := simpleOne(ctx, t, b.PgConn(), "SHOW "+k); got == v {
				t.Errorf("client B%d sees A's %s = %q", i, k, got)
			}
		}
		if _, err := b.Exec(ctx, "INSERT INTO fid_follow VALUES (2)"); err != nil {
			t.Errorf("client B%d cannot write after A's SET default_transaction_read_only: %v", i, err)
		}
		_ = b.Close(ctx)
	}

	// A's RESET follows it too.
	if _, err := pa.Exec(ctx, "RESET work_mem; RESET default_transaction_read_only").ReadAll(); err != nil {
		t.Fatal(err)
	}
	pidReset := simpleOne(ctx, t, pa, "SELECT pg_backend_pid()")
	onOtherServer(ctx, t, h, pidReset, func() {
		if got := simpleOne(ctx, t, pa, "SHOW work_mem"); got != "4MB" {
			t.Errorf("A after RESET work_mem, on another server connection: %q, want the default 4MB", got)
		}
		if got := simpleOne(ctx, t, pa, "SHOW statement_timeout"); got != "42s" {
			t.Errorf("A's statement_timeout on another server connection after unrelated RESETs: %q, want 42s", got)
		}
		if _, err := a.Exec(ctx, "INSERT INTO fid_follow VALUES (3)"); err != nil {
			t.Errorf("A after RESET default_transaction_read_only: %v", err)
		}
	})
}

// TestSessionSetFollowsClientAroundCopy: the pooler's query that reads a
// client's parameters back must never land behind a COPY FROM STDIN, where
// the server waits for copy data and would fail the COPY; it waits for the
// client's next message instead. Here the SET is inside a transaction block
// (so its reading is due again at each message until the block ends) and
// the block runs a COPY, and then a Query that holds both a SET and a COPY.
func TestSessionSetFollowsClientAroundCopy(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 2})
	if err := cluster.Exec(ctx, "DROP TABLE IF EXISTS fid_copy; CREATE TABLE fid_copy (v int)"); err != nil {
		t.Fatal(err)
	}
	a := h.connect(ctx, t)
	pa := a.PgConn()
	for _, sql := range []string{"BEGIN", "SET work_mem = '2MB'"} {
		if _, err := pa.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if _, err := pa.CopyFrom(ctx, strings.NewReader("1\n2\n"), "COPY fid_copy FROM STDIN"); err != nil {
		t.Fatalf("COPY inside the block after a SET: %v", err)
	}
	if _, err := pa.Exec(ctx, "COMMIT").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := pa.CopyFrom(ctx, strings.NewReader("3\n"), "SET statement_timeout = '43s'; COPY fid_copy FROM STDIN"); err != nil {
		t.Fatalf("SET and COPY in one Query: %v", err)
	}
	// A DO block makes the pinning code probe the server after the
	// client's message: not behind a COPY either.
	if _, err := pa.CopyFrom(ctx, strings.NewReader("4\n"), "DO $$BEGIN END$$; COPY fid_copy FROM STDIN"); err != nil {
		t.Fatalf("DO and COPY in one Query: %v", err)
	}
	if got := simpleOne(ctx, t, pa, "SELECT count(*) FROM fid_copy"); got != "4" {
		t.Errorf("%s rows copied, want 4", got)
	}
	pid := simpleOne(ctx, t, pa, "SELECT pg_backend_pid()")
	onOtherServer(ctx, t, h, pid, func() {
		if got := simpleOne(ctx, t, pa, "SHOW work_mem"); got != "2MB" {
			t.Errorf("A's work_mem, SET in a block that ran a COPY, on another server connection: %q, want 2MB", got)
		}
	})
}
