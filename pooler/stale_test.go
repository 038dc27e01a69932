package pooler_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/pooler"
)

// outcome summarises one query's result for comparison: its columns and
// rows, or its SQLSTATE.
func outcome(ctx context.Context, c *pgx.Conn, sql string, args ...any) string {
	rows, err := c.Query(ctx, sql, args...)
	if err != nil {
		return "error " + pgCode(err)
	}
	vals, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
	if err != nil {
		return "error " + pgCode(err)
	}
	return fmt.Sprintf("%d columns %v", len(rows.FieldDescriptions()), vals)
}

// TestStaleStatementAfterDDL runs the same sequence of clients and DDL
// directly against PostgreSQL and through the pooler in transaction mode,
// with one server connection so every client shares its statement cache,
// and compares what each query returns. A client that prepares after ALTER
// TABLE must get the new shape (the pooler re-prepares its shared statement
// and retries), and a client that prepared before gets 0A000 once, as
// directly, and then the new shape once pgx prepares again.
func TestStaleStatementAfterDDL(t *testing.T) {
	c := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	h := newHarness(t, harnessOpts{cluster: c, poolSize: 1, cfg: pooler.Config{Mode: pooler.ModeTransaction}})
	run := func(url, table string) []string {
		if err := c.Exec(ctx, fmt.Sprintf("drop table if exists %[1]s; create table %[1]s (a int); insert into %[1]s values (1)", table)); err != nil {
			t.Fatal(err)
		}
		connect := func() *pgx.Conn {
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			return conn
		}
		sql := "select * from " + table + " where a = $1"
		var got []string
		c1 := connect()
		got = append(got, "c1 "+outcome(ctx, c1, sql, 1))
		if err := c.Exec(ctx, "alter table "+table+" add column b int default 7"); err != nil {
			t.Fatal(err)
		}
		c2 := connect()
		got = append(got, "c2 "+outcome(ctx, c2, sql, 1))
		got = append(got, "c2 "+outcome(ctx, c2, sql, 1))
		got = append(got, "c1 "+outcome(ctx, c1, sql, 1))
		got = append(got, "c1 "+outcome(ctx, c1, sql, 1))
		c3 := connect()
		got = append(got, "c3 "+outcome(ctx, c3, sql, 1))
		// Drop and create the table again with another shape.
		if err := c.Exec(ctx, fmt.Sprintf("drop table %[1]s; create table %[1]s (a int, b text, c bool); insert into %[1]s values (1, 'x', true)", table)); err != nil {
			t.Fatal(err)
		}
		c4 := connect()
		got = append(got, "c4 "+outcome(ctx, c4, sql, 1))
		got = append(got, "c3 "+outcome(ctx, c3, sql, 1))
		got = append(got, "c3 "+outcome(ctx, c3, sql, 1))
		// Inside a transaction block a retry would hide the aborted
		// transaction; the error is passed through there as directly.
		if err := c.Exec(ctx, "alter table "+table+" drop column c"); err != nil {
			t.Fatal(err)
		}
		tx, err := c4.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, "c4 in tx "+outcome(ctx, c4, sql, 1))
		_ = tx.Rollback(ctx)
		got = append(got, "c4 "+outcome(ctx, c4, sql, 1))
		return got
	}
	want := run(c.SuperURL("postgres"), "stale_direct")
	got := run(h.url(), "stale_pooled")
	if !slices.Equal(want, got) {
		t.Errorf("outcomes differ:\n  PostgreSQL: %q\n  pgquic:     %q", want, got)
	}
	t.Logf("outcomes: %q", want)
	h.waitNoneInUse(t)
}

// TestStaleStatementFrames replays a node-postgres style exchange at the
// frame level: a client that prepared a named statement before ALTER TABLE
// and uses it again (Bind, Describe portal, Execute, Sync) gets 0A000, and a
// new client's Parse, Bind, Describe, Execute, Sync pipeline gets the new
// shape, directly and through the pooler alike.
func TestStaleStatementFrames(t *testing.T) {
	c := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	h := newHarness(t, harnessOpts{cluster: c, poolSize: 1})
	probe := func(addr, table string) [][]string {
		if err := c.Exec(ctx, fmt.Sprintf("drop table if exists %[1]s; create table %[1]s (a int); insert into %[1]s values (1)", table)); err != nil {
			t.Fatal(err)
		}
		sql := "select * from " + table
		use := []pgproto3.FrontendMessage{
			&pgproto3.Bind{PreparedStatement: "s1"},
			&pgproto3.Describe{ObjectType: 'P'},
			&pgproto3.Execute{},
			&pgproto3.Sync{},
		}
		prepareAndUse := append([]pgproto3.FrontendMessage{&pgproto3.Parse{Name: "s1", Query: sql}}, use...)
		var out [][]string
		c1, _ := startRaw(ctx, t, addr, nil)
		c1.send(prepareAndUse...)
		out = append(out, c1.untilZ())
		if err := c.Exec(ctx, "alter table "+table+" add column b int default 7"); err != nil {
			t.Fatal(err)
		}
		c2, _ := startRaw(ctx, t, addr, nil)
		c2.send(prepareAndUse...)
		out = append(out, c2.untilZ())
		c1.send(use...)
		out = append(out, c1.untilZ())
		c2.send(use...)
		out = append(out, c2.untilZ())
		// A Describe of the statement alone, then its use, as pgx prepares.
		if err := c.Exec(ctx, "alter table "+table+" add column c int default 8"); err != nil {
			t.Fatal(err)
		}
		c3, _ := startRaw(ctx, t, addr, nil)
		c3.send(&pgproto3.Parse{Name: "s1", Query: sql}, &pgproto3.Describe{ObjectType: 'S', Name: "s1"}, &pgproto3.Sync{})
		out = append(out, c3.untilZ())
		c3.send(use...)
		out = append(out, c3.untilZ())
		return out
	}
	want := probe(clusterAddr(c), "stale_frames_direct")
	got := probe(h.ln.Addr().String(), "stale_frames_pooled")
	for i := range want {
		sameFrames(t, fmt.Sprintf("step %d", i+1), want[i], got[i])
	}
	h.waitNoneInUse(t)
}
