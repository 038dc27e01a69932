package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/pgtest"
)

// TestServeTemplateDatabaseNotHeld: after a client used template1 through
// the pooler (the wildcard route, and a databases: route with min_pool 2),
// the pooler keeps no server connection to it, so CREATE DATABASE ...
// TEMPLATE template1 run directly on the server succeeds at the first try.
func TestServeTemplateDatabaseNotHeld(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	cfg := testConfig(cluster.SuperURL("postgres"))
	two := 2
	cfg.Databases = []config.Database{{Name: "tpl", Backend: cluster.SuperURL("template1"), MinPool: &two}}
	srv, _, _ := startTestServer(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	templateConns := func() int {
		n := 0
		for _, np := range srv.live.manager.Load().NamedPools() {
			if np.Pool.Database() == "template1" {
				n += np.Pool.Stat().Total
			}
		}
		return n
	}
	for i, db := range []string{"template1", "tpl"} {
		url := fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, srv.tcp.Addr(), db)
		c, err := pgconn.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Exec(ctx, "SELECT current_database()").ReadAll()
		if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "template1" {
			t.Fatalf("%s: SELECT current_database() = %v, %v", db, res, err)
		}
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
		// The pool closes the connection in the background once released.
		waitFor(t, func() bool { return templateConns() == 0 })

		direct, err := pgconn.Connect(ctx, cluster.SuperURL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = direct.Exec(ctx, fmt.Sprintf("CREATE DATABASE made_%d TEMPLATE template1", i)).ReadAll()
		_ = direct.Close(ctx)
		if err != nil {
			t.Fatalf("CREATE DATABASE ... TEMPLATE template1 after a client used %s through the pooler: %v", db, err)
		}
	}
}
