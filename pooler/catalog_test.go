package pooler_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/pooler"
)

// The catalog of code behind names (pooler/catalog.go): which texts the
// pooler reads as opaque, and when it reads the catalog again. Each test
// counts pgquic_pooler_hidden_code_requests_total by reason.

const (
	hiddenRequests = "pgquic_pooler_hidden_code_requests_total"
	catalogReads   = "pgquic_pooler_catalog_reads_total"
)

// catalogSetup creates a table with no code behind it, one with a trigger
// that changes the session, and drops both when the test ends.
func catalogSetup(ctx context.Context, t *testing.T, h *harness) {
	t.Helper()
	drop := []string{
		"DROP TABLE IF EXISTS public.cat_plain, public.cat_trig",
		"DROP FUNCTION IF EXISTS public.cat_trg()",
	}
	clusterObjects(ctx, t, h, drop,
		"CREATE TABLE public.cat_plain (a int)",
		"CREATE TABLE public.cat_trig (a int)",
		"CREATE FUNCTION public.cat_trg() RETURNS trigger LANGUAGE plpgsql AS $f$BEGIN"+
			" PERFORM pg_catalog.set_config('cat.x', 'leak', false); RETURN NEW; END$f$",
		"CREATE TRIGGER cat_trg BEFORE INSERT ON public.cat_trig FOR EACH ROW EXECUTE FUNCTION public.cat_trg()")
}

// clusterObjects runs drop, then create, straight on h's cluster, and drop
// again when the test ends.
func clusterObjects(ctx context.Context, t *testing.T, h *harness, drop []string, create ...string) {
	t.Helper()
	for _, q := range append(drop[:len(drop):len(drop)], create...) {
		if err := h.cluster.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, q := range drop {
			_ = h.cluster.Exec(cctx, q)
		}
	})
}

func catalogHarness(t *testing.T, poolSize int, refresh time.Duration) (*harness, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := pooler.Config{Mode: pooler.ModeTransaction, CatalogRefresh: refresh}
	return newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: poolSize, cfg: cfg, reg: reg}), reg
}

func pgExec(ctx context.Context, t *testing.T, c *pgconn.PgConn, q string) {
	t.Helper()
	if _, err := c.Exec(ctx, q).ReadAll(); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func pgConnect(ctx context.Context, t *testing.T, h *harness) *pgconn.PgConn {
	t.Helper()
	c, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// counts returns the hidden-code requests by reason.
func counts(t *testing.T, reg *prometheus.Registry) (named, unknown float64) {
	t.Helper()
	return metricValue(t, reg, hiddenRequests, "named"), metricValue(t, reg, hiddenRequests, "catalog_unknown")
}

// TestCatalogNamesOnlyWhatRunsCode: a text naming the table with no code
// behind it is read as plain, in both protocols and prepared; one naming
// the table with a trigger is opaque, and the next client on the only
// server connection sees none of what the trigger set.
func TestCatalogNamesOnlyWhatRunsCode(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, reg := catalogHarness(t, 1, time.Hour)
	catalogSetup(ctx, t, h)
	a := pgConnect(ctx, t, h)
	if got := metricValue(t, reg, catalogReads, "ok"); got != 1 {
		t.Fatalf("catalog reads after the first login = %v, want 1", got)
	}
	for range 3 {
		pgExec(ctx, t, a, "INSERT INTO cat_plain VALUES (1)")
		if err := a.ExecParams(ctx, "SELECT count(*) FROM cat_plain", nil, nil, nil, nil).Read().Err; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Prepare(ctx, "p", "SELECT a FROM cat_plain", nil); err != nil {
		t.Fatal(err)
	}
	if err := a.ExecPrepared(ctx, "p", nil, nil, nil).Read().Err; err != nil {
		t.Fatal(err)
	}
	if named, unknown := counts(t, reg); named != 0 || unknown != 0 {
		t.Fatalf("texts naming a table with no code behind it counted as hidden code: named %v, unknown %v", named, unknown)
	}

	pgExec(ctx, t, a, "INSERT INTO cat_trig VALUES (1)")
	if err := a.ExecParams(ctx, "INSERT INTO cat_trig VALUES (2)", nil, nil, nil, nil).Read().Err; err != nil {
		t.Fatal(err)
	}
	if named, _ := counts(t, reg); named != 2 {
		t.Fatalf("INSERTs into the table with a trigger counted %v times as hidden code, want 2", named)
	}
	b := pgConnect(ctx, t, h)
	res, err := b.Exec(ctx, "SELECT COALESCE(pg_catalog.current_setting('cat.x', true), '')").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if v := string(res[0].Rows[0][0]); v != "" {
		t.Fatalf("B sees cat.x = %q, set by a trigger A's INSERT fired", v)
	}
}

// TestCatalogDDLThroughPooler: DDL sent through the pooler makes the
// catalog unknown at once (texts are opaque, reason catalog_unknown) until
// it has been read again after the DDL's transaction ended; a trigger
// added that way is found.
func TestCatalogDDLThroughPooler(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, reg := catalogHarness(t, 2, time.Hour)
	catalogSetup(ctx, t, h)
	a := pgConnect(ctx, t, h)
	b := pgConnect(ctx, t, h)
	pgExec(ctx, t, b, "SELECT * FROM cat_plain")
	if named, unknown := counts(t, reg); named != 0 || unknown != 0 {
		t.Fatalf("before DDL: named %v, unknown %v, want 0, 0", named, unknown)
	}

	// A adds a trigger in a block it keeps open: B's texts are opaque
	// meanwhile, since the trigger may be committed before they run.
	pgExec(ctx, t, a, "BEGIN")
	pgExec(ctx, t, a, "CREATE TRIGGER cat_trg2 BEFORE INSERT ON public.cat_plain FOR EACH ROW EXECUTE FUNCTION public.cat_trg()")
	_, before := counts(t, reg)
	pgExec(ctx, t, b, "SELECT * FROM cat_plain")
	pgExec(ctx, t, b, "SELECT 1")
	if _, unknown := counts(t, reg); unknown != before+2 {
		t.Fatalf("while A's DDL is open, B's texts counted %v as catalog_unknown, want 2", unknown-before)
	}
	pgExec(ctx, t, a, "COMMIT")
	// A request after the COMMIT reads the catalog again before it runs,
	// but was read as opaque already (A may hear its COMMIT's answer a
	// moment before the pooler has taken note of it, so it may take two);
	// from then on the trigger is known.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, u0 := counts(t, reg)
		pgExec(ctx, t, b, "SELECT 1")
		if _, u1 := counts(t, reg); u1 == u0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the catalog is still unknown 30 s after the DDL's COMMIT")
		}
	}
	named0, unknown0 := counts(t, reg)
	pgExec(ctx, t, b, "SELECT 1")
	pgExec(ctx, t, b, "INSERT INTO cat_plain VALUES (1)")
	named1, unknown1 := counts(t, reg)
	if unknown1 != unknown0 || named1 != named0+1 {
		t.Fatalf("after the DDL's COMMIT: named +%v, unknown +%v, want +1, +0", named1-named0, unknown1-unknown0)
	}
}

// TestCatalogDDLClientVanishes: a client that leaves inside a block that
// ran DDL does not leave the catalog unknown for good.
func TestCatalogDDLClientVanishes(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, reg := catalogHarness(t, 2, time.Hour)
	catalogSetup(ctx, t, h)
	a := pgConnect(ctx, t, h)
	b := pgConnect(ctx, t, h)
	pgExec(ctx, t, a, "BEGIN")
	pgExec(ctx, t, a, "CREATE TABLE public.cat_gone (a int)")
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Once A's connection is gone, the catalog is read again at B's next
	// request, and B's texts are plain from then on.
	deadline := time.Now().Add(30 * time.Second)
	for {
		pgExec(ctx, t, b, "SELECT * FROM cat_plain")
		_, u0 := counts(t, reg)
		pgExec(ctx, t, b, "SELECT * FROM cat_plain")
		if _, u1 := counts(t, reg); u1 == u0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the catalog is still unknown 30 s after the client that ran DDL left")
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := b.Exec(ctx, "SELECT count(*) FROM pg_catalog.pg_class WHERE relname = 'cat_gone'").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if string(res[0].Rows[0][0]) != "0" {
		t.Fatal("the table created in the vanished client's block exists")
	}
}

// TestCatalogExternalDDL: DDL run past the pooler, straight on the server,
// is seen once the catalog is read again (CatalogRefresh).
func TestCatalogExternalDDL(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, reg := catalogHarness(t, 1, 200*time.Millisecond)
	catalogSetup(ctx, t, h)
	a := pgConnect(ctx, t, h)
	pgExec(ctx, t, a, "INSERT INTO cat_plain VALUES (1)")
	if named, _ := counts(t, reg); named != 0 {
		t.Fatalf("named %v before the trigger exists", named)
	}
	if err := h.cluster.Exec(ctx, "CREATE TRIGGER cat_trg3 BEFORE INSERT ON public.cat_plain FOR EACH ROW EXECUTE FUNCTION public.cat_trg()"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n0, _ := counts(t, reg)
		pgExec(ctx, t, a, "INSERT INTO cat_plain VALUES (1)")
		if n1, _ := counts(t, reg); n1 == n0+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a trigger created on the server directly is still unknown to the pooler after 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCatalogReadFails: when the catalog cannot be read, every text is
// opaque (reason catalog_unknown) and the session still works.
func TestCatalogReadFails(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	cluster := sharedCluster(t)
	// The pool logs in as a role that may not read pg_policy, so the
	// catalog cannot be read.
	for _, q := range []string{
		"DROP TABLE IF EXISTS public.cat_np",
		"DROP ROLE IF EXISTS cat_nopolicy",
		"CREATE ROLE cat_nopolicy LOGIN PASSWORD 'x'",
		"CREATE TABLE public.cat_np (a int)",
		"GRANT SELECT ON public.cat_np TO cat_nopolicy",
		"REVOKE SELECT ON pg_catalog.pg_policy FROM PUBLIC",
	} {
		if err := cluster.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cluster.Exec(cctx, "GRANT SELECT ON pg_catalog.pg_policy TO PUBLIC")
		_ = cluster.Exec(cctx, "DROP TABLE IF EXISTS public.cat_np")
		_ = cluster.Exec(cctx, "DROP ROLE IF EXISTS cat_nopolicy")
	})
	reg := prometheus.NewRegistry()
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, reg: reg,
		cfg:     pooler.Config{Mode: pooler.ModeTransaction, CatalogRefresh: time.Hour},
		backend: cluster.URL("cat_nopolicy", "x", "postgres")})
	c, err := pgconn.Connect(ctx, strings.Replace(h.url(), "postgres:postgres@", "cat_nopolicy:x@", 1))
	if err != nil {
		t.Fatalf("connect as cat_nopolicy: %v", err)
	}
	defer c.Close(context.Background())
	pgExec(ctx, t, c, "SELECT * FROM cat_np")
	pgExec(ctx, t, c, "SELECT 1")
	if got := metricValue(t, reg, catalogReads, "failed"); got != 1 {
		t.Fatalf("catalog reads failed = %v, want 1 (not again before CatalogRefresh)", got)
	}
	if _, unknown := counts(t, reg); unknown != 2 {
		t.Fatalf("texts read while the catalog is unknown counted %v as catalog_unknown, want 2", unknown)
	}
}

// TestCatalogUnknownBegin: while the catalog is unknown (right after DDL)
// every text counts as hidden code, but a lone BEGIN runs no query and is
// not: no parameter read-back follows it inside the block, so SET
// TRANSACTION ISOLATION LEVEL still comes before any query.
func TestCatalogUnknownBegin(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, reg := catalogHarness(t, 1, time.Hour)
	catalogSetup(ctx, t, h)
	a := pgConnect(ctx, t, h)
	pgExec(ctx, t, a, "CREATE TABLE public.cat_begin (a int)")
	t.Cleanup(func() { _ = h.cluster.Exec(context.Background(), "DROP TABLE IF EXISTS public.cat_begin") })
	reads := func() float64 { return metricValue(t, reg, catalogReads, "") }
	r0 := reads()
	_, u0 := counts(t, reg)
	// BEGIN starts the read the DDL made due, in the background; it waits
	// for the pool's one connection, which the block holds, so the catalog
	// stays unknown until COMMIT.
	pgExec(ctx, t, a, "BEGIN")
	pgExec(ctx, t, a, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
	pgExec(ctx, t, a, "INSERT INTO cat_begin VALUES (1)")
	if _, u1 := counts(t, reg); u1 != u0+1 || reads() != r0 {
		t.Fatalf("inside the block: %v texts read as catalog_unknown (want the INSERT alone), catalog reads %v -> %v (want none): the catalog was not unknown, the test tests nothing",
			u1-u0, r0, reads())
	}
	pgExec(ctx, t, a, "COMMIT")
	waitState(t, "the read BEGIN started to end once COMMIT freed the connection", func() bool {
		return metricValue(t, reg, catalogReads, "ok") > 0 && reads() > r0
	})
}

// TestCatalogReadNeverDelaysRequests: a read of the catalog runs on a
// server connection of its own, so no client's request waits for it. The
// test holds a lock the read needs (pg_trigger) until a client's request
// has been answered: had the request waited for the read, it could only
// end when the read gave up (catalogTimeout, 10 s), after this test's
// 5-second bound. Node-postgres' suite saw the wait as a request that
// started after another client's, sent later.
func TestCatalogReadNeverDelaysRequests(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, reg := catalogHarness(t, 2, 50*time.Millisecond)
	catalogSetup(ctx, t, h)
	a := pgConnect(ctx, t, h)
	pgExec(ctx, t, a, "SELECT * FROM cat_plain")

	locker, err := pgconn.Connect(ctx, h.cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	pgExec(ctx, t, locker, "BEGIN")
	pgExec(ctx, t, locker, "LOCK TABLE pg_catalog.pg_trigger IN ACCESS EXCLUSIVE MODE")
	reads0 := metricValue(t, reg, catalogReads, "")

	// Requests go on while the read, once due, waits for the lock.
	blocked := func() bool {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := a.Exec(rctx, "SELECT * FROM cat_plain").ReadAll(); err != nil {
			t.Fatalf("a request while the catalog's read waits for a lock: %v", err)
		}
		// The read's server connection waits for the lock in the read or,
		// when the pool dials it, already while it logs in.
		res, err := locker.Exec(ctx, "SELECT count(*) FROM pg_catalog.pg_stat_activity"+
			" WHERE wait_event_type = 'Lock' AND backend_type = 'client backend'").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		return string(res[0].Rows[0][0]) == "1"
	}
	waitState(t, "a read of the catalog waiting for pg_trigger's lock", blocked)
	for range 3 {
		if !blocked() {
			t.Fatal("the catalog's read stopped waiting for the lock the test holds")
		}
	}
	if got := metricValue(t, reg, catalogReads, ""); got != reads0 {
		t.Fatalf("catalog reads went from %v to %v while one waited for the lock", reads0, got)
	}
	pgExec(ctx, t, locker, "COMMIT")
	waitState(t, "the blocked read to end", func() bool { return metricValue(t, reg, catalogReads, "") > reads0 })
}

// TestCatalogParseFirstAfterDDL: a request read by the catalog before
// DDL changed it closes its connection when it ends (the DDL may have
// added code it then ran), but a session whose first request is a Parse
// has read nothing by the catalog yet. Before 2026-12-07 such a request
// counted as read at the session's start, generation zero, so after any
// DDL in the pooler's life every new session's first Parse (pgbench -M
// prepared, any driver's first prepared statement) closed its connection,
// and on a shared connection (a lane) failed the other clients' requests
// behind it with 08006 (TestPgbench/prepared under load). Now the Parse
// counts from when it was sent: the connection, the only one, is lent on.
func TestCatalogParseFirstAfterDDL(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	h, _ := catalogHarness(t, 1, time.Hour)
	a := pgConnect(ctx, t, h)
	pgExec(ctx, t, a, "DROP TABLE IF EXISTS public.cat_pf")
	pgExec(ctx, t, a, "CREATE TABLE public.cat_pf (x int)")
	t.Cleanup(func() { pgExec(context.Background(), t, a, "DROP TABLE IF EXISTS public.cat_pf") })
	pid := func(res *pgconn.ResultReader) string {
		t.Helper()
		r := res.Read()
		if r.Err != nil || len(r.Rows) != 1 {
			t.Fatalf("pg_backend_pid(): %v (%d rows)", r.Err, len(r.Rows))
		}
		return string(r.Rows[0][0])
	}
	before := pid(a.ExecParams(ctx, "SELECT pg_backend_pid()", nil, nil, nil, nil))
	for i := range 3 {
		b := pgConnect(ctx, t, h)
		if _, err := b.Prepare(ctx, "pf", "SELECT pg_backend_pid() FROM (SELECT count(*) FROM public.cat_pf) s", nil); err != nil {
			t.Fatalf("Prepare: %v", err)
		}
		if got := pid(b.ExecPrepared(ctx, "pf", nil, nil, nil)); got != before {
			t.Fatalf("session %d: its first Parse after DDL closed the server connection (pid %s, was %s)", i, got, before)
		}
		_ = b.Close(ctx)
	}
}
