package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// Identity changes in transaction mode.
//
// SET ROLE and SET SESSION AUTHORIZATION outside a transaction block change
// the server connection for the rest of its life, while the client's next
// transaction may run on another connection and the changed one is handed
// to other clients. By default the pooler refuses them there with 0A000;
// inside a transaction block they are allowed and the pooler puts the login
// identity back before the connection serves anyone again.

// identityQuery reads who the server connection runs as, and whether
// transactions default to read-only.
const identityQuery = "SELECT current_user || ' ' || session_user || ' ' || current_setting('default_transaction_read_only')"

// loginIdentity is what identityQuery returns on a connection in its login
// state: the harness logs its pools in as the cluster's superuser.
func loginIdentity(c *pgtest.Cluster) string {
	return c.SuperUser + " " + c.SuperUser + " off"
}

// testRole creates a NOLOGIN role for one test and drops it at the end. The
// harness logs its pools in as the cluster's superuser, who may SET ROLE and
// SET SESSION AUTHORIZATION to any role, so no GRANT is needed.
func testRole(ctx context.Context, t testing.TB, c *pgtest.Cluster, name string) {
	t.Helper()
	if err := c.Exec(ctx, "DROP ROLE IF EXISTS "+name+"; CREATE ROLE "+name+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Exec(cctx, "DROP ROLE IF EXISTS "+name); err != nil {
			t.Errorf("dropping role %s: %v", name, err)
		}
	})
}

// protocols runs one SQL string through the simple or the extended protocol.
var protocols = []struct {
	name string
	run  func(ctx context.Context, pc *pgconn.PgConn, sql string) error
}{
	{"simple", func(ctx context.Context, pc *pgconn.PgConn, sql string) error {
		_, err := pc.Exec(ctx, sql).ReadAll()
		return err
	}},
	{"extended", func(ctx context.Context, pc *pgconn.PgConn, sql string) error {
		return pc.ExecParams(ctx, sql, nil, nil, nil, nil).Read().Err
	}},
}

// TestRoleChangeRefusedOutsideTransaction: outside a transaction block each
// identity change is refused with 0A000 in both protocols; the session stays
// usable, and it and the next client of the same server connection (pool of
// one) run as the login user. On main the statements ran and the role stayed
// on the server connection.
func TestRoleChangeRefusedOutsideTransaction(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 3*time.Minute)
	const role = "hard_role_refuse_x"
	testRole(ctx, t, cluster, role)
	login := loginIdentity(cluster)

	statements := []string{
		"SET ROLE " + role,
		"SET SESSION ROLE " + role,
		"RESET ROLE",
		"SET SESSION AUTHORIZATION " + role,
		"RESET SESSION AUTHORIZATION",
		"SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
		"SELECT set_config('role', '" + role + "', false)",
	}
	for _, proto := range protocols {
		for _, stmt := range statements {
			t.Run(proto.name+"/"+stmt, func(t *testing.T) {
				h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1})
				x := h.connect(ctx, t).PgConn()
				pid := simpleOne(ctx, t, x, "SELECT pg_backend_pid()")
				if err := proto.run(ctx, x, stmt); pgCode(err) != "0A000" {
					t.Errorf("%s: got %v, want SQLSTATE 0A000", stmt, err)
				}
				if st := x.TxStatus(); st != 'I' {
					t.Errorf("transaction status after the refusal: %c, want I", st)
				}
				if got := simpleOne(ctx, t, x, identityQuery); got != login {
					t.Errorf("the same client afterwards runs as %q, want %q", got, login)
				}
				y := h.connect(ctx, t).PgConn()
				if p := simpleOne(ctx, t, y, "SELECT pg_backend_pid()"); p != pid {
					t.Fatalf("the other client runs on server process %s, the first on %s: the test needs them to share it", p, pid)
				}
				if got := extendedOne(ctx, t, y, identityQuery); got != login {
					t.Errorf("another client on the same server connection runs as %q, want %q", got, login)
				}
			})
		}
	}
}

// TestRoleChangeLookalikesNotRefused: statements that only mention an
// identity change in a string or a comment run normally.
func TestRoleChangeLookalikesNotRefused(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	pc := h.connect(ctx, t).PgConn()
	for _, proto := range protocols {
		for _, sql := range []string{
			"SELECT 'SET ROLE hard_role_none'",
			"SELECT 1 /* SET ROLE hard_role_none */",
			"SELECT 'SET SESSION AUTHORIZATION hard_role_none', 2 -- RESET ROLE",
			"SELECT current_setting('role')",
		} {
			if err := proto.run(ctx, pc, sql); err != nil {
				t.Errorf("%s %q: %v", proto.name, sql, err)
			}
		}
	}
	if got := simpleOne(ctx, t, pc, identityQuery); got != loginIdentity(h.cluster) {
		t.Errorf("afterwards the client runs as %q", got)
	}
}

// TestRoleChangeInsideTransactionReset: inside a transaction block identity
// changes are allowed and in force until the block ends; after COMMIT the
// pooler restores the login identity before the server connection runs
// anything else, for the same client's next transaction and for another
// client's (pool of one, so both land on that connection). On main a
// session-level SET ROLE committed inside a block stayed on the connection.
func TestRoleChangeInsideTransactionReset(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 3*time.Minute)
	const role = "hard_role_tx_x"
	testRole(ctx, t, cluster, role)
	login := loginIdentity(cluster)
	asRole := role + " " + cluster.SuperUser + " off"

	cases := []struct {
		name   string
		change string
		inside string // identityQuery inside the block after the change
	}{
		{"SET ROLE", "SET ROLE " + role, asRole},
		{"SET SESSION ROLE", "SET SESSION ROLE " + role, asRole},
		{"set_config role", "SELECT set_config('role', '" + role + "', false)", asRole},
		{"SET SESSION AUTHORIZATION", "SET SESSION AUTHORIZATION " + role, role + " " + role + " off"},
		{"SET LOCAL ROLE", "SET LOCAL ROLE " + role, asRole},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1})
			x := h.connect(ctx, t).PgConn()
			pid := simpleOne(ctx, t, x, "SELECT pg_backend_pid()")
			if _, err := x.Exec(ctx, "BEGIN").ReadAll(); err != nil {
				t.Fatal(err)
			}
			if _, err := x.Exec(ctx, tc.change).ReadAll(); err != nil {
				t.Fatalf("%s inside BEGIN: %v", tc.change, err)
			}
			if got := extendedOne(ctx, t, x, identityQuery); got != tc.inside {
				t.Errorf("inside the block: %q, want %q", got, tc.inside)
			}
			if _, err := x.Exec(ctx, "COMMIT").ReadAll(); err != nil {
				t.Fatal(err)
			}
			if got := simpleOne(ctx, t, x, identityQuery); got != login {
				t.Errorf("the same client's next transaction runs as %q, want %q", got, login)
			}
			y := h.connect(ctx, t).PgConn()
			if p := simpleOne(ctx, t, y, "SELECT pg_backend_pid()"); p != pid {
				t.Fatalf("the other client runs on server process %s, the first on %s: the test needs them to share it", p, pid)
			}
			if got := extendedOne(ctx, t, y, identityQuery); got != login {
				t.Errorf("another client on the same server connection runs as %q, want %q", got, login)
			}
		})
	}
}

// TestRoleChangeInOneQueryBlockReset: "BEGIN; SET ROLE x; COMMIT" sent as
// one simple Query is a transaction block too: allowed, and the next
// transaction, of that client or another one on the same server connection,
// runs as the login user.
func TestRoleChangeInOneQueryBlockReset(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	const role = "hard_role_onequery_x"
	testRole(ctx, t, cluster, role)
	login := loginIdentity(cluster)

	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1})
	x := h.connect(ctx, t).PgConn()
	pid := simpleOne(ctx, t, x, "SELECT pg_backend_pid()")
	rs, err := x.Exec(ctx, "BEGIN; SET ROLE "+role+"; SELECT current_user; COMMIT").ReadAll()
	if err != nil {
		t.Fatalf("BEGIN; SET ROLE; COMMIT in one Query: %v", err)
	}
	if len(rs) != 4 || len(rs[2].Rows) != 1 || string(rs[2].Rows[0][0]) != role {
		t.Fatalf("inside the block: %+v, want current_user %s", rs, role)
	}
	y := h.connect(ctx, t).PgConn()
	if p := simpleOne(ctx, t, y, "SELECT pg_backend_pid()"); p != pid {
		t.Fatalf("the other client runs on server process %s, the first on %s: the test needs them to share it", p, pid)
	}
	if got := extendedOne(ctx, t, y, identityQuery); got != login {
		t.Errorf("another client on the same server connection runs as %q, want %q", got, login)
	}
	if got := simpleOne(ctx, t, x, identityQuery); got != login {
		t.Errorf("the same client's next transaction runs as %q, want %q", got, login)
	}
}
