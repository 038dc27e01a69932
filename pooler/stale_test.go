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

// TestStaleStatementManyServers spreads a statement over two server
// connections before ALTER TABLE: once one copy has been found stale, the
// other is prepared again before use, so later clients succeed even inside
// transaction blocks, where no retry is possible; clients that used the
// statement before the change get 0A000 once, then the new shape.
func TestStaleStatementManyServers(t *testing.T) {
	c := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	h := newHarness(t, harnessOpts{cluster: c, poolSize: 2})
	if err := c.Exec(ctx, "drop table if exists stale_many; create table stale_many (a int); insert into stale_many values (1)"); err != nil {
		t.Fatal(err)
	}
	sql := "select * from stale_many where a = $1"
	// Two clients in concurrent transactions hold both server connections,
	// so each prepares the statement on its own.
	inTx := func(conns ...*pgx.Conn) []string {
		var txs []pgx.Tx
		for _, conn := range conns {
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			txs = append(txs, tx)
		}
		var out []string
		for _, conn := range conns {
			out = append(out, outcome(ctx, conn, sql, 1))
		}
		for _, tx := range txs {
			_ = tx.Rollback(ctx)
		}
		return out
	}
	a, b := h.connect(ctx, t), h.connect(ctx, t)
	for _, got := range inTx(a, b) {
		if got != "1 columns [[1]]" {
			t.Fatalf("before the change: %s", got)
		}
	}
	if err := c.Exec(ctx, "alter table stale_many add column b int default 7"); err != nil {
		t.Fatal(err)
	}
	const want = "2 columns [[1 7]]"
	if got := outcome(ctx, h.connect(ctx, t), sql, 1); got != want {
		t.Fatalf("first new client: %s, want %s", got, want)
	}
	for round := range 3 {
		for i, got := range inTx(h.connect(ctx, t), h.connect(ctx, t)) {
			if got != want {
				t.Errorf("round %d, new client %d in a transaction: %s, want %s", round, i, got, want)
			}
		}
	}
	for name, conn := range map[string]*pgx.Conn{"a": a, "b": b} {
		if got := outcome(ctx, conn, sql, 1); got != "error 0A000" {
			t.Errorf("client %s, prepared before the change: %s, want error 0A000", name, got)
		}
		if got := outcome(ctx, conn, sql, 1); got != want {
			t.Errorf("client %s again: %s, want %s", name, got, want)
		}
	}
	h.waitNoneInUse(t)
}

// TestStaleStatementLongPipeline makes the first use of a stale statement
// part of a pipeline longer than the pooler records: the retry is not
// attempted, the client gets 0A000 as it would have from the stale copy,
// and its next attempt works.
func TestStaleStatementLongPipeline(t *testing.T) {
	c := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	h := newHarness(t, harnessOpts{cluster: c, poolSize: 1})
	if err := c.Exec(ctx, "drop table if exists stale_long; create table stale_long (a int, t text); insert into stale_long values (1, 'x')"); err != nil {
		t.Fatal(err)
	}
	sql := "select * from stale_long where t <> $1"
	first, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
	first.send(&pgproto3.Parse{Name: "s", Query: sql}, &pgproto3.Describe{ObjectType: 'S', Name: "s"}, &pgproto3.Sync{})
	first.untilZ()
	if err := c.Exec(ctx, "alter table stale_long add column b int default 7"); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 100<<10)
	for i := range big {
		big[i] = 'y'
	}
	use := []pgproto3.FrontendMessage{
		&pgproto3.Parse{Name: "s", Query: sql},
		&pgproto3.Bind{PreparedStatement: "s", Parameters: [][]byte{big}},
		&pgproto3.Describe{ObjectType: 'P'},
		&pgproto3.Execute{},
		&pgproto3.Sync{},
	}
	second, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
	second.send(use...)
	got := second.untilZ()
	if want := []string{"ParseComplete", "E[ERROR 0A000]", "Z[I]"}; !slices.Equal(got, want) {
		t.Fatalf("long pipeline: %v, want %v", got, want)
	}
	second.send(use[1:]...)
	got = second.untilZ()
	if want := []string{"BindComplete", "RowDescription", "D[1,x,7]", "C[SELECT 1]", "Z[I]"}; !slices.Equal(got, want) {
		t.Fatalf("next attempt: %v, want %v", got, want)
	}
	h.waitNoneInUse(t)
}
