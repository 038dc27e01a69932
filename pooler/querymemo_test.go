package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestQueryMemoDigitLookalikes plays a client that first sends a plain
// text, which the session keeps with its classification, and then one
// that differs from it in digits alone but changes session state: the
// digits sit in dollar-quote tags, so the first text is one string and
// the second a SET between two strings. Over the only server connection,
// another client must never see that state, and the first must keep its
// own.
func TestQueryMemoDigitLookalikes(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, minPool: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	connect := func() *pgconn.PgConn {
		c, err := pgconn.Connect(ctx, h.url())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	show := func(c *pgconn.PgConn, q string) string {
		t.Helper()
		res, err := c.Exec(ctx, q).ReadAll()
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return string(res[len(res)-1].Rows[0][0])
	}
	a, b := connect(), connect()
	want := show(b, "SHOW search_path")
	plain := "SELECT $a1$ $a2$; SET search_path = memo_x; SELECT $a2$ $a1$"
	lookalike := "SELECT $a2$ $a2$; SET search_path = memo_x; SELECT $a2$ $a2$"
	for range 3 {
		if got := show(a, plain); got != " $a2$; SET search_path = memo_x; SELECT $a2$ " {
			t.Fatalf("%s: %q", plain, got)
		}
	}
	if _, err := a.Exec(ctx, lookalike).ReadAll(); err != nil {
		t.Fatalf("%s: %v", lookalike, err)
	}
	for range 3 {
		if got := show(b, "SHOW search_path"); got != want {
			t.Fatalf("the other client sees search_path %q, want %q", got, want)
		}
		if got := show(a, "SHOW search_path"); got != "memo_x" {
			t.Fatalf("the client that SET it sees search_path %q", got)
		}
	}

	// SET ROLE the same way: whatever the pooler does with it (refuse or
	// pin), once that client is gone the other runs as itself.
	plain = "SELECT $a1$ $a2$; SET ROLE pg_monitor; SELECT $a2$ $a1$"
	lookalike = "SELECT $a2$ $a2$; SET ROLE pg_monitor; SELECT $a2$ $a2$"
	c := connect()
	for range 3 {
		show(c, plain)
	}
	_, _ = c.Exec(ctx, lookalike).ReadAll()
	role := show(c, "SELECT current_user")
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := show(b, "SELECT current_user"); got != "postgres" {
		t.Fatalf("after a client's %q (it ran as %q), the other runs as %q", lookalike, role, got)
	}
}
