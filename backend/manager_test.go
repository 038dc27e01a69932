package backend

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/pgtest"
)

func TestManagerRouting(t *testing.T) {
	ctx := testCtx(t)
	const pw = "shared-pw"
	pg := pgtest.New(t, pgtest.Options{
		Auth: pgtest.AuthSCRAM,
		Users: []pgtest.User{
			{Name: "alice", Password: pw},
			{Name: "bob", Password: pw},
			{Name: "carol", Password: pw},
		},
		Logger: testLogger(t),
	})
	for _, sql := range []string{"CREATE DATABASE db1", "CREATE DATABASE db2"} {
		if err := pg.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}

	reg := prometheus.NewRegistry()
	m, err := NewManager(ctx, ManagerConfig{
		Routes: []Route{
			// Exact: alice on db1 connects as alice.
			{Database: "db1", User: "alice", PoolConfig: PoolConfig{ConnString: pg.URL("alice", pw, "db1"), MinPool: 2}},
			// Any user on db1 connects as bob.
			{Database: "db1", PoolConfig: PoolConfig{ConnString: pg.URL("bob", pw, "db1")}},
			// Wildcard: the client's database and user, the route's password.
			{Database: "*", User: "*", PoolConfig: PoolConfig{ConnString: pg.URL("nobody", pw, "postgres")}},
		},
		Defaults: PoolConfig{PoolSize: 3, MinPool: 1},
	}, testLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	// Pools of named-database routes are open and warm right away.
	pools := m.Pools()
	if len(pools) != 2 {
		t.Fatalf("%d pools at start, want 2", len(pools))
	}
	for _, p := range pools {
		want := 1
		if p.User() == "alice" {
			want = 2
		}
		if s := p.Stat(); s.Total != want {
			t.Errorf("pool %s/%s at start: %+v, want %d connections", p.Database(), p.User(), s, want)
		}
	}

	for _, tc := range []struct {
		db, user         string
		wantDB, wantUser string
	}{
		{"db1", "alice", "db1", "alice"},
		{"db1", "carol", "db1", "bob"},
		{"db1", "bob", "db1", "bob"},
		{"db2", "carol", "db2", "carol"},
		{"postgres", "alice", "postgres", "alice"},
	} {
		p, err := m.Pool(ctx, tc.db, tc.user)
		if err != nil {
			t.Fatalf("Pool(%s, %s): %v", tc.db, tc.user, err)
		}
		if p.Database() != tc.wantDB || p.User() != tc.wantUser {
			t.Fatalf("Pool(%s, %s) = %s/%s, want %s/%s", tc.db, tc.user, p.Database(), p.User(), tc.wantDB, tc.wantUser)
		}
		again, _ := m.Pool(ctx, tc.db, tc.user)
		if again != p {
			t.Fatalf("Pool(%s, %s) not cached", tc.db, tc.user)
		}
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Fatalf("Acquire for %s/%s: %v", tc.db, tc.user, err)
		}
		got := query(t, c, "SELECT current_database() || '/' || current_user")
		c.Release()
		if want := tc.wantDB + "/" + tc.wantUser; got[0] != want {
			t.Fatalf("client %s/%s landed on %s, want %s", tc.db, tc.user, got[0], want)
		}
	}
	// db1/carol and db1/bob share the any-user route's pool.
	p1, _ := m.Pool(ctx, "db1", "carol")
	p2, _ := m.Pool(ctx, "db1", "bob")
	if p1 != p2 {
		t.Fatal("clients of one any-user route got different pools")
	}
	if n := len(m.Pools()); n != 4 {
		t.Fatalf("%d pools, want 4 (db1/alice, db1/bob, db2/carol, postgres/alice)", n)
	}

	// Without a wildcard route an unknown database has no route.
	m2, err := NewManager(ctx, ManagerConfig{Routes: []Route{
		{Database: "db1", User: "alice", PoolConfig: PoolConfig{ConnString: pg.URL("alice", pw, "db1")}},
	}}, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if _, err := m2.Pool(ctx, "db2", "alice"); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("Pool(db2, alice): %v, want ErrNoRoute", err)
	}
	if _, err := m2.Pool(ctx, "db1", "bob"); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("Pool(db1, bob): %v, want ErrNoRoute", err)
	}
}
