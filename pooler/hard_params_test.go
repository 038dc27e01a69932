package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// Startup parameters against session-level SETs of earlier clients.
//
// In transaction mode a server connection serves many clients one after the
// other. A client's startup parameters (options=-c name=value, or any run-time
// parameter in the startup packet) must be in force in each of its
// transactions, whatever an earlier client SET on that server connection.
// PostgreSQL 15 does not report search_path, work_mem or statement_timeout
// with ParameterStatus, so the pooler cannot learn of such a SET from the
// server's replies.

// simpleOne runs sql with the simple protocol and returns the first column
// of its first row.
func simpleOne(ctx context.Context, t testing.TB, pc *pgconn.PgConn, sql string) string {
	t.Helper()
	rs, err := pc.Exec(ctx, sql).ReadAll()
	if err != nil {
		t.Fatalf("simple %q: %v", sql, err)
	}
	if len(rs) == 0 || len(rs[len(rs)-1].Rows) == 0 {
		t.Fatalf("simple %q: no row", sql)
	}
	return string(rs[len(rs)-1].Rows[0][0])
}

// extendedOne runs sql with the extended protocol through the unnamed
// statement and returns the first column of its first row.
func extendedOne(ctx context.Context, t testing.TB, pc *pgconn.PgConn, sql string) string {
	t.Helper()
	res := pc.ExecParams(ctx, sql, nil, nil, nil, nil).Read()
	if res.Err != nil {
		t.Fatalf("extended %q: %v", sql, res.Err)
	}
	if len(res.Rows) == 0 {
		t.Fatalf("extended %q: no row", sql)
	}
	return string(res.Rows[0][0])
}

// preparedOne runs sql as pgx does by default: a named prepared statement
// from pgx's statement cache.
func preparedOne(ctx context.Context, t testing.TB, conn *pgx.Conn, sql string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatalf("prepared %q: %v", sql, err)
	}
	return v
}

// tenantSchemas creates two schemas, each with a table hard_marker holding
// the schema's own name, so a query shows which schema search_path resolves
// to. They are dropped when the test ends.
func tenantSchemas(ctx context.Context, t testing.TB, c *pgtest.Cluster, a, b string) {
	t.Helper()
	sql := ""
	for _, s := range []string{a, b} {
		sql += "DROP SCHEMA IF EXISTS " + s + " CASCADE; CREATE SCHEMA " + s + "; " +
			"CREATE TABLE " + s + ".hard_marker (v text); INSERT INTO " + s + ".hard_marker VALUES ('" + s + "');"
	}
	if err := c.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Exec(cctx, "DROP SCHEMA IF EXISTS "+a+" CASCADE; DROP SCHEMA IF EXISTS "+b+" CASCADE"); err != nil {
			t.Errorf("dropping test schemas: %v", err)
		}
	})
}

// withStartupOption returns a connectWith edit that sends name=value in the
// startup packet's options, as libpq's options=-c does.
func withStartupOption(name, value string) func(*pgx.ConnConfig) {
	return func(c *pgx.ConnConfig) {
		c.RuntimeParams["options"] = "-c" + name + "=" + value
	}
}

// TestStartupParamAfterEarlierClientSet: client A asks for a parameter at
// startup, changes it with a session-level SET (or set_config) and leaves;
// client B asks for the same startup value and gets the same server
// connection (pool of one). B must see its startup value, in the simple and
// the extended protocol. On PostgreSQL 15 the pooler trusted the value it had
// set itself and B saw A's.
func TestStartupParamAfterEarlierClientSet(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	const ta, tb = "hard_params_ta", "hard_params_tb"
	tenantSchemas(ctx, t, cluster, ta, tb)

	cases := []struct {
		name         string
		param        string
		startup      string // value in the startup packet of A and B
		change       string // what A runs
		show         string // what B runs to read the value
		want         string
		alsoResolves bool // also check that unqualified names resolve in the startup schema
	}{
		{"search_path SET", "search_path", ta, "SET search_path = " + tb, "SHOW search_path", ta, true},
		{"search_path set_config", "search_path", ta, "SELECT set_config('search_path', '" + tb + "', false)", "SHOW search_path", ta, true},
		{"work_mem SET", "work_mem", "3MB", "SET work_mem = '5MB'", "SHOW work_mem", "3MB", false},
		{"statement_timeout SET", "statement_timeout", "7min", "SET statement_timeout = '9min'", "SHOW statement_timeout", "7min", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A pool of its own per case, so one case's leak cannot
			// disturb the next.
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1})
			a := h.connectWith(ctx, t, withStartupOption(tc.param, tc.startup))
			if got := simpleOne(ctx, t, a.PgConn(), tc.show); got != tc.want {
				t.Fatalf("A before its SET: %s = %q, want %q", tc.param, got, tc.want)
			}
			if _, err := a.PgConn().Exec(ctx, tc.change).ReadAll(); err != nil {
				t.Fatalf("A: %s: %v", tc.change, err)
			}
			pidA := simpleOne(ctx, t, a.PgConn(), "SELECT pg_backend_pid()")
			if err := a.Close(ctx); err != nil {
				t.Fatal(err)
			}

			b := h.connectWith(ctx, t, withStartupOption(tc.param, tc.startup))
			if pidB := simpleOne(ctx, t, b.PgConn(), "SELECT pg_backend_pid()"); pidB != pidA {
				t.Fatalf("B runs on server process %s, A ran on %s: the test needs them to share it", pidB, pidA)
			}
			if got := simpleOne(ctx, t, b.PgConn(), tc.show); got != tc.want {
				t.Errorf("B, simple protocol: %s = %q, want its startup value %q", tc.param, got, tc.want)
			}
			if got := extendedOne(ctx, t, b.PgConn(), tc.show); got != tc.want {
				t.Errorf("B, extended protocol: %s = %q, want its startup value %q", tc.param, got, tc.want)
			}
			if got := preparedOne(ctx, t, b, tc.show); got != tc.want {
				t.Errorf("B, named prepared statement: %s = %q, want its startup value %q", tc.param, got, tc.want)
			}
			if tc.alsoResolves {
				if got := extendedOne(ctx, t, b.PgConn(), "SELECT v FROM hard_marker"); got != tc.want {
					t.Errorf("B: unqualified hard_marker resolved in schema %q, want %q", got, tc.want)
				}
			}
		})
	}
}

// TestStartupParamOwnSetKept: the other side of the same contract. A client's
// own session-level SET replaces its startup value for its own later
// statements and transactions while nobody else uses its server connection
// (pool of one, one client), as on a direct connection.
func TestStartupParamOwnSetKept(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	const ta, tb = "hard_params_own_a", "hard_params_own_b"
	tenantSchemas(ctx, t, h.cluster, ta, tb)

	a := h.connectWith(ctx, t, withStartupOption("search_path", ta))
	if _, err := a.PgConn().Exec(ctx, "SET search_path = "+tb).ReadAll(); err != nil {
		t.Fatal(err)
	}
	if got := simpleOne(ctx, t, a.PgConn(), "SHOW search_path"); got != tb {
		t.Errorf("A, simple protocol after its own SET: %q, want %q", got, tb)
	}
	if got := extendedOne(ctx, t, a.PgConn(), "SHOW search_path"); got != tb {
		t.Errorf("A, extended protocol after its own SET: %q, want %q", got, tb)
	}
	if got := preparedOne(ctx, t, a, "SELECT v FROM hard_marker"); got != tb {
		t.Errorf("A, named prepared statement after its own SET: resolved in %q, want %q", got, tb)
	}
	tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got string
	if err := tx.QueryRow(ctx, "SHOW search_path").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got != tb {
		t.Errorf("A, in a later transaction block: %q, want %q", got, tb)
	}
}

// TestParamSetByEarlierClientWithoutStartupValue: client C asks for no
// search_path and follows, on the same server connection, a client that
// changed search_path with a session-level SET. C must see the server's
// default. This is the same mechanism as TestStartupParamAfterEarlierClientSet
// (a parameter SET by an earlier client on a shared server connection), seen
// from a client that relies on the server default instead of a startup value.
func TestParamSetByEarlierClientWithoutStartupValue(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	const ta, tb = "hard_params_def_a", "hard_params_def_b"
	tenantSchemas(ctx, t, cluster, ta, tb)
	const serverDefault = `"$user", public`

	cases := []struct {
		name string
		edit func(*pgx.ConnConfig) // the earlier client's configuration
	}{
		{"earlier client had a startup search_path", withStartupOption("search_path", ta)},
		{"earlier client had none", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1})
			a := h.connectWith(ctx, t, tc.edit)
			if _, err := a.PgConn().Exec(ctx, "SET search_path = "+tb).ReadAll(); err != nil {
				t.Fatal(err)
			}
			pidA := simpleOne(ctx, t, a.PgConn(), "SELECT pg_backend_pid()")
			if err := a.Close(ctx); err != nil {
				t.Fatal(err)
			}

			c := h.connectWith(ctx, t, nil)
			if pidC := simpleOne(ctx, t, c.PgConn(), "SELECT pg_backend_pid()"); pidC != pidA {
				t.Fatalf("C runs on server process %s, A ran on %s: the test needs them to share it", pidC, pidA)
			}
			if got := simpleOne(ctx, t, c.PgConn(), "SHOW search_path"); got != serverDefault {
				t.Errorf("C, simple protocol: search_path = %q, want the server default %q", got, serverDefault)
			}
			if got := extendedOne(ctx, t, c.PgConn(), "SHOW search_path"); got != serverDefault {
				t.Errorf("C, extended protocol: search_path = %q, want the server default %q", got, serverDefault)
			}
		})
	}
}
