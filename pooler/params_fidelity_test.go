package pooler_test

import (
	"context"
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
