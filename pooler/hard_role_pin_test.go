package pooler_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgquic/pgquic/pooler"
)

// TestRoleChangePinned: with RoleChanges set to RoleChangesPin, an identity
// change outside a transaction block is allowed and pins the client to its
// server connection: the client keeps the role in all its later
// transactions while other clients keep running as the login user on the
// other connection. Once the pinned client leaves, every server connection
// of the pool serves the login user again, the one it was pinned to
// included (unless that connection was closed).
func TestRoleChangePinned(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 3*time.Minute)
	const role = "hard_role_pin_x"
	testRole(ctx, t, cluster, role)
	login := loginIdentity(cluster)

	cases := []struct {
		name   string
		change string
		as     string // identityQuery for the pinned client
	}{
		{"SET ROLE", "SET ROLE " + role, role + " " + cluster.SuperUser + " off"},
		{"set_config role", "SELECT set_config('role', '" + role + "', false)", role + " " + cluster.SuperUser + " off"},
		{"SET SESSION AUTHORIZATION", "SET SESSION AUTHORIZATION " + role, role + " " + role + " off"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 2, cfg: pooler.Config{RoleChanges: pooler.RoleChangesPin}})
			p := h.connect(ctx, t)
			if _, err := p.PgConn().Exec(ctx, tc.change).ReadAll(); err != nil {
				t.Fatalf("%s with RoleChangesPin: %v", tc.change, err)
			}
			pinned := simpleOne(ctx, t, p.PgConn(), "SELECT pg_backend_pid()")

			// Other clients run while the pinned one keeps working.
			const others, rounds = 3, 20
			errs := make(chan error, others+1)
			var wg sync.WaitGroup
			for i := range others {
				o := h.connect(ctx, t).PgConn()
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := range rounds {
						res := o.ExecParams(ctx, identityQuery+", pg_backend_pid()::text", nil, nil, nil, nil).Read()
						if res.Err != nil {
							errs <- fmt.Errorf("other client %d round %d: %w", i, r, res.Err)
							return
						}
						if got, pid := string(res.Rows[0][0]), string(res.Rows[0][1]); got != login || pid == pinned {
							errs <- fmt.Errorf("other client %d round %d: runs as %q on server process %s, want %q and not the pinned %s", i, r, got, pid, login, pinned)
							return
						}
					}
				}()
			}
			for r := range rounds {
				if got := simpleOne(ctx, t, p.PgConn(), identityQuery); got != tc.as {
					t.Errorf("pinned client round %d, simple protocol: %q, want %q", r, got, tc.as)
				}
				if got := extendedOne(ctx, t, p.PgConn(), identityQuery); got != tc.as {
					t.Errorf("pinned client round %d, extended protocol: %q, want %q", r, got, tc.as)
				}
				tx, err := p.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var got, pid string
				if err := tx.QueryRow(ctx, identityQuery+", pg_backend_pid()::text").Scan(&got, &pid); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				if got != tc.as || pid != pinned {
					t.Errorf("pinned client round %d, transaction block: %q on %s, want %q on %s", r, got, pid, tc.as, pinned)
				}
				if t.Failed() {
					break // one failed round says it all
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}

			if err := p.Close(ctx); err != nil {
				t.Fatal(err)
			}
			h.waitSessions(t, others)
			h.waitNoneInUse(t)
			checkEveryConnLogin(ctx, t, h, pinned, login)
		})
	}
}

// checkEveryConnLogin holds a transaction open on each of the pool's two
// server connections at once and checks that both run as the login user.
// If the connection the client was pinned to is not among them, it must be
// gone from the server (closed rather than returned).
func checkEveryConnLogin(ctx context.Context, t *testing.T, h *harness, pinned, login string) {
	t.Helper()
	seen := map[string]bool{}
	for i := range 2 {
		c := h.connect(ctx, t).PgConn()
		if _, err := c.Exec(ctx, "BEGIN").ReadAll(); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = c.Exec(ctx, "ROLLBACK").ReadAll() }()
		res := c.ExecParams(ctx, identityQuery+", pg_backend_pid()::text", nil, nil, nil, nil).Read()
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		got, pid := string(res.Rows[0][0]), string(res.Rows[0][1])
		if got != login {
			t.Errorf("after the pinned client left, client %d on server process %s runs as %q, want %q", i, pid, got, login)
		}
		seen[pid] = true
	}
	if seen[pinned] {
		return
	}
	d := direct(ctx, t, h.cluster)
	deadline := time.Now().Add(15 * time.Second)
	for {
		var n int
		if err := d.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1::int", pinned).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server process %s (the pinned connection) is still alive but served neither of two concurrent transactions", pinned)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
