package pooler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestSequenceStateNotShared: nextval leaves its value in the server
// process, where lastval() and currval() find it. Two clients share one
// server connection (pool_size 1): B must never read the value A's
// nextval left, whether B calls lastval or currval itself, through a
// function or a view the pooler cannot see into, in either protocol; it
// gets 55000 "not yet defined in this session" instead, as on a
// connection of its own. A, alone on the connection, keeps its own value.
func TestSequenceStateNotShared(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, reg := catalogHarness(t, 1, time.Hour)
	for _, q := range []string{
		"DROP VIEW IF EXISTS public.seq_v",
		"DROP FUNCTION IF EXISTS public.seq_peek()",
		"DROP SEQUENCE IF EXISTS public.seq_s",
		"CREATE SEQUENCE public.seq_s START 4242",
		"CREATE FUNCTION public.seq_peek() RETURNS bigint LANGUAGE sql AS 'SELECT pg_catalog.lastval()'",
		"CREATE VIEW public.seq_v AS SELECT pg_catalog.currval('public.seq_s') AS v",
	} {
		if err := h.cluster.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = h.cluster.Exec(cctx, "DROP VIEW IF EXISTS public.seq_v")
		_ = h.cluster.Exec(cctx, "DROP FUNCTION IF EXISTS public.seq_peek()")
		_ = h.cluster.Exec(cctx, "DROP SEQUENCE IF EXISTS public.seq_s")
	})
	a := pgConnect(ctx, t, h)
	b := pgConnect(ctx, t, h)
	// The catalog is read once the DDL above is seen (CatalogRefresh is
	// an hour: the harness's first login read it after the DDL).

	one := func(c *pgconn.PgConn, extended bool, q string) (string, error) {
		t.Helper()
		var rr *pgconn.ResultReader
		if extended {
			rr = c.ExecParams(ctx, q, nil, nil, nil, nil)
		} else {
			res, err := c.Exec(ctx, q).ReadAll()
			if err != nil {
				return "", err
			}
			return string(res[0].Rows[0][0]), nil
		}
		res := rr.Read()
		if res.Err != nil {
			return "", res.Err
		}
		return string(res.Rows[0][0]), nil
	}
	got, err := one(a, false, "SELECT nextval('seq_s')")
	if err != nil {
		t.Fatal(err)
	}
	if mine, err := one(a, false, "SELECT lastval()"); err != nil || mine != got {
		t.Fatalf("A's own lastval() after its nextval gave %q: %q, %v", got, mine, err)
	}
	discards0 := metricValue(t, reg, "pgquic_pooler_sequence_discards_total", "")
	for _, c := range []struct {
		q        string
		extended bool
	}{
		{"SELECT lastval()", false},
		{"SELECT lastval()", true},
		{"SELECT currval('seq_s')", false},
		{"select CURRVAL ( 'seq_s' )", true},
		{"SELECT seq_peek()", false},
		{"SELECT v FROM seq_v", false},
		{"SELECT seq_peek()", true},
		{"SELECT v FROM seq_v", true},
	} {
		// A's nextval each time, so the connection holds A's value.
		if _, err := one(a, false, "SELECT nextval('seq_s')"); err != nil {
			t.Fatal(err)
		}
		v, err := one(b, c.extended, c.q)
		var pe *pgconn.PgError
		if err == nil {
			t.Errorf("B's %q (extended %v) read %s, left by A's nextval", c.q, c.extended, v)
			continue
		}
		if !errors.As(err, &pe) || pe.Code != "55000" {
			t.Errorf("B's %q (extended %v): %v, want 55000", c.q, c.extended, err)
		}
	}
	if d := metricValue(t, reg, "pgquic_pooler_sequence_discards_total", "") - discards0; d < 8 {
		t.Errorf("%v DISCARD SEQUENCES counted for 8 reads on a connection A used last", d)
	}
	// Both sessions still work, and B's own nextval is its own.
	v, err := one(b, false, "SELECT nextval('seq_s')")
	if err != nil {
		t.Fatal(err)
	}
	if w, err := one(b, true, "SELECT currval('seq_s')"); err != nil || w != v {
		t.Fatalf("B's currval after its own nextval %s: %q, %v", v, w, err)
	}
}
