package pooler_test

import (
	"testing"
	"time"

	"github.com/pgquic/pgquic/pooler"
)

// TestSetFollowsClientAcrossConnections: in transaction mode a client's
// SET runs on one server connection, and its next statement may get
// another one that the client used before, idle since and touched by no one
// else. That one must get the new value too: the pooler once skipped the
// sync there because the client was its last borrower, and the statement
// after SET timezone = '04:15' ran with the old timezone (seen in
// PostgreSQL's own timestamptz and date tests through pgquic).
//
// With two server connections the pool lends the last one returned first
// (puddle keeps idle connections in a stack): c uses A while x holds B; x
// returns B, so c's SET gets B; x takes B again, so c's next statement
// gets A.
func TestSetFollowsClientAcrossConnections(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	for _, tc := range []struct {
		name, set, show, want string
	}{
		{"reported timezone", "SET timezone = '04:15'", "SELECT current_setting('timezone') || ' ' || to_char(now(), 'OF')", "04:15 -04:15"},
		{"reported DateStyle", "SET datestyle TO dmy", "SELECT date '1/8/1999'::text", "1999-08-01"},
		{"unreported search_path", "SET search_path TO pg_catalog, other", "SELECT current_setting('search_path')", "pg_catalog, other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 2, cfg: pooler.Config{PipelineDepth: 1}})
			c := h.connect(ctx, t).PgConn()
			x := h.connect(ctx, t).PgConn()
			pid := "SELECT pg_backend_pid()::text"

			if _, err := x.Exec(ctx, "BEGIN").ReadAll(); err != nil {
				t.Fatal(err)
			}
			b := simpleOne(ctx, t, x, pid)
			a := simpleOne(ctx, t, c, pid)
			if _, err := x.Exec(ctx, "COMMIT").ReadAll(); err != nil {
				t.Fatal(err)
			}
			h.waitNoneInUse(t) // a connection goes back just after its ReadyForQuery
			rs, err := c.Exec(ctx, tc.set+"; "+pid).ReadAll()
			if err != nil {
				t.Fatalf("%s: %v", tc.set, err)
			}
			if got := string(rs[len(rs)-1].Rows[0][0]); got != b {
				t.Fatalf("the SET ran on server process %s, want %s (the one returned last): the scenario was not reached", got, b)
			}
			h.waitNoneInUse(t)
			if _, err := x.Exec(ctx, "BEGIN").ReadAll(); err != nil {
				t.Fatal(err)
			}
			if got := simpleOne(ctx, t, x, pid); got != b {
				t.Fatalf("x got server process %s, want %s: the scenario was not reached", got, b)
			}
			rs, err = c.Exec(ctx, tc.show+"; "+pid).ReadAll()
			if err != nil {
				t.Fatalf("%s: %v", tc.show, err)
			}
			if got := string(rs[len(rs)-1].Rows[0][0]); got != a {
				t.Fatalf("c's statement ran on server process %s, want %s: the scenario was not reached", got, a)
			}
			if got := string(rs[0].Rows[0][0]); got != tc.want {
				t.Errorf("after %s on another server connection: %s gives %q, want %q", tc.set, tc.show, got, tc.want)
			}
			if _, err := x.Exec(ctx, "COMMIT").ReadAll(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
