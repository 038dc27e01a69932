package backend

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// createDatabase runs CREATE DATABASE name TEMPLATE template1 directly on
// the server, once, and returns its error.
func createDatabase(ctx context.Context, t *testing.T, c *pgtest.Cluster, name string) error {
	t.Helper()
	conn, err := pgconn.Connect(ctx, c.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template1").ReadAll()
	return err
}

// TestTemplatePoolKeepsNoIdle: a pool whose database is a template opens
// no connection to reach MinPool, closes the connections warm opened, and
// closes a connection released idle instead of pooling it, so CREATE
// DATABASE ... TEMPLATE succeeds right after a client used the template; a
// pool of an ordinary database keeps its MinPool.
func TestTemplatePoolKeepsNoIdle(t *testing.T) {
	c := pgtest.New(t, pgtest.Options{Logger: testLogger(t)})
	ctx := testCtx(t)

	tpl := newTestPool(t, PoolConfig{ConnString: c.SuperURL("template1"), PoolSize: 4, MinPool: 2}, nil)
	waitFor(t, 10*time.Second, "the template pool to close its warm connections", func() bool {
		return tpl.Stat().Total == 0
	})
	if !tpl.Template() || tpl.Settings().MinPool != 0 {
		t.Fatalf("template pool: Template() = %v, Settings().MinPool = %d; want true, 0", tpl.Template(), tpl.Settings().MinPool)
	}
	conn, err := tpl.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := query(t, conn, "SELECT current_database()"); len(got) != 1 || got[0] != "template1" {
		t.Fatalf("current_database() = %v", got)
	}
	conn.Release()
	// puddle closes a destroyed connection in the background.
	waitFor(t, 5*time.Second, "the released connection to close", func() bool { return tpl.Stat().Total == 0 })
	if err := createDatabase(ctx, t, c, "made_from_template"); err != nil {
		t.Fatalf("CREATE DATABASE ... TEMPLATE template1 right after a pooled client used template1: %v", err)
	}

	plain := newTestPool(t, PoolConfig{ConnString: c.SuperURL("postgres"), PoolSize: 4, MinPool: 1}, nil)
	// Wait for warm's connection first: an Acquire racing it opens a
	// second one, which is correct for the pool but not what this checks.
	waitFor(t, 10*time.Second, "the ordinary pool to open its MinPool connection", func() bool {
		st := plain.Stat()
		return st.Total == 1 && st.Idle == 1
	})
	conn, err = plain.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn.Release()
	if st := plain.Stat(); plain.Template() || st.Total != 1 || st.Idle != 1 {
		t.Fatalf("ordinary pool: Template() = %v, stats %+v; want false and one idle connection", plain.Template(), st)
	}
}
