package pooler_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgquic/pgquic/pooler"
)

// TestSessionMode checks that session state lasts for the whole client
// session, and that the next session on the same server connection starts
// clean (the reset query ran).
func TestSessionMode(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{Mode: pooler.ModeSession}})
	ctx := testCtx(t, time.Minute)

	a, err := pgx.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	var pidA int32
	if err := a.QueryRow(ctx, "select pg_backend_pid()").Scan(&pidA); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"set work_mem = '7MB'",
		"prepare sq (int) as select $1 + 100",
		"create temp table sess_tmp (x int)",
		"insert into sess_tmp values (1), (2)",
	} {
		if _, err := a.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for i := range 5 {
		tx, err := a.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var wm string
		var n, sum, pid int32
		if err := tx.QueryRow(ctx, "show work_mem").Scan(&wm); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, "execute sq(1)").Scan(&n); err != nil {
			t.Fatalf("tx %d: execute: %v", i, err)
		}
		if err := tx.QueryRow(ctx, "select sum(x)::int, pg_backend_pid() from sess_tmp").Scan(&sum, &pid); err != nil {
			t.Fatalf("tx %d: temp table: %v", i, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if wm != "7MB" || n != 101 || sum != 3 || pid != pidA {
			t.Fatalf("tx %d: work_mem %s, execute %d, sum %d, pid %d (session pid %d)", i, wm, n, sum, pid, pidA)
		}
	}
	// Protocol-level prepared statements go straight to the server too.
	if _, err := a.PgConn().Prepare(ctx, "proto_s", "select $1::int * 3", nil); err != nil {
		t.Fatal(err)
	}
	res := a.PgConn().ExecPrepared(ctx, "proto_s", [][]byte{[]byte("5")}, nil, nil).Read()
	if res.Err != nil || string(res.Rows[0][0]) != "15" {
		t.Fatalf("proto_s: %q %v", res.Rows, res.Err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}

	b := h.connect(ctx, t)
	var pidB int32
	var wm string
	var prepared, temp int
	var tmpReg *string
	if err := b.QueryRow(ctx, "select pg_backend_pid(), current_setting('work_mem'), (select count(*) from pg_prepared_statements)::int, to_regclass('pg_temp.sess_tmp')::text").Scan(&pidB, &wm, &prepared, &tmpReg); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, "select count(*)::int from pg_class where relname = 'sess_tmp'").Scan(&temp); err != nil {
		t.Fatal(err)
	}
	if pidB != pidA {
		t.Fatalf("pool of one gave a different server connection: %d then %d", pidA, pidB)
	}
	// pgx's own statement for the query above is the only one allowed.
	if wm == "7MB" || prepared > 1 || tmpReg != nil || temp != 0 {
		t.Fatalf("dirty session state after reset: work_mem %s, %d prepared statements, temp table %v (%d in pg_class)", wm, prepared, tmpReg, temp)
	}
	if _, err := b.Exec(ctx, "execute sq(1)"); pgCode(err) != "26000" {
		t.Fatalf("prepared statement of the previous session: got %v, want 26000", err)
	}
}

// TestSessionModeClientKilled closes a session-mode client inside a
// transaction; the next session starts clean on the same server connection.
func TestSessionModeClientKilled(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{Mode: pooler.ModeSession}})
	ctx := testCtx(t, time.Minute)
	a := h.connect(ctx, t)
	for _, sql := range []string{"set application_name = 'dirty'", "create temp table k_tmp (x int)", "begin", "insert into k_tmp values (1)"} {
		if _, err := a.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	_ = a.PgConn().Conn().Close()
	b := h.connect(ctx, t)
	var app string
	var tmp *string
	if err := b.QueryRow(ctx, "select current_setting('application_name'), to_regclass('pg_temp.k_tmp')::text").Scan(&app, &tmp); err != nil {
		t.Fatal(err)
	}
	if app == "dirty" || tmp != nil {
		t.Fatalf("dirty state: application_name %q, temp table %v", app, tmp)
	}
	h.waitSessions(t, 1)
}

// TestSessionModeDirtyExitDropsServer: a session-mode client that leaves
// inside a transaction (here a failed one, as pgxpool's Release does) loses
// its server connection, so the next client gets a fresh server process;
// pgx's own TestConnReleaseClosesConnInFailedTransaction relies on that.
func TestSessionModeDirtyExitDropsServer(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{Mode: pooler.ModeSession}})
	ctx := testCtx(t, time.Minute)
	a, err := pgx.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	pid := a.PgConn().PID()
	if _, err := a.Exec(ctx, "begin"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, "selct"); err == nil {
		t.Fatal("syntax error not reported")
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	h.waitSessions(t, 0)
	b := h.connect(ctx, t)
	if b.PgConn().PID() == pid {
		t.Fatalf("the next client got the same server process %d", pid)
	}
	var n int
	if err := b.QueryRow(ctx, "select 1").Scan(&n); err != nil || n != 1 {
		t.Fatalf("next client: %d %v", n, err)
	}
}
