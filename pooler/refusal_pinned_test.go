package pooler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/pooler"
)

// Refusals while a server connection is attached.
//
// The pooler refuses some statements itself (an identity change outside a
// transaction block, session state under session_state=error). With no
// server connection attached it writes the ErrorResponse and, for a simple
// Query, a ReadyForQuery. With one attached (the client is pinned to it, or
// an unsynchronised extended batch holds it), the server raises the error
// instead, so a transaction block is aborted exactly as PostgreSQL would.
// These tests check that a client refused there gets its ReadyForQuery, that
// its next statement is answered, and that the server connection is idle
// again, for both protocols: a simple Query once hung until the client left,
// its server connection "active" in pg_stat_activity.

// serverIdle waits until the server process pid is idle, as
// pg_stat_activity says, and fails the test if it is not within 30 s.
func serverIdle(ctx context.Context, t *testing.T, d *pgconn.PgConn, pid string) {
	t.Helper()
	waitState(t, "server process "+pid+" idle in pg_stat_activity", func() bool {
		res := d.ExecParams(ctx, "SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1::int",
			[][]byte{[]byte(pid)}, nil, nil, nil).Read()
		if res.Err != nil {
			t.Fatalf("reading pg_stat_activity: %v", res.Err)
		}
		if len(res.Rows) == 0 {
			t.Fatalf("server process %s is gone", pid)
		}
		return string(res.Rows[0][0]) == "idle"
	})
}

// wantRefused fails the test unless err is the pooler's 0A000 with its
// hint, whether the pooler or the server raised it.
func wantRefused(t *testing.T, what string, err error) {
	t.Helper()
	if pgCode(err) != pgproto.CodeFeatureNotSupported {
		t.Fatalf("%s: got %v (SQLSTATE %q), want SQLSTATE %s", what, err, pgCode(err), pgproto.CodeFeatureNotSupported)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Hint == "" {
		t.Errorf("%s: the refusal has no hint: %+v", what, pe)
	}
}

// TestRefusedRoleChangeWhilePinned: under the defaults (role_changes=refuse,
// session_state=pin) a client pinned by a temporary table that tries SET
// SESSION ROLE is refused with 0A000, keeps its login identity and its
// temporary table, gets an answer to its next statement, and its server
// connection is idle in between, whether the statements come one by one in
// the simple protocol, in one Query string, or in the extended protocol.
func TestRefusedRoleChangeWhilePinned(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	const role = "refusal_pinned_r2"
	testRole(ctx, t, cluster, role)
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 2})
	d := direct(ctx, t, cluster).PgConn()

	// A hang shows as a deadline exceeded, well before the test's.
	simple := func(pc *pgconn.PgConn, sql string) error {
		qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		_, err := pc.Exec(qctx, sql).ReadAll()
		return err
	}
	extended := func(pc *pgconn.PgConn, sql string) error {
		qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		return pc.ExecParams(qctx, sql, nil, nil, nil, nil).Read().Err
	}
	cases := []struct {
		name string
		run  func(*pgconn.PgConn, string) error
		one  func(context.Context, testing.TB, *pgconn.PgConn, string) string
	}{
		{"simple", simple, simpleOne},
		{"extended", extended, extendedOne},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pc := h.connect(ctx, t).PgConn()
			if err := tc.run(pc, "CREATE TEMP TABLE t(a int)"); err != nil {
				t.Fatalf("CREATE TEMP TABLE: %v", err)
			}
			pid := tc.one(ctx, t, pc, "SELECT pg_backend_pid()::text")

			wantRefused(t, "SET SESSION ROLE while pinned by a temporary table", tc.run(pc, "SET SESSION ROLE "+role))
			serverIdle(ctx, t, d, pid)
			qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			if got := tc.one(qctx, t, pc, "SELECT 42::text"); got != "42" {
				t.Fatalf("SELECT 42 after the refusal: %q", got)
			}
			if got := tc.one(ctx, t, pc, "SELECT current_user || ' ' || pg_backend_pid() || ' ' || count(*) FROM t"); got != cluster.SuperUser+" "+pid+" 0" {
				t.Fatalf("after the refusal: %q, want the login user on server process %s with the temporary table", got, pid)
			}
			serverIdle(ctx, t, d, pid)
		})
	}

	t.Run("one query string", func(t *testing.T) {
		pc := h.connect(ctx, t).PgConn()
		// Refused as a whole before anything runs: the table is not created.
		wantRefused(t, "CREATE TEMP TABLE; SET SESSION ROLE; SELECT 42 in one Query",
			simple(pc, "CREATE TEMP TABLE t(a int); SET SESSION ROLE "+role+"; SELECT 42;"))
		if got := simpleOne(ctx, t, pc, "SELECT 42::text"); got != "42" {
			t.Fatalf("SELECT 42 after the refusal: %q", got)
		}
		// Pinned first, then refused in one string.
		if err := simple(pc, "CREATE TEMP TABLE t(a int)"); err != nil {
			t.Fatalf("CREATE TEMP TABLE: %v", err)
		}
		pid := simpleOne(ctx, t, pc, "SELECT pg_backend_pid()::text")
		wantRefused(t, "SET SESSION ROLE; SELECT 42 in one Query while pinned", simple(pc, "SET SESSION ROLE "+role+"; SELECT 42;"))
		serverIdle(ctx, t, d, pid)
		if got := simpleOne(ctx, t, pc, "SELECT current_user || ' ' || pg_backend_pid()"); got != cluster.SuperUser+" "+pid {
			t.Fatalf("after the refusal: %q, want the login user on server process %s", got, pid)
		}
	})
}

// TestRefusedSessionStateWhileAttached: under session_state=error, a client
// whose unsynchronised extended batch holds a server connection and that
// then sends a statement creating session state is refused with 0A000, by
// the server, in order after the batch's replies; it gets its ReadyForQuery,
// its next statement is answered and the connection goes back idle. The
// refused statement comes as a simple Query and as an extended Parse, Bind,
// Execute, Sync. (A pinned client cannot meet this refusal: any pin allows
// session state, see checkState.)
func TestRefusedSessionStateWhileAttached(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 2, cfg: pooler.Config{SessionState: pooler.SessionStateError}})
	d := direct(ctx, t, cluster).PgConn()

	const create = "CREATE TEMP TABLE refused_t(a int)"
	cases := []struct {
		name string
		msgs []pgproto3.FrontendMessage
	}{
		{"simple", []pgproto3.FrontendMessage{&pgproto3.Query{String: create}}},
		{"extended", []pgproto3.FrontendMessage{
			&pgproto3.Parse{Query: create}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			c, _ := startRaw(rctx, t, h.ln.Addr().String(), nil)
			// An extended batch without Sync: the pooler keeps the server
			// connection attached once its replies have come.
			c.send(&pgproto3.Parse{Query: "SELECT pg_backend_pid()::text"}, &pgproto3.Bind{},
				&pgproto3.Execute{}, &pgproto3.Flush{})
			var pid string
			for pid == "" {
				msg, err := c.fe.Receive()
				if err != nil {
					t.Fatalf("reading the batch's replies: %v", err)
				}
				if m, ok := msg.(*pgproto3.DataRow); ok {
					pid = string(m.Values[0])
				}
			}
			if got := c.untilCommandComplete(); got != "C[SELECT 1]" {
				t.Fatalf("batch ended with %s", got)
			}

			c.send(tc.msgs...)
			got := c.untilZ()
			want := "E[ERROR " + pgproto.CodeFeatureNotSupported + "]"
			if len(got) == 0 || got[0] == "" || !containsFrame(got, want) || got[len(got)-1] != "Z[I]" {
				t.Fatalf("refused %s: got %v, want %s then Z[I]", create, got, want)
			}
			serverIdle(ctx, t, d, pid)

			c.send(&pgproto3.Query{String: "SELECT 42"})
			if got := c.untilZ(); !containsFrame(got, "D[42]") {
				t.Fatalf("SELECT 42 after the refusal: %v", got)
			}
			c.send(&pgproto3.Terminate{})
		})
	}
}

// untilCommandComplete reads messages up to the next CommandComplete and
// returns it summarised.
func (c *rawConn) untilCommandComplete() string {
	c.t.Helper()
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			c.t.Fatalf("receive: %v", err)
		}
		if _, ok := msg.(*pgproto3.CommandComplete); ok {
			return summarise(msg)
		}
	}
}

// containsFrame reports whether frames holds f.
func containsFrame(frames []string, f string) bool {
	for _, g := range frames {
		if g == f {
			return true
		}
	}
	return false
}
