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
	clusterObjects(ctx, t, h, []string{
		"DROP VIEW IF EXISTS public.seq_v",
		"DROP FUNCTION IF EXISTS public.seq_peek()",
		"DROP SEQUENCE IF EXISTS public.seq_s",
	},
		"CREATE SEQUENCE public.seq_s START 4242",
		"CREATE FUNCTION public.seq_peek() RETURNS bigint LANGUAGE sql AS 'SELECT pg_catalog.lastval()'",
		"CREATE VIEW public.seq_v AS SELECT pg_catalog.currval('public.seq_s') AS v")
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
	// A block keeps the connection past the borrow: a read inside it is
	// checked at its BEGIN, and B's own nextval in it stays B's.
	for _, extended := range []bool{false, true} {
		if _, err := one(a, false, "SELECT nextval('seq_s')"); err != nil {
			t.Fatal(err)
		}
		pgExec(ctx, t, b, "BEGIN")
		_, err := one(b, extended, "SELECT currval('seq_s')")
		notDefined(t, "B's currval inside a block begun after A's nextval", err)
		pgExec(ctx, t, b, "ROLLBACK")
	}
	// B's own value is B's: in its block, and after it.
	ownValue := func(read string) {
		t.Helper()
		v, err := one(b, false, "SELECT nextval('seq_s')")
		if err != nil {
			t.Fatal(err)
		}
		if w, err := one(b, true, read); err != nil || w != v {
			t.Errorf("B's %s after its own nextval %s: %q, %v", read, v, w, err)
		}
	}
	if _, err := one(a, false, "SELECT nextval('seq_s')"); err != nil {
		t.Fatal(err)
	}
	pgExec(ctx, t, b, "BEGIN")
	ownValue("SELECT lastval()")
	pgExec(ctx, t, b, "COMMIT")
	ownValue("SELECT currval('seq_s')")
}

// TestSequenceStateNotSharedPinned: a request that pins its client (here a
// temporary table) keeps the connection for the client's later
// transactions, so it is checked at its borrow: B, pinned after A's
// nextval, never reads A's value in a later transaction.
func TestSequenceStateNotSharedPinned(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, _ := catalogHarness(t, 1, time.Hour)
	clusterObjects(ctx, t, h, []string{"DROP SEQUENCE IF EXISTS public.seq_p"}, "CREATE SEQUENCE public.seq_p START 77")
	a := pgConnect(ctx, t, h)
	b := pgConnect(ctx, t, h)
	pgExec(ctx, t, a, "SELECT nextval('seq_p')")
	pgExec(ctx, t, b, "CREATE TEMP TABLE seq_pin (a int)")
	res, err := b.Exec(ctx, "SELECT lastval()").ReadAll()
	var pe *pgconn.PgError
	if err == nil {
		t.Fatalf("pinned B's lastval() read %s, left by A's nextval", res[0].Rows[0][0])
	}
	if !errors.As(err, &pe) || pe.Code != "55000" {
		t.Fatalf("pinned B's lastval(): %v, want 55000", err)
	}
}

// TestSequenceStateNotSharedBatch: the statements of one extended-protocol
// batch (one Sync) run on the connection borrowed for the first, and those
// of a pipeline (several Syncs in one write) on the connection the client
// still holds, so a later statement that reads sequence state must be seen
// before the batch starts. B, after A's nextval, never reads A's value
// from a later statement of a batch, a later sync segment of a pipeline,
// a prepared statement bound later in a batch, a batch too long to be
// buffered whole, or a statement sent after a Flush; and B's own nextval
// earlier in a batch stays readable by a later statement of it. A batch
// that reads nothing costs no DISCARD.
func TestSequenceStateNotSharedBatch(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, reg := catalogHarness(t, 1, time.Hour)
	clusterObjects(ctx, t, h, []string{"DROP SEQUENCE IF EXISTS public.seq_b"}, "CREATE SEQUENCE public.seq_b START 9000")
	a := pgConnect(ctx, t, h)
	b := pgConnect(ctx, t, h)
	if _, err := b.Prepare(ctx, "seq_rd", "SELECT lastval()", nil); err != nil {
		t.Fatal(err)
	}
	aNext := func() {
		t.Helper()
		pgExec(ctx, t, a, "SELECT nextval('seq_b')")
	}
	batch := func(sqls []string, prepared ...string) ([]*pgconn.Result, error) {
		t.Helper()
		bt := &pgconn.Batch{}
		for _, q := range sqls {
			bt.ExecParams(q, nil, nil, nil, nil)
		}
		for _, name := range prepared {
			bt.ExecPrepared(name, nil, nil, nil)
		}
		res, err := b.ExecBatch(ctx, bt).ReadAll()
		if err != nil {
			return res, err
		}
		for _, r := range res {
			if r.Err != nil {
				return res, r.Err
			}
		}
		return res, nil
	}

	aNext()
	_, err := batch([]string{"SELECT 1", "SELECT currval('seq_b')"})
	notDefined(t, "currval, the second statement of a batch", err)

	aNext()
	_, err = batch([]string{"SELECT 1"}, "seq_rd")
	notDefined(t, "a prepared lastval bound second in a batch", err)

	aNext()
	long := make([]string, 0, 2001)
	for range 2000 {
		long = append(long, "SELECT 1")
	}
	_, err = batch(append(long, "SELECT lastval()"))
	notDefined(t, "lastval at the end of a batch of 2,001 statements", err)

	aNext()
	res, err := batch([]string{"SELECT nextval('seq_b')", "SELECT currval('seq_b')"})
	if err != nil {
		t.Fatalf("B's own nextval and currval in one batch: %v", err)
	}
	if own, read := string(res[0].Rows[0][0]), string(res[1].Rows[0][0]); own != read {
		t.Errorf("B's currval after its own nextval in the same batch: %s, want %s", read, own)
	}

	// A pipeline: two sync segments in one write.
	aNext()
	reads := twoSegments(ctx, t, b, "SELECT 1", "SELECT lastval()")
	if reads[0] != nil {
		t.Fatalf("pipeline results %v", reads)
	}
	notDefined(t, "lastval in the second sync segment of a pipeline", reads[1])

	// A pipeline whose first segment fails: the second still gets no value.
	aNext()
	reads = twoSegments(ctx, t, b, "SELECT 1/0", "SELECT currval('seq_b')")
	var pe *pgconn.PgError
	if !errors.As(reads[0], &pe) || pe.Code != "22012" {
		t.Fatalf("pipeline results %v, want division by zero first", reads)
	}
	notDefined(t, "currval in the sync segment after a failed one", reads[1])

	// A statement prepared and run in one batch, reading nothing: the
	// Bind is judged by the Parse before it, and no DISCARD is sent.
	aNext()
	discards0 := metricValue(t, reg, "pgquic_pooler_sequence_discards_total", "")
	p := b.StartPipeline(ctx)
	p.SendPrepare("seq_one", "SELECT 1", nil)
	p.SendQueryPrepared("seq_one", nil, nil, nil)
	p.SendPipelineSync()
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		r, err := p.GetResults()
		if err != nil {
			t.Fatal(err)
		}
		if rr, ok := r.(*pgconn.ResultReader); ok {
			if err := rr.Read().Err; err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if d := metricValue(t, reg, "pgquic_pooler_sequence_discards_total", "") - discards0; d != 0 {
		t.Errorf("%v DISCARD SEQUENCES for a batch that reads no sequence state", d)
	}

	// A Flush, then the rest of the batch once the first result is in.
	aNext()
	p = b.StartPipeline(ctx)
	p.SendQueryParams("SELECT 1", nil, nil, nil, nil)
	p.SendFlushRequest()
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	r, err := p.GetResults()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.(*pgconn.ResultReader).Read().Err; err != nil {
		t.Fatal(err)
	}
	p.SendQueryParams("SELECT currval('seq_b')", nil, nil, nil, nil)
	p.SendPipelineSync()
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	r, err = p.GetResults()
	if err != nil {
		t.Fatal(err)
	}
	notDefined(t, "currval sent after a Flush, in the same batch", r.(*pgconn.ResultReader).Read().Err)
	if r, err = p.GetResults(); err != nil {
		t.Fatal(err)
	} else if _, ok := r.(*pgconn.PipelineSync); !ok {
		t.Fatalf("after the read: %T, want the Sync", r)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// notDefined fails t unless err is PostgreSQL's 55000 ("not yet defined in
// this session"), what a client reading sequence state another client's
// nextval left must get.
func notDefined(t *testing.T, what string, err error) {
	t.Helper()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "55000" {
		t.Errorf("%s: %v, want 55000 (another client's value must not be read)", what, err)
	}
}

// twoSegments sends q1 and q2 on c as a pipeline of two sync segments in
// one write and returns each query's error (nil when it succeeded).
func twoSegments(ctx context.Context, t *testing.T, c *pgconn.PgConn, q1, q2 string) []error {
	t.Helper()
	p := c.StartPipeline(ctx)
	p.SendQueryParams(q1, nil, nil, nil, nil)
	p.SendPipelineSync()
	p.SendQueryParams(q2, nil, nil, nil, nil)
	p.SendPipelineSync()
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	var errs []error
	for range 4 {
		r, err := p.GetResults()
		var pe *pgconn.PgError
		if errors.As(err, &pe) { // a query failed at its Bind
			errs = append(errs, err)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if rr, ok := r.(*pgconn.ResultReader); ok {
			errs = append(errs, rr.Read().Err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if len(errs) != 2 {
		t.Fatalf("pipeline of two queries gave %d results: %v", len(errs), errs)
	}
	return errs
}
