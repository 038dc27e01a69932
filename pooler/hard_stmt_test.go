package pooler_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/pooler"
)

// The pooler's per-connection statement cache must follow what the server
// really holds. Something other than the pooler's own Parse and Close can
// change that: a client's DEALLOCATE or DISCARD sent through the extended
// protocol, SQL naming a pooler statement directly, or an injected Close the
// server skipped because an earlier message of the pipeline failed.

// hardStmtText is the statement later clients prepare in these tests; with
// the parameter 1 it returns 4001.
const hardStmtText = "SELECT $1::int + 4000 AS hard_stmt"

// runNamed prepares text under name on pc and executes it with the parameter
// 1, checking the result. It returns the first error.
func runNamed(ctx context.Context, pc *pgconn.PgConn, name, text string) error {
	if _, err := pc.Prepare(ctx, name, text, nil); err != nil {
		return fmt.Errorf("prepare %q: %w", name, err)
	}
	return execNamed(ctx, pc, name)
}

// execNamed executes the already prepared hardStmtText under name.
func execNamed(ctx context.Context, pc *pgconn.PgConn, name string) error {
	res := pc.ExecPrepared(ctx, name, [][]byte{[]byte("1")}, nil, nil).Read()
	if res.Err != nil {
		return fmt.Errorf("execute %q: %w", name, res.Err)
	}
	if len(res.Rows) != 1 || string(res.Rows[0][0]) != "4001" {
		return fmt.Errorf("execute %q: got %q, want 4001", name, res.Rows)
	}
	return nil
}

// serverStmtName asks the server which name the pooler gave text on the
// connection pc's next transaction runs on.
func serverStmtName(ctx context.Context, t testing.TB, pc *pgconn.PgConn, text string) string {
	t.Helper()
	name := simpleOne(ctx, t, pc, "SELECT name FROM pg_prepared_statements WHERE statement = '"+strings.ReplaceAll(text, "'", "''")+"'")
	if !strings.HasPrefix(name, "pgq_") {
		t.Fatalf("server name of %q: %q, want a pgq_ name", text, name)
	}
	return name
}

// TestStatementCacheAfterServerDropsStatements: one client makes the server
// drop the statements the pooler placed there; later clients (and the same
// client) preparing the same text on that server connection must not see an
// error caused by it. Pool of one, so everyone shares the connection.
func TestStatementCacheAfterServerDropsStatements(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	cases := []struct {
		name string
		drop func(t *testing.T, conn *pgx.Conn)
	}{
		{"DEALLOCATE ALL through the extended protocol", func(t *testing.T, conn *pgx.Conn) {
			if res := conn.PgConn().ExecParams(ctx, "DEALLOCATE ALL", nil, nil, nil, nil).Read(); res.Err != nil {
				t.Fatal(res.Err)
			}
		}},
		{"DEALLOCATE ALL as a pgx cached statement", func(t *testing.T, conn *pgx.Conn) {
			// Query, unlike Exec without arguments, keeps pgx's default
			// mode: a named statement from its cache.
			rows, err := conn.Query(ctx, "DEALLOCATE ALL")
			if err != nil {
				t.Fatal(err)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{"DISCARD ALL through the extended protocol", func(t *testing.T, conn *pgx.Conn) {
			if res := conn.PgConn().ExecParams(ctx, "DISCARD ALL", nil, nil, nil, nil).Read(); res.Err != nil {
				t.Fatal(res.Err)
			}
		}},
		{"DEALLOCATE ALL through the simple protocol", func(t *testing.T, conn *pgx.Conn) {
			if _, err := conn.PgConn().Exec(ctx, "DEALLOCATE ALL").ReadAll(); err != nil {
				t.Fatal(err)
			}
		}},
		{"DEALLOCATE of the pooler's name through the simple protocol", func(t *testing.T, conn *pgx.Conn) {
			name := serverStmtName(ctx, t, conn.PgConn(), hardStmtText)
			if _, err := conn.PgConn().Exec(ctx, `DEALLOCATE "`+name+`"`).ReadAll(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1})
			x := h.connect(ctx, t)
			if err := runNamed(ctx, x.PgConn(), "hard_s", hardStmtText); err != nil {
				t.Fatal(err)
			}
			tc.drop(t, x)

			y := h.connect(ctx, t)
			if err := runNamed(ctx, y.PgConn(), "hard_q", hardStmtText); err != nil {
				t.Errorf("another client after the drop: %v", err)
			}
			if err := runNamed(ctx, x.PgConn(), "hard_s2", hardStmtText); err != nil {
				t.Errorf("the same client after the drop: %v", err)
			}
			var n int
			if err := y.QueryRow(ctx, hardStmtText, 1).Scan(&n); err != nil || n != 4001 {
				t.Errorf("another client through pgx's statement cache: %d, %v", n, err)
			}
		})
	}
}

// rawRoundTrip sends msgs and a Sync and summarises the replies up to
// ReadyForQuery: message types, "Error:<SQLSTATE>" and "Data:<first column>".
func rawRoundTrip(t testing.TB, c net.Conn, fe *pgproto3.Frontend, msgs ...pgproto3.FrontendMessage) string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	for _, m := range msgs {
		fe.Send(m)
	}
	fe.Send(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			return strings.Join(got, " ")
		case *pgproto3.ErrorResponse:
			got = append(got, "Error:"+m.Code)
		case *pgproto3.DataRow:
			got = append(got, "Data:"+string(m.Values[0]))
		default:
			got = append(got, fmt.Sprintf("%T", msg)[len("*pgproto3."):])
		}
	}
}

// TestEvictionCloseSkippedAfterPipelineError: with a server statement cache
// of two, a pipeline whose Execute fails and which then parses a third
// statement makes the pooler evict the least recently used statement with an
// injected Close. The server skips that Close (it skips everything up to
// Sync after the error), so the statement is still there. Later uses of the
// evicted text, by the same client or another one, must work; on main every
// Parse of it failed with 42P05 until the server connection closed.
func TestEvictionCloseSkippedAfterPipelineError(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{StatementCacheSize: 2}})
	ctx := testCtx(t, time.Minute)
	const (
		divText   = "SELECT 1/$1::int AS hard_evict_div"
		twoText   = "SELECT 2 AS hard_evict_two"
		threeText = "SELECT 3 AS hard_evict_three"
	)
	c := h.rawLogin(t)
	fe := pgproto3.NewFrontend(c, c)
	if got := rawRoundTrip(t, c, fe,
		&pgproto3.Parse{Name: "div", Query: divText},
		&pgproto3.Parse{Name: "two", Query: twoText},
	); got != "ParseComplete ParseComplete" {
		t.Fatalf("preparing div and two: %s", got)
	}
	// The Bind makes div the most recently used statement, so the Parse of
	// three evicts two; the division by zero makes the server skip the
	// rest, the injected Close of two included. (PostgreSQL plans with the
	// parameter's value at Bind and folds 1/0 there, so the Bind itself may
	// fail.)
	if got := rawRoundTrip(t, c, fe,
		&pgproto3.Bind{PreparedStatement: "div", Parameters: [][]byte{[]byte("0")}},
		&pgproto3.Execute{},
		&pgproto3.Parse{Name: "three", Query: threeText},
		&pgproto3.Bind{PreparedStatement: "three"},
		&pgproto3.Execute{},
	); got != "Error:22012" && got != "BindComplete Error:22012" {
		t.Fatalf("failing pipeline: %s", got)
	}

	for i := range 2 {
		if got := rawRoundTrip(t, c, fe,
			&pgproto3.Bind{PreparedStatement: "two"},
			&pgproto3.Execute{},
		); got != "BindComplete Data:2 CommandComplete" {
			t.Errorf("the same client executing two, attempt %d: %s", i+1, got)
		}
	}
	other := h.connect(ctx, t).PgConn()
	for i := range 2 {
		name := fmt.Sprintf("other_two_%d", i)
		if _, err := other.Prepare(ctx, name, twoText, nil); err != nil {
			t.Errorf("another client preparing the evicted text, attempt %d: %v", i+1, err)
			continue
		}
		res := other.ExecPrepared(ctx, name, nil, nil, nil).Read()
		if res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != "2" {
			t.Errorf("another client executing the evicted text, attempt %d: %q %v", i+1, res.Rows, res.Err)
		}
	}
	if got := rawRoundTrip(t, c, fe,
		&pgproto3.Parse{Name: "three", Query: threeText},
		&pgproto3.Bind{PreparedStatement: "three"},
		&pgproto3.Execute{},
	); got != "ParseComplete BindComplete Data:3 CommandComplete" {
		t.Errorf("the same client preparing three again: %s", got)
	}
}

// TestStatementChangedBehindPoolersBack: SQL that names a pooler statement
// directly removes it from the server or creates it there without the
// pooler's knowledge, so the server answers 26000 or 42P05 for a pooler
// name. The one request that meets the surprise may fail with that code; the
// pooler must then bring its cache back in line, so the next attempt, by the
// same client or another, works and runs the right statement.
func TestStatementChangedBehindPoolersBack(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)

	// The pooler's server name for hardStmtText, learnt from a pool of its
	// own: names depend only on the statement.
	var name string
	{
		h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1})
		pc := h.connect(ctx, t).PgConn()
		if err := runNamed(ctx, pc, "learn", hardStmtText); err != nil {
			t.Fatal(err)
		}
		name = serverStmtName(ctx, t, pc, hardStmtText)
	}

	// A function that removes a prepared statement by name: the statement
	// text the pooler sees does not say what it does.
	if err := cluster.Exec(ctx, `CREATE OR REPLACE FUNCTION hard_stmt_forget(n text) RETURNS void
		LANGUAGE plpgsql AS $$BEGIN EXECUTE format('DEALLOCATE %I', n); END$$`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cluster.Exec(cctx, "DROP FUNCTION IF EXISTS hard_stmt_forget(text)"); err != nil {
			t.Errorf("dropping hard_stmt_forget: %v", err)
		}
	})

	cases := []struct {
		name     string
		wantCode string // what the first attempt after the change may fail with
		change   func(t *testing.T, pc *pgconn.PgConn)
		pins     bool // the change pins its client: it meets the surprise itself
	}{
		{"removed by a function running DEALLOCATE", "26000", func(t *testing.T, pc *pgconn.PgConn) {
			if err := runNamed(ctx, pc, "hard_x", hardStmtText); err != nil {
				t.Fatal(err)
			}
			if res := pc.ExecParams(ctx, "SELECT hard_stmt_forget($1)", [][]byte{[]byte(name)}, nil, nil, nil).Read(); res.Err != nil {
				t.Fatal(res.Err)
			}
		}, false},
		{"created by SQL PREPARE with another body", "42P05", func(t *testing.T, pc *pgconn.PgConn) {
			// Same name, different statement: reusing it would return -1.
			if _, err := pc.Exec(ctx, `PREPARE "`+name+`"(int) AS SELECT $1::int * -1`).ReadAll(); err != nil {
				t.Fatal(err)
			}
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1})
			x := h.connect(ctx, t).PgConn()
			tc.change(t, x)

			// SQL PREPARE pins x to the pool's only server connection
			// (pin.go) until it leaves, so x itself meets the surprise.
			y := x
			if !tc.pins {
				y = h.connect(ctx, t).PgConn()
			}
			if err := runNamed(ctx, y, "hard_first", hardStmtText); err != nil && pgCode(err) != tc.wantCode {
				t.Fatalf("first attempt after the change: %v (only %s is acceptable)", err, tc.wantCode)
			}
			if err := runNamed(ctx, y, "hard_next", hardStmtText); err != nil {
				t.Errorf("the same client's next attempt: %v", err)
			}
			if err := runNamed(ctx, x, "hard_x_next", hardStmtText); err != nil {
				t.Errorf("the client that made the change, next attempt: %v", err)
			}
			if tc.pins {
				if err := x.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
			z := h.connect(ctx, t).PgConn()
			if err := runNamed(ctx, z, "hard_z", hardStmtText); err != nil {
				t.Errorf("a third client: %v", err)
			}
		})
	}
}
