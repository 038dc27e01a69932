package pooler_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
)

// Adversarial tests of the catalog of code behind names (catalog.go,
// hiddencode): texts and sequences a hostile client A sends so that B, who
// borrows the same only server connection next (pool size 1, transaction
// mode), finds session state A's request changed without the pooler
// knowing; texts that run hidden code yet are pipelined; and ordinary use
// that wedges the pooler or leaves the catalog unknown. Every case asserts
// that B sees the session as A saw it before its request: a case that
// still leaks fails, naming itself.
//
// All objects are named adv_… (or live in the schema adv) and dropped when
// the test ends. The session-changing code sets search_path, work_mem and
// the custom hid.x (which hiddenView reads), takes a session advisory lock
// (keyed by the server process, so that no other session, autovacuum's
// included, can make it wait) and LISTENs, so hiddenView shows it.

// advEvilBody changes every kind of session state hiddenView shows. LISTEN
// is refused in a security-restricted operation (ANALYZE, CLUSTER,
// REINDEX, REFRESH), where the advisory lock still outlives the statement.
const advEvilBody = " PERFORM pg_catalog.set_config('search_path', 'evil', false);" +
	" PERFORM pg_catalog.set_config('work_mem', '7777kB', false);" +
	" PERFORM pg_catalog.set_config('hid.x', 'leak', false);" +
	" PERFORM pg_catalog.pg_advisory_lock(pg_catalog.pg_backend_pid());" +
	" BEGIN EXECUTE 'LISTEN adv_chan'; EXCEPTION WHEN OTHERS THEN NULL; END;"

// advGUCsBody changes only run-time parameters: nothing the probe finds,
// so the client is not pinned for it.
const advGUCsBody = " PERFORM pg_catalog.set_config('search_path', 'evil', false);" +
	" PERFORM pg_catalog.set_config('work_mem', '7777kB', false);" +
	" PERFORM pg_catalog.set_config('hid.x', 'leak', false);"

// advBaseSQL creates the schema adv and the functions every test uses.
var advBaseSQL = []string{
	"DROP SCHEMA IF EXISTS adv CASCADE",
	"CREATE SCHEMA adv",
	"GRANT USAGE ON SCHEMA adv TO PUBLIC",
	"CREATE FUNCTION adv.evil() RETURNS int LANGUAGE plpgsql AS $f$BEGIN" + advEvilBody + " RETURN 1; END$f$",
	"CREATE FUNCTION adv.evil_gucs() RETURNS int LANGUAGE plpgsql AS $f$BEGIN" + advGUCsBody + " RETURN 1; END$f$",
	"CREATE FUNCTION adv.evil_b(int) RETURNS boolean LANGUAGE plpgsql AS $f$BEGIN PERFORM adv.evil(); RETURN true; END$f$",
	"CREATE FUNCTION adv.evil_imm(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $f$BEGIN PERFORM adv.evil(); RETURN $1; END$f$",
	"CREATE FUNCTION adv.evil_trg() RETURNS trigger LANGUAGE plpgsql AS $f$BEGIN PERFORM adv.evil(); RETURN NULL; END$f$",
	"CREATE FUNCTION adv.evil_trg_gucs() RETURNS trigger LANGUAGE plpgsql AS $f$BEGIN PERFORM adv.evil_gucs(); RETURN NULL; END$f$",
}

// advSetup runs setup on c past the pooler, after registering cleanup
// (run in order when the test ends, then the schema adv is dropped), so a
// setup that fails half way is cleaned up too.
func advSetup(ctx context.Context, t *testing.T, c *pgtest.Cluster, setup, cleanup []string) {
	t.Helper()
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, q := range append(append([]string(nil), cleanup...), "DROP SCHEMA IF EXISTS adv CASCADE") {
			if err := c.Exec(cctx, q); err != nil {
				t.Errorf("cleanup %q: %v", q, err)
			}
		}
	})
	for _, q := range append(append([]string(nil), advBaseSQL...), setup...) {
		if err := c.Exec(ctx, q); err != nil {
			t.Fatalf("setup %q: %v", q, err)
		}
	}
}

// advCase is one attack: what A sends, and the view of the session that
// must not change for B (hiddenView when empty).
// advKnownGaps are the cases that still leak, each documented in the
// README ("Hidden code"); the test checks that they do, so that the list
// and the README are brought up to date when one is closed.
var advKnownGaps = map[string]string{
	// The catalog is read again at the next CatalogRefresh (an hour in
	// this test); a function may run DDL anywhere a text calls it.
	"DDL inside a function": "DDL run inside a function is seen at the next catalog read",
}

type advCase struct {
	name string
	run  func(ctx context.Context, t *testing.T, a *pgconn.PgConn) error
	view string
	// prep, when set, runs on A before the pool is full (advPoolFull).
	prep func(ctx context.Context, t *testing.T, a *pgconn.PgConn) error
}

// advRefused runs run and takes a refusal with 0A000 as success.
func advRefused(run func(context.Context, *testing.T, *pgconn.PgConn) error) func(context.Context, *testing.T, *pgconn.PgConn) error {
	return func(ctx context.Context, t *testing.T, a *pgconn.PgConn) error {
		if err := run(ctx, t, a); err != nil && pgCode(err) != "0A000" {
			return err
		}
		return nil
	}
}

func advSimple(qs ...string) func(context.Context, *testing.T, *pgconn.PgConn) error {
	return func(ctx context.Context, _ *testing.T, a *pgconn.PgConn) error {
		for _, q := range qs {
			if _, err := a.Exec(ctx, q).ReadAll(); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	}
}

func advExtended(q string) func(context.Context, *testing.T, *pgconn.PgConn) error {
	return func(ctx context.Context, _ *testing.T, a *pgconn.PgConn) error {
		return a.ExecParams(ctx, q, nil, nil, nil, nil).Read().Err
	}
}

// advConnect connects to url (the harness's own when empty).
func advConnect(ctx context.Context, t *testing.T, h *harness, url string) *pgconn.PgConn {
	t.Helper()
	if url == "" {
		url = h.url()
	}
	c, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// advNextClient runs tc as A on h and then has B, connected to the same
// url, read tc's view: it must be what a fresh client read before A's
// request. If B waits while A holds the only server connection (A was
// pinned), A leaves first and B must find the connection reset.
//
// The view is read before the attack by a client of its own, not by A,
// and A reads its own view only after B: the view's text may itself name
// code behind names (a user-defined = or a table named select), and A's
// reading it would then make the pooler probe and reset A's connection,
// which would hide a leak of A's request.
func advNextClient(ctx context.Context, t *testing.T, h *harness, url, direct string, tc advCase) {
	t.Helper()
	view := tc.view
	if view == "" {
		view = hiddenView
	}
	c0 := advConnect(ctx, t, h, url)
	before := simpleOne(ctx, t, c0, view)
	_ = c0.Close(ctx)
	a := advConnect(ctx, t, h, url)
	if err := tc.run(ctx, t, a); err != nil {
		t.Fatalf("case %q: A: %v", tc.name, err)
	}
	b := advConnect(ctx, t, h, url)
	type res struct {
		v   string
		err error
	}
	got := make(chan res, 1)
	go func() {
		rs, err := b.Exec(ctx, view).ReadAll()
		if err != nil {
			got <- res{err: err}
			return
		}
		got <- res{v: string(rs[len(rs)-1].Rows[0][0])}
	}()
	waitState(t, "B's answer, or B waiting while A holds the connection", func() bool {
		return len(got) > 0 || (hiddenWaiting(h) >= 1 && hiddenHeld(h))
	})
	pinned := len(got) == 0
	if pinned {
		if err := a.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("case %q: B: %v", tc.name, r.err)
	}
	leaked := hiddenState(r.v) != hiddenState(before)
	if why, known := advKnownGaps[tc.name]; known {
		if !leaked {
			t.Errorf("case %q no longer leaks: take it off advKnownGaps and the README (%s)", tc.name, why)
		}
		return
	}
	if leaked {
		t.Errorf("case %q LEAKS from A to B: B sees\n  %s\ninstead of\n  %s\n(A pinned: %v)", tc.name, r.v, before, pinned)
		return
	}
	if pinned {
		return // the pooler found state A's request left
	}
	// No leak and no pin: A's request must still have changed A's
	// session, or the case tests nothing. The pooler may have reset what
	// it could not follow (a custom parameter set_config'd by a domain's
	// CHECK), so A may see its own change undone: then the text is run
	// once more past the pooler, where it must change the session.
	if own := simpleOne(ctx, t, a, view); hiddenState(own) != hiddenState(before) {
		return
	}
	if direct == "" {
		direct = h.cluster.SuperURL("postgres")
	}
	d, err := pgconn.Connect(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	dBefore := simpleOne(ctx, t, d, view)
	if err := tc.run(ctx, t, d); err != nil {
		t.Fatalf("case %q: A's session looks unchanged, and the text run past the pooler failed: %v", tc.name, err)
	}
	if dAfter := simpleOne(ctx, t, d, view); hiddenState(dAfter) == hiddenState(dBefore) {
		t.Fatalf("case %q: the text changes nothing on a session (%q): the case tests nothing", tc.name, dAfter)
	}
}

// advPoolFull is TestHiddenStatePoolFull's sequence for tc: C holds the
// only server connection with a slow query while A's request and then B's
// view wait behind it; B must see nothing of A's.
func advPoolFull(ctx context.Context, t *testing.T, h *harness, tc advCase) {
	t.Helper()
	a, b, c := advConnect(ctx, t, h, ""), advConnect(ctx, t, h, ""), advConnect(ctx, t, h, "")
	if tc.prep != nil {
		if err := tc.prep(ctx, t, a); err != nil {
			t.Fatalf("case %q: A's preparation: %v", tc.name, err)
		}
	}
	before := simpleOne(ctx, t, b, hiddenView)
	v, aErr, pinned := hiddenPoolFullRace(ctx, t, h, a, b, c, func() error { return tc.run(ctx, t, a) })
	if aErr != nil {
		t.Fatalf("case %q: A: %v", tc.name, aErr)
	}
	if hiddenState(v) != hiddenState(before) {
		t.Errorf("case %q LEAKS with the pool full: B sees\n  %s\ninstead of\n  %s\n(A pinned: %v)", tc.name, v, before, pinned)
	}
}

// advLongName is longer than 63 bytes: PostgreSQL keeps its first 63.
var advLongName = "adv_long_" + strings.Repeat("l", 70)

// advMBName is cut by PostgreSQL (UTF8) inside its "é", at 62 bytes.
var advMBName = "adv_" + strings.Repeat("m", 58) + "é" + "zz"

// advMainSetup creates the objects of TestHiddenAdvNextClient and
// TestHiddenAdvPoolFull.
func advMainSetup(ctx context.Context, t *testing.T, c *pgtest.Cluster) {
	t.Helper()
	setup := []string{
		// A domain's DEFAULT: pg_type.typdefaultbin, not in pg_attrdef.
		"CREATE DOMAIN public.adv_ddef AS int DEFAULT adv.evil()",
		// The same, switching to another superuser role: nothing the
		// server reports (is_superuser stays on).
		"DROP ROLE IF EXISTS adv_r",
		"CREATE ROLE adv_r SUPERUSER NOLOGIN",
		"CREATE FUNCTION adv.evil_role() RETURNS int LANGUAGE plpgsql AS $f$BEGIN PERFORM pg_catalog.set_config('role', 'adv_r', false); RETURN 1; END$f$",
		"CREATE DOMAIN public.adv_ddef_role AS int DEFAULT adv.evil_role()",
		"CREATE TABLE public.adv_ddef_role_t (a int, b public.adv_ddef_role)",
		"CREATE TABLE public.adv_ddef_t (a int, b public.adv_ddef)",
		// An operator class whose support function is user code: the
		// hash index calls it for every row inserted.
		"CREATE FUNCTION adv.evil_hash(int4) RETURNS int4 LANGUAGE plpgsql IMMUTABLE AS $f$BEGIN PERFORM adv.evil(); RETURN $1; END$f$",
		"CREATE OPERATOR CLASS adv.adv_hash_ops FOR TYPE int4 USING hash AS OPERATOR 1 =, FUNCTION 1 adv.evil_hash(int4)",
		"CREATE TABLE public.adv_opc_t (a int)",
		"CREATE INDEX adv_opc_idx ON public.adv_opc_t USING hash (a adv.adv_hash_ops)",
		// TRUNCATE … CASCADE reaches a referencing table through a plain
		// (NO ACTION) foreign key.
		"CREATE TABLE public.adv_tp (a int PRIMARY KEY)",
		"CREATE TABLE public.adv_tc (a int REFERENCES public.adv_tp)",
		"CREATE TRIGGER adv_tc_trunc BEFORE TRUNCATE ON public.adv_tc FOR EACH STATEMENT EXECUTE FUNCTION adv.evil_trg()",
		// Index expressions evaluated by utility statements that name no
		// table: ANALYZE, VACUUM ANALYZE, CLUSTER, REINDEX SCHEMA.
		"CREATE TABLE adv.adv_anl (a int)",
		"INSERT INTO adv.adv_anl SELECT pg_catalog.generate_series(1, 10)",
		"CREATE INDEX adv_anl_idx ON adv.adv_anl (adv.evil_imm(a))",
		"CLUSTER adv.adv_anl USING adv_anl_idx",
		// A partition key expression: routing an INSERT into the parent,
		// and checking the partition constraint of a direct INSERT into
		// the partition, evaluate it. The table's own dependency on the
		// function (classid pg_class) is not read.
		"CREATE TABLE public.adv_pk (a int) PARTITION BY RANGE (adv.evil_imm(a))",
		"CREATE TABLE public.adv_pk_1 PARTITION OF public.adv_pk FOR VALUES FROM (0) TO (100)",
		// Extended statistics on an expression: ANALYZE evaluates it.
		"CREATE TABLE public.adv_stx (a int, b int)",
		"INSERT INTO public.adv_stx SELECT i, i FROM pg_catalog.generate_series(1, 100) i",
		"CREATE STATISTICS adv.adv_stx_s ON (adv.evil_imm(a)) FROM public.adv_stx",

		// Objects the catalog should find.
		"CREATE TABLE public.adv_trig (a int)",
		"INSERT INTO public.adv_trig VALUES (1)",
		"CREATE TRIGGER adv_trig AFTER INSERT OR UPDATE OR DELETE ON public.adv_trig FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()",
		"CREATE TABLE public." + advLongName + " (a int)",
		"CREATE TRIGGER adv_long AFTER INSERT ON public." + advLongName + " FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()",
		`CREATE TABLE public."` + advMBName + `" (a int)`,
		`CREATE TRIGGER adv_mb AFTER INSERT ON public."` + advMBName + `" FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()`,
		"CREATE TABLE public.adv_sp (a int)",
		"CREATE TABLE adv.adv_sp (a int)",
		"CREATE TRIGGER adv_sp AFTER INSERT ON adv.adv_sp FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()",
		"CREATE VIEW public.adv_v1 AS SELECT a FROM public.adv_trig",
		"CREATE VIEW public.adv_v2 AS SELECT a FROM public.adv_v1",
		"CREATE VIEW public.adv_vf AS SELECT adv.evil() AS x",
		"CREATE TABLE public.adv_part (a int) PARTITION BY RANGE (a)",
		"CREATE TABLE public.adv_part_1 PARTITION OF public.adv_part FOR VALUES FROM (0) TO (100)",
		"CREATE TRIGGER adv_part_trg AFTER INSERT ON public.adv_part FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()",
		"CREATE TABLE public.adv_part2 (a int) PARTITION BY RANGE (a)",
		"CREATE TABLE public.adv_part2_1 PARTITION OF public.adv_part2 FOR VALUES FROM (0) TO (100)",
		"CREATE TRIGGER adv_part2_1_trg AFTER INSERT ON public.adv_part2_1 FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()",
		"CREATE TABLE public.adv_inh_p (a int)",
		"CREATE TABLE public.adv_inh_c () INHERITS (public.adv_inh_p)",
		"INSERT INTO public.adv_inh_c VALUES (1)",
		"CREATE TRIGGER adv_inh_trg AFTER UPDATE ON public.adv_inh_c FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()",
		"CREATE TABLE public.adv_sd_p (a int PRIMARY KEY)",
		"INSERT INTO public.adv_sd_p VALUES (1), (2), (3)",
		"CREATE TABLE public.adv_sd_c (a int DEFAULT adv.evil() REFERENCES public.adv_sd_p ON DELETE SET DEFAULT)",
		"INSERT INTO public.adv_sd_c VALUES (2), (3)",
		"CREATE TABLE public.adv_trunc (a int)",
		"CREATE TRIGGER adv_trunc_trg AFTER TRUNCATE ON public.adv_trunc FOR EACH STATEMENT EXECUTE FUNCTION adv.evil_trg()",
		"CREATE TABLE public.adv_stmt (a int)",
		"CREATE TRIGGER adv_stmt_trg AFTER UPDATE ON public.adv_stmt FOR EACH STATEMENT EXECUTE FUNCTION adv.evil_trg()",
		"CREATE MATERIALIZED VIEW public.adv_mv AS SELECT adv.evil() AS x",
		"CREATE DOMAIN public.adv_dom AS int CHECK (adv.evil_b(VALUE))",
		"CREATE DOMAIN public.adv_dom2 AS public.adv_dom",
		"CREATE TYPE public.adv_comp AS (a public.adv_dom)",
		"CREATE TABLE public.adv_compt (c public.adv_comp)",
		"CREATE TYPE public.adv_rng AS RANGE (subtype = public.adv_dom, multirange_type_name = public.adv_mrng)",
		"CREATE DOMAIN public.adv_dsc AS text CHECK (pg_catalog.set_config('hid.x', VALUE, false) IS NOT NULL)",
		"CREATE FUNCTION adv.evil_diff(int4, int4) RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $f$BEGIN PERFORM adv.evil(); RETURN ($1 - $2)::float8; END$f$",
		"CREATE TYPE public.adv_rng2 AS RANGE (subtype = int4, subtype_diff = adv.evil_diff)",
		"CREATE TABLE public.adv_rng2_t (r public.adv_rng2)",
		// The index first: a GiST build calling the plpgsql subtype_diff
		// fails inside PostgreSQL (lock BufferContent is not held).
		"CREATE INDEX adv_rng2_gist ON public.adv_rng2_t USING gist (r)",
		"INSERT INTO public.adv_rng2_t SELECT ('[' || i || ',' || i + 1 || ')')::public.adv_rng2 FROM pg_catalog.generate_series(1, 2000) i",
		"CREATE TABLE public.adv_ct (a int)",
		"CREATE CONSTRAINT TRIGGER adv_ct_trg AFTER INSERT ON public.adv_ct DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()",
	}
	cleanup := []string{
		"DROP TABLE IF EXISTS public.adv_ddef_t, public.adv_ddef_role_t, public.adv_pk, public.adv_opc_t, public.adv_tc, public.adv_tp, public.adv_stx," +
			" public.adv_trig, public." + advLongName + `, public."` + advMBName + `", public.adv_sp,` +
			" public.adv_part, public.adv_part2, public.adv_inh_c, public.adv_inh_p, public.adv_sd_c, public.adv_sd_p," +
			" public.adv_trunc, public.adv_stmt, public.adv_compt, public.adv_rng2_t, public.adv_ct CASCADE",
		"DROP MATERIALIZED VIEW IF EXISTS public.adv_mv",
		"DROP VIEW IF EXISTS public.adv_vf",
		"DROP TYPE IF EXISTS public.adv_rng, public.adv_rng2, public.adv_comp CASCADE",
		"DROP DOMAIN IF EXISTS public.adv_ddef, public.adv_ddef_role, public.adv_dom2, public.adv_dom, public.adv_dsc CASCADE",
		"DROP FUNCTION IF EXISTS adv.evil_role()",
		"DROP ROLE IF EXISTS adv_r",
	}
	advSetup(ctx, t, c, setup, cleanup)
}

// advMainCases are texts that name only tables, views, types and
// operators (and utility statements that name nothing), run against
// advMainSetup's objects.
var advMainCases = []advCase{
	// Gaps in what the catalog query reads.
	{name: "domain DEFAULT (INSERT omitting the column)", run: advSimple("INSERT INTO adv_ddef_t (a) VALUES (1)")},
	{name: "domain DEFAULT, extended", run: advExtended("INSERT INTO adv_ddef_t (a) VALUES (1)")},
	{name: "domain DEFAULT switching to another superuser role", run: advSimple("INSERT INTO adv_ddef_role_t (a) VALUES (1)")},
	{name: "operator class support function (hash index)", run: advSimple("INSERT INTO adv_opc_t VALUES (1)")},
	{name: "partition key expression, INSERT into the parent", run: advSimple("INSERT INTO adv_pk VALUES (1)")},
	{name: "partition key expression, INSERT into the partition", run: advSimple("INSERT INTO adv_pk_1 VALUES (1)")},
	{name: "TRUNCATE CASCADE to a NO ACTION referencing table with a TRUNCATE trigger", run: advSimple("TRUNCATE adv_tp CASCADE")},
	{name: "ANALYZE of the database (index expression)", run: advSimple("ANALYZE")},
	{name: "VACUUM ANALYZE of the database (index expression)", run: advSimple("VACUUM ANALYZE")},
	{name: "CLUSTER of every clustered table (index expression)", run: advSimple("CLUSTER")},
	{name: "REINDEX SCHEMA (index expression)", run: advSimple("REINDEX SCHEMA adv")},
	{name: "ANALYZE of a table with expression statistics", run: advSimple("ANALYZE adv_stx")},
	// Cases the catalog is meant to catch.
	{name: "ANALYZE of a table with an expression index", run: advSimple("ANALYZE adv.adv_anl")},
	{name: "schema-qualified quoted name", run: advSimple(`INSERT INTO "public"."adv_trig" VALUES (1)`)},
	{name: "U& escaped name", run: advSimple(`INSERT INTO U&"adv\005ftrig" VALUES (1)`)},
	{name: "name longer than 63 bytes", run: advSimple("INSERT INTO " + advLongName + " VALUES (1)")},
	{name: "name over 63 bytes cut inside a multibyte character", run: advSimple(`INSERT INTO "` + advMBName + `" VALUES (1)`)},
	{name: "search_path picks the schema whose table has a trigger", run: advSimple("SET search_path = adv, public", "INSERT INTO adv_sp VALUES (1)")},
	{name: "auto-updatable view over a table with a trigger", run: advSimple("INSERT INTO adv_v1 VALUES (1)")},
	{name: "view over a view over a table with a trigger", run: advSimple("UPDATE adv_v2 SET a = a")},
	{name: "partition, trigger cloned from the parent", run: advSimple("INSERT INTO adv_part_1 VALUES (1)")},
	{name: "partitioned parent, trigger on the partition", run: advSimple("INSERT INTO adv_part2 VALUES (1)")},
	{name: "inheritance parent, trigger on the child", run: advSimple("UPDATE adv_inh_p SET a = a")},
	{name: "foreign key ON DELETE SET DEFAULT, default calls a function", run: advSimple("DELETE FROM adv_sd_p WHERE a = 2")},
	{name: "MERGE into a table with a trigger", run: advSimple("MERGE INTO adv_trig t USING (VALUES (5)) v(a) ON t.a = v.a WHEN NOT MATCHED THEN INSERT VALUES (v.a)")},
	{name: "COPY FROM into a table with a trigger", run: func(ctx context.Context, _ *testing.T, a *pgconn.PgConn) error {
		_, err := a.CopyFrom(ctx, strings.NewReader("7\n"), "COPY adv_trig FROM STDIN")
		return err
	}},
	{name: "COPY (SELECT from a view) TO", run: func(ctx context.Context, _ *testing.T, a *pgconn.PgConn) error {
		_, err := a.CopyTo(ctx, io.Discard, "COPY (SELECT x FROM adv_vf) TO STDOUT")
		return err
	}},
	{name: "TRUNCATE trigger", run: advSimple("TRUNCATE adv_trunc")},
	{name: "statement-level trigger, no row touched", run: advSimple("UPDATE adv_stmt SET a = a WHERE false")},
	{name: "REFRESH MATERIALIZED VIEW", run: advSimple("REFRESH MATERIALIZED VIEW adv_mv")},
	{name: "domain over a domain", run: advSimple("SELECT 1::adv_dom2")},
	{name: "array of a domain over a domain", run: advSimple("SELECT '{1,2}'::adv_dom2[]")},
	{name: "composite type with a domain field", run: advSimple("SELECT ROW(1)::adv_comp")},
	{name: "table column of a composite type with a domain field", run: advSimple("INSERT INTO adv_compt VALUES (ROW(1))")},
	{name: "range over a domain", run: advSimple("SELECT '[1,3]'::adv_rng")},
	{name: "multirange over a domain", run: advSimple("SELECT '{[1,3]}'::adv_mrng")},
	{name: "domain CHECK calling set_config", run: advSimple("SELECT 'leak'::adv_dsc")},
	// A range beyond every one indexed, so that GiST's penalty has to
	// measure how far it extends the union (subtype_diff).
	{name: "range with a user subtype_diff, GiST insert", run: advSimple(
		"INSERT INTO adv_rng2_t SELECT ('[' || x || ',' || x + 1 || ')')::adv_rng2 FROM (SELECT 100000 + pg_catalog.txid_current()::int AS x) s")},
	{name: "deferred constraint trigger fired by a later COMMIT", run: advSimple("BEGIN", "INSERT INTO adv_ct VALUES (1)", "COMMIT")},
	{name: "deferred constraint trigger fired by SET CONSTRAINTS", run: advSimple("BEGIN", "INSERT INTO adv_ct VALUES (1)", "SET CONSTRAINTS ALL IMMEDIATE", "COMMIT")},
	{name: "cursor over a view, FETCHed by a later message", run: advSimple("BEGIN", "DECLARE adv_cur CURSOR FOR SELECT x FROM adv_vf", "FETCH ALL adv_cur", "COMMIT")},
	{name: "temporary table with a trigger", run: advSimple(
		"CREATE TEMP TABLE adv_tt (a int)",
		"CREATE TRIGGER adv_tt_trg AFTER INSERT ON adv_tt FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()",
		"INSERT INTO adv_tt VALUES (1)")},
}

// TestHiddenAdvNextClient: each of advMainCases, A then B on the only
// server connection.
func TestHiddenAdvNextClient(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 10*time.Minute)
	advMainSetup(ctx, t, cluster)
	for _, tc := range advMainCases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, minPool: 1})
			advNextClient(ctx, t, h, "", "", tc)
		})
	}
}

// TestHiddenAdvKeywordNames: tables named by keywords (reserved, quoted;
// unreserved, bare). They are kept apart from the other cases: a relation
// named select makes every SELECT text name hidden code.
func TestHiddenAdvKeywordNames(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	advSetup(ctx, t, cluster, []string{
		`CREATE TABLE adv."select" (a int)`,
		`CREATE TRIGGER adv_sel AFTER INSERT ON adv."select" FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()`,
		"CREATE TABLE adv.action (a int)",
		"CREATE TRIGGER adv_action AFTER INSERT ON adv.action FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()",
	}, nil)
	advEach(ctx, t, cluster, []advCase{
		{name: "reserved keyword as table name", run: advSimple(`INSERT INTO adv."select" VALUES (1)`)},
		{name: "unreserved keyword as table name", run: advSimple("INSERT INTO adv.action VALUES (1)")},
	})
}

// TestHiddenAdvPoolFull: with the pool full, texts naming code behind
// names must not be pipelined with other clients' requests.
func TestHiddenAdvPoolFull(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 5*time.Minute)
	advMainSetup(ctx, t, cluster)
	for _, tc := range []advCase{
		{name: "trigger (found by the catalog)", run: advSimple("INSERT INTO adv_trig VALUES (1)")},
		{name: "domain DEFAULT", run: advSimple("INSERT INTO adv_ddef_t (a) VALUES (1)")},
		{name: "operator class support function", run: advSimple("INSERT INTO adv_opc_t VALUES (1)")},
		{name: "TRUNCATE CASCADE", run: advSimple("TRUNCATE adv_tp CASCADE")},
		{name: "ANALYZE", run: advSimple("ANALYZE adv_stx")},
		{name: "prepared statement naming a table with a trigger",
			prep: func(ctx context.Context, _ *testing.T, a *pgconn.PgConn) error {
				_, err := a.Prepare(ctx, "adv_pf", "INSERT INTO adv_trig VALUES ($1)", nil)
				return err
			},
			run: func(ctx context.Context, _ *testing.T, a *pgconn.PgConn) error {
				return a.ExecPrepared(ctx, "adv_pf", [][]byte{[]byte("3")}, nil, nil).Read().Err
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, minPool: 1})
			advPoolFull(ctx, t, h, tc)
		})
	}
}

// TestHiddenAdvKeywordOperators: the grammar turns IN, NOT IN, LIKE,
// NULLIF, IS DISTINCT FROM, a simple CASE and BETWEEN into operators it
// looks up by name (=, <>, ~~, >=, <=) on search_path; with user-defined
// ones for (int, text) the text holds no operator symbol at all.
func TestHiddenAdvKeywordOperators(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 5*time.Minute)
	var setup, cleanup []string
	setup = append(setup,
		"CREATE FUNCTION adv.evil_cmp(int, text) RETURNS boolean LANGUAGE plpgsql AS $f$BEGIN PERFORM adv.evil(); RETURN false; END$f$",
		"CREATE FUNCTION adv.evil_plus(int, text) RETURNS int LANGUAGE plpgsql AS $f$BEGIN PERFORM adv.evil(); RETURN $1; END$f$",
		"CREATE OPERATOR public.+ (LEFTARG = int, RIGHTARG = text, FUNCTION = adv.evil_plus)")
	cleanup = append(cleanup, "DROP OPERATOR IF EXISTS public.+ (int, text)")
	for _, op := range []string{"=", "<>", "~~", ">=", "<="} {
		setup = append(setup, "CREATE OPERATOR public."+op+" (LEFTARG = int, RIGHTARG = text, FUNCTION = adv.evil_cmp)")
		cleanup = append(cleanup, "DROP OPERATOR IF EXISTS public."+op+" (int, text)")
	}
	advSetup(ctx, t, cluster, setup, cleanup)
	advEach(ctx, t, cluster, []advCase{
		{name: "IN list uses a user =", run: advSimple("SELECT 1 IN ('x'::text)")},
		{name: "IN subquery uses a user =", run: advSimple("SELECT 1 IN (SELECT 'x'::text)")},
		{name: "NOT IN uses a user <>", run: advSimple("SELECT 1 NOT IN ('x'::text)")},
		{name: "LIKE uses a user ~~", run: advSimple("SELECT 1 LIKE 'x'::text")},
		{name: "NULLIF uses a user =", run: advSimple("SELECT NULLIF(1, 'x'::text)")},
		{name: "IS DISTINCT FROM uses a user =", run: advSimple("SELECT 1 IS DISTINCT FROM 'x'::text")},
		{name: "simple CASE uses a user =", run: advSimple("SELECT CASE 1 WHEN 'x'::text THEN 1 END")},
		{name: "BETWEEN uses a user >= and <=", run: advSimple("SELECT 1 BETWEEN 'a'::text AND 'b'::text")},
		// Symbols in the text: found.
		{name: "user = spelt out", run: advSimple("SELECT 1 = 'x'::text")},
		{name: "user <> spelt !=", run: advSimple("SELECT 1 != 'x'::text")},
		{name: "user + on (int, text)", run: advSimple("SELECT 1 + 'x'::text")},
		{name: "user = through OPERATOR()", run: advSimple("SELECT 1 OPERATOR(public.=) 'x'::text")},
	})
}

// TestHiddenAdvBuiltinCast: a user-defined cast between two built-in
// types, used by an INSERT's assignment and by ::.
func TestHiddenAdvBuiltinCast(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	advSetup(ctx, t, cluster, []string{
		"CREATE FUNCTION adv.evil_d2i(date) RETURNS int4 LANGUAGE plpgsql AS $f$BEGIN PERFORM adv.evil(); RETURN 1; END$f$",
		"CREATE CAST (date AS int4) WITH FUNCTION adv.evil_d2i(date) AS ASSIGNMENT",
		"CREATE TABLE public.adv_castt (a int4)",
	}, []string{
		"DROP TABLE IF EXISTS public.adv_castt",
		"DROP CAST IF EXISTS (date AS int4)",
	})
	advEach(ctx, t, cluster, []advCase{
		{name: "assignment cast in INSERT", run: advSimple("INSERT INTO adv_castt VALUES (current_date)")},
		{name: "explicit cast", run: advSimple("SELECT current_date::int4")},
	})
}

// TestHiddenAdvLexerGaps: texts that name no user object but whose
// function or statement could pass for harmless: a user function that
// shares a harmless built-in's name (its name is a mention), and LOAD
// (refused).
func TestHiddenAdvLexerGaps(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	advSetup(ctx, t, cluster, []string{
		// Overloads a harmless built-in's name in a schema searched
		// after pg_catalog: lower(int) has no pg_catalog candidate.
		"CREATE FUNCTION adv.lower(int) RETURNS int LANGUAGE plpgsql AS $f$BEGIN PERFORM adv.evil(); RETURN $1; END$f$",
	}, nil)
	advEach(ctx, t, cluster, []advCase{
		{name: "user function overloading a harmless built-in's name", run: advSimple("SET search_path = public, adv", "SELECT lower(1)")},
		// LOAD is refused in transaction mode (0A000): nothing reaches B.
		{name: "LOAD of a library that defines parameters", run: advRefused(advSimple("LOAD 'auto_explain'")),
			view: "SELECT COALESCE(pg_catalog.current_setting('auto_explain.log_min_duration', true), '<undefined>')"},
	})
}

// TestHiddenAdvEventTrigger: an event trigger runs user code after DDL
// (and after COMMENT and GRANT, which the lexer does not take for DDL):
// DDL is opaque and its parameters are read back, and with an event
// trigger in the catalog COMMENT, GRANT and the like are mentions.
func TestHiddenAdvEventTrigger(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	advSetup(ctx, t, cluster, []string{
		"CREATE TABLE public.adv_evt_c (a int)",
		"CREATE FUNCTION adv.evil_evt() RETURNS event_trigger LANGUAGE plpgsql AS $f$BEGIN PERFORM adv.evil_gucs(); END$f$",
		"CREATE EVENT TRIGGER adv_evt ON ddl_command_end EXECUTE FUNCTION adv.evil_evt()",
	}, []string{
		"DROP EVENT TRIGGER IF EXISTS adv_evt",
		"DROP TABLE IF EXISTS public.adv_evt_t, public.adv_evt_c",
	})
	advEach(ctx, t, cluster, []advCase{
		{name: "event trigger after CREATE TABLE", run: advSimple("CREATE TABLE public.adv_evt_t (a int)")},
		{name: "event trigger after COMMENT", run: advSimple("COMMENT ON TABLE public.adv_evt_c IS 'adv'")},
		{name: "event trigger after GRANT", run: advSimple("GRANT SELECT ON public.adv_evt_c TO PUBLIC")},
	})
}

// advCatalogKnown waits until a request on c is no longer counted as
// catalog_unknown: the catalog has been read again.
func advCatalogKnown(ctx context.Context, t *testing.T, reg *prometheus.Registry, c *pgconn.PgConn, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, u0 := counts(t, reg)
		pgExec(ctx, t, c, "SELECT 1")
		if _, u1 := counts(t, reg); u1 == u0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the catalog is still unknown 30 s after %s: every request counts as catalog_unknown", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHiddenAdvDDLInvalidation: DDL through the pooler that adds code
// behind a name, in the ways a client may send it. The catalog is not
// read again on a timer here (CatalogRefresh an hour): only invalidation
// can make the new code known.
func TestHiddenAdvDDLInvalidation(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 5*time.Minute)
	tables := []string{"adv_do_t", "adv_fn_t", "adv_ext_t", "adv_blk_t", "adv_late", "adv_one_t", "adv_pipe_t", "adv_ap_c", "adv_ap"}
	var setup []string
	for _, tb := range tables {
		if tb != "adv_ap" {
			setup = append(setup, "CREATE TABLE public."+tb+" (a int)")
		}
	}
	setup = append(setup,
		"CREATE TABLE public.adv_ap (a int) PARTITION BY RANGE (a)",
		"CREATE TRIGGER adv_ap_c_trg AFTER INSERT ON public.adv_ap_c FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()",
		"CREATE FUNCTION adv.mk_trg() RETURNS int LANGUAGE plpgsql AS $f$BEGIN EXECUTE 'CREATE TRIGGER adv_fn_trg AFTER INSERT ON public.adv_fn_t FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()'; RETURN 1; END$f$")
	advSetup(ctx, t, cluster, setup, []string{"DROP TABLE IF EXISTS public." + strings.Join(tables, ", public.") + " CASCADE"})
	trig := func(name, table, fn string) string {
		return "CREATE TRIGGER " + name + " AFTER INSERT ON public." + table + " FOR EACH ROW EXECUTE FUNCTION adv." + fn + "()"
	}
	for _, tc := range []advCase{
		{name: "DDL inside a DO block", run: advSimple(
			"DO $$BEGIN EXECUTE '"+trig("adv_do_trg", "adv_do_t", "evil_trg")+"'; END$$",
			"INSERT INTO adv_do_t VALUES (1)")},
		{name: "DDL inside a function", run: advSimple("SELECT adv.mk_trg()", "INSERT INTO adv_fn_t VALUES (1)")},
		{name: "DDL in the extended protocol", run: func(ctx context.Context, t *testing.T, a *pgconn.PgConn) error {
			if err := a.ExecParams(ctx, trig("adv_ext_trg", "adv_ext_t", "evil_trg"), nil, nil, nil, nil).Read().Err; err != nil {
				return err
			}
			return a.ExecParams(ctx, "INSERT INTO adv_ext_t VALUES (1)", nil, nil, nil, nil).Read().Err
		}},
		{name: "DDL in an explicit block", run: advSimple("BEGIN", trig("adv_blk_trg", "adv_blk_t", "evil_trg"), "COMMIT", "INSERT INTO adv_blk_t VALUES (1)")},
		{name: "ATTACH PARTITION of a table with a trigger", run: advSimple(
			"ALTER TABLE public.adv_ap ATTACH PARTITION public.adv_ap_c FOR VALUES FROM (0) TO (100)",
			"INSERT INTO adv_ap VALUES (1)")},
		{name: "statement prepared before a trigger was added", run: func(ctx context.Context, t *testing.T, a *pgconn.PgConn) error {
			if _, err := a.Prepare(ctx, "adv_late_stmt", "INSERT INTO public.adv_late VALUES ($1)", nil); err != nil {
				return err
			}
			if err := a.ExecPrepared(ctx, "adv_late_stmt", [][]byte{[]byte("1")}, nil, nil).Read().Err; err != nil {
				return err
			}
			if _, err := a.Exec(ctx, trig("adv_late_trg", "adv_late", "evil_trg")).ReadAll(); err != nil {
				return err
			}
			return a.ExecPrepared(ctx, "adv_late_stmt", [][]byte{[]byte("2")}, nil, nil).Read().Err
		}},
		// The trigger only sets parameters, so A is not pinned: the
		// parameters must be read back after the text.
		{name: "DDL and an INSERT firing it in one simple Query", run: advSimple(
			trig("adv_one_trg", "adv_one_t", "evil_trg_gucs") + "; INSERT INTO adv_one_t VALUES (1)")},
		{name: "DDL and an INSERT firing it in one extended-protocol pipeline", run: func(ctx context.Context, t *testing.T, a *pgconn.PgConn) error {
			var b pgconn.Batch
			b.ExecParams(trig("adv_pipe_trg", "adv_pipe_t", "evil_trg_gucs"), nil, nil, nil, nil)
			b.ExecParams("INSERT INTO adv_pipe_t VALUES (1)", nil, nil, nil, nil)
			_, err := a.ExecBatch(ctx, &b).ReadAll()
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, minPool: 1,
				cfg: pooler.Config{Mode: pooler.ModeTransaction, CatalogRefresh: time.Hour}})
			advNextClient(ctx, t, h, "", "", tc)
		})
	}
}

// TestHiddenAdvCatalogRecovers: after ordinary use with DDL (rolled back,
// failing, cut off by a vanishing client, without a Sync, many clients at
// once) the catalog is read again and texts are plain again.
func TestHiddenAdvCatalogRecovers(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 5*time.Minute)
	var drops []string
	for i := range 6 {
		for j := range 4 {
			drops = append(drops, fmt.Sprintf("public.adv_cc_%d_%d", i, j))
		}
	}
	advSetup(ctx, t, cluster, []string{"CREATE TABLE public.adv_rb_t (a int)", "CREATE TABLE public.adv_dup (a int)"},
		[]string{"DROP TABLE IF EXISTS public.adv_rb_t, public.adv_dup, public.adv_mid, public.adv_nosync, " + strings.Join(drops, ", ")})
	direct, err := pgconn.Connect(ctx, cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	newH := func(t *testing.T, size int) (*harness, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		return newHarness(t, harnessOpts{cluster: cluster, poolSize: size, reg: reg,
			cfg: pooler.Config{Mode: pooler.ModeTransaction, CatalogRefresh: time.Hour}}), reg
	}

	t.Run("DDL in an explicit block, then ROLLBACK", func(t *testing.T) {
		h, reg := newH(t, 2)
		a, b := pgConnect(ctx, t, h), pgConnect(ctx, t, h)
		pgExec(ctx, t, a, "BEGIN")
		pgExec(ctx, t, a, "CREATE TRIGGER adv_rb_trg AFTER INSERT ON public.adv_rb_t FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()")
		pgExec(ctx, t, a, "ROLLBACK")
		advCatalogKnown(ctx, t, reg, b, "a rolled-back DDL block")
		n0, u0 := counts(t, reg)
		pgExec(ctx, t, b, "INSERT INTO adv_rb_t VALUES (1)")
		if n1, u1 := counts(t, reg); n1 != n0 || u1 != u0 {
			t.Errorf("after ROLLBACK of the trigger, INSERT counted as hidden code: named +%v, unknown +%v", n1-n0, u1-u0)
		}
	})

	t.Run("DDL failing inside a block", func(t *testing.T) {
		h, reg := newH(t, 2)
		a, b := pgConnect(ctx, t, h), pgConnect(ctx, t, h)
		pgExec(ctx, t, a, "BEGIN")
		if _, err := a.Exec(ctx, "CREATE TABLE public.adv_dup (a int)").ReadAll(); err == nil {
			t.Fatal("CREATE TABLE of an existing table succeeded")
		}
		pgExec(ctx, t, a, "ROLLBACK")
		advCatalogKnown(ctx, t, reg, b, "a DDL block that failed")
	})

	t.Run("client vanishes while its DDL block runs a statement", func(t *testing.T) {
		h, reg := newH(t, 2)
		a, b := pgConnect(ctx, t, h), pgConnect(ctx, t, h)
		aDone := make(chan error, 1)
		go func() {
			_, err := a.Exec(ctx, "BEGIN; CREATE TABLE public.adv_mid (a int); SELECT pg_catalog.pg_sleep(60)").ReadAll()
			aDone <- err
		}()
		waitState(t, "A's pg_sleep to run on the server", func() bool {
			rs, err := direct.Exec(ctx, "SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE state = 'active' AND query LIKE '%adv_mid%pg_sleep%' AND pid <> pg_catalog.pg_backend_pid()").ReadAll()
			return err == nil && string(rs[0].Rows[0][0]) != "0"
		})
		_ = a.Conn().Close() // no Terminate: the client is simply gone
		<-aDone
		advCatalogKnown(ctx, t, reg, b, "the client that ran DDL vanished mid-statement")
	})

	t.Run("extended-protocol DDL without Sync, then the client vanishes", func(t *testing.T) {
		h, reg := newH(t, 2)
		a, b := pgConnect(ctx, t, h), pgConnect(ctx, t, h)
		fe := a.Frontend()
		fe.Send(&pgproto3.Parse{Query: "CREATE TABLE public.adv_nosync (a int)"})
		fe.Send(&pgproto3.Bind{})
		fe.Send(&pgproto3.Execute{})
		fe.Send(&pgproto3.Flush{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			msg, err := fe.Receive()
			if err != nil {
				t.Fatalf("reading the DDL's reply: %v", err)
			}
			if _, ok := msg.(*pgproto3.CommandComplete); ok {
				break
			}
			if e, ok := msg.(*pgproto3.ErrorResponse); ok {
				t.Fatalf("DDL without Sync: %s", e.Message)
			}
		}
		_ = a.Conn().Close()
		advCatalogKnown(ctx, t, reg, b, "a client left with DDL sent but no Sync")
	})

	t.Run("many clients running DDL at once", func(t *testing.T) {
		h, reg := newH(t, 3)
		b := pgConnect(ctx, t, h)
		var wg sync.WaitGroup
		errs := make(chan error, 6)
		for i := range 6 {
			c := pgConnect(ctx, t, h)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 4 {
					name := fmt.Sprintf("public.adv_cc_%d_%d", i, j)
					var err error
					switch (i + j) % 4 {
					case 0:
						_, err = c.Exec(ctx, "BEGIN; CREATE TABLE "+name+" (a int); ROLLBACK").ReadAll()
					case 1:
						for _, q := range []string{"BEGIN", "CREATE TABLE " + name + " (a int)", "COMMIT", "DROP TABLE " + name} {
							if _, err = c.Exec(ctx, q).ReadAll(); err != nil {
								break
							}
						}
					case 2:
						// Fails after the DDL: the implicit transaction rolls back.
						_, _ = c.Exec(ctx, "CREATE TABLE "+name+" (a int); SELECT 1/0").ReadAll()
					case 3:
						if err = c.ExecParams(ctx, "CREATE TABLE "+name+" (a int)", nil, nil, nil, nil).Read().Err; err == nil {
							err = c.ExecParams(ctx, "DROP TABLE "+name, nil, nil, nil, nil).Read().Err
						}
					}
					if err != nil {
						errs <- fmt.Errorf("client %d, round %d: %w", i, j, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		advCatalogKnown(ctx, t, reg, b, "many clients ran DDL at once")
	})
}

// TestHiddenAdvOtherPoolDDL: two pools (two login roles) on one database
// share its catalog watch, so DDL through one pool makes the other's
// texts opaque too; a row security policy reaches the role that is not
// the table's owner.
func TestHiddenAdvOtherPoolDDL(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 3*time.Minute)
	advSetup(ctx, t, cluster, []string{
		"DROP ROLE IF EXISTS adv_u2",
		"CREATE ROLE adv_u2 LOGIN PASSWORD 'postgres'",
		"CREATE TABLE public.adv_xp (a int)",
		"GRANT SELECT, INSERT ON public.adv_xp TO adv_u2",
		"CREATE TABLE public.adv_rls (a int)",
		"INSERT INTO public.adv_rls VALUES (1)",
		"ALTER TABLE public.adv_rls ENABLE ROW LEVEL SECURITY",
		"CREATE POLICY adv_rls_p ON public.adv_rls FOR SELECT USING (adv.evil_b(a))",
		"GRANT SELECT ON public.adv_rls TO adv_u2",
	}, []string{
		"DROP TABLE IF EXISTS public.adv_xp, public.adv_rls",
		"DROP OWNED BY adv_u2",
		"DROP ROLE IF EXISTS adv_u2",
	})
	cfg := pooler.Config{Mode: pooler.ModeTransaction, CatalogRefresh: time.Hour}
	t.Run("row security policy", func(t *testing.T) {
		h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, cfg: cfg})
		advNextClient(ctx, t, h, strings.Replace(h.url(), "postgres:postgres@", "adv_u2:postgres@", 1), cluster.URL("adv_u2", "postgres", "postgres"),
			advCase{name: "row security policy", run: advSimple("SELECT * FROM public.adv_rls")})
	})
	t.Run("trigger added through another pool", func(t *testing.T) {
		h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, cfg: cfg})
		owner := pgConnect(ctx, t, h)
		advNextClient(ctx, t, h, strings.Replace(h.url(), "postgres:postgres@", "adv_u2:postgres@", 1), cluster.URL("adv_u2", "postgres", "postgres"), advCase{
			name: "trigger added through another pool of the same database",
			run: func(ctx context.Context, t *testing.T, a *pgconn.PgConn) error {
				// a's pool read the catalog at a's login, before the trigger.
				pgExec(ctx, t, owner, "CREATE TRIGGER adv_xp_trg AFTER INSERT ON public.adv_xp FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()")
				_, err := a.Exec(ctx, "INSERT INTO adv_xp VALUES (1)").ReadAll()
				return err
			}})
	})
}

// TestHiddenAdvTwoPhaseCommit: DDL in a transaction PREPAREd for
// two-phase commit ends the client's block uncommitted, so a catalog read
// then misses the trigger; COMMIT PREPARED, which makes it live, makes the
// catalog unknown as DDL does.
func TestHiddenAdvTwoPhaseCommit(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{Settings: map[string]string{"max_prepared_transactions": "2"}})
	ctx := testCtx(t, 3*time.Minute)
	advSetup(ctx, t, cluster, []string{"CREATE TABLE public.adv_2pc (a int)"}, []string{"DROP TABLE IF EXISTS public.adv_2pc"})
	reg := prometheus.NewRegistry()
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, reg: reg,
		cfg: pooler.Config{Mode: pooler.ModeTransaction, CatalogRefresh: time.Hour}})
	advNextClient(ctx, t, h, "", "", advCase{
		name: "trigger committed by COMMIT PREPARED",
		run: func(ctx context.Context, t *testing.T, a *pgconn.PgConn) error {
			pgExec(ctx, t, a, "BEGIN")
			pgExec(ctx, t, a, "CREATE TRIGGER adv_2pc_trg AFTER INSERT ON public.adv_2pc FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()")
			pgExec(ctx, t, a, "PREPARE TRANSACTION 'adv_2pc_gid'")
			advCatalogKnown(ctx, t, reg, a, "PREPARE TRANSACTION")
			pgExec(ctx, t, a, "COMMIT PREPARED 'adv_2pc_gid'")
			_, err := a.Exec(ctx, "INSERT INTO adv_2pc VALUES (1)").ReadAll()
			return err
		}})
}

// TestHiddenAdvCatalogHijack: an operator >= (oid, int4) in a schema on
// the pool's search_path would be an exact match for an unqualified
// o.id >= 16384 and beat pg_catalog's >= (oid, oid), so the pooler's own
// read of the catalog would run user code and could hide every name. The
// query writes every operator OPERATOR(pg_catalog.…) and types its
// constants.
func TestHiddenAdvCatalogHijack(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	advSetup(ctx, t, cluster, []string{
		"CREATE TABLE public.adv_hj (a int)",
		"CREATE TRIGGER adv_hj_trg AFTER INSERT ON public.adv_hj FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()",
		"CREATE FUNCTION adv.hj_ge(oid, int4) RETURNS boolean LANGUAGE sql IMMUTABLE STRICT AS" +
			" $f$SELECT CASE WHEN $2 OPERATOR(pg_catalog.=) 16384 THEN false ELSE $1 OPERATOR(pg_catalog.>=) $2::pg_catalog.oid END$f$",
	}, []string{
		"DROP OPERATOR IF EXISTS public.>= (oid, int4)",
		"DROP TABLE IF EXISTS public.adv_hj",
	})
	reg := prometheus.NewRegistry()
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, minPool: 1, reg: reg,
		cfg: pooler.Config{Mode: pooler.ModeTransaction, CatalogRefresh: 50 * time.Millisecond}})
	w := pgConnect(ctx, t, h)
	if err := cluster.Exec(ctx, "CREATE OPERATOR public.>= (LEFTARG = oid, RIGHTARG = int4, FUNCTION = adv.hj_ge)"); err != nil {
		t.Fatal(err)
	}
	// Wait for a read of the catalog that began after the operator
	// existed: it changed the fingerprint, so that read is a full one.
	r0 := metricValue(t, reg, catalogReads, "ok")
	waitState(t, "a full catalog read", func() bool {
		pgExec(ctx, t, w, "SELECT 1")
		return metricValue(t, reg, catalogReads, "ok") >= r0+1
	})
	advNextClient(ctx, t, h, "", "", advCase{name: "catalog query hijacked by a user >= (oid, int4)",
		run: advSimple("INSERT INTO adv_hj VALUES (1)")})
}

// TestHiddenAdvDDLWhileInFlight: B's INSERT is read as plain, then waits
// on the server for a lock while A adds a trigger to the table and
// commits: the INSERT fires the trigger on B's server connection, which
// must then be closed rather than lent on (overlapsDDLLocked).
func TestHiddenAdvDDLWhileInFlight(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	advSetup(ctx, t, cluster, []string{"CREATE TABLE public.adv_race (a int)"}, []string{"DROP TABLE IF EXISTS public.adv_race"})
	direct, err := pgconn.Connect(ctx, cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 2,
		cfg: pooler.Config{Mode: pooler.ModeTransaction, CatalogRefresh: time.Hour}})
	x := pgConnect(ctx, t, h)
	before := simpleOne(ctx, t, x, hiddenView)
	_ = x.Close(ctx)

	a, b := pgConnect(ctx, t, h), pgConnect(ctx, t, h)
	pgExec(ctx, t, a, "BEGIN")
	pgExec(ctx, t, a, "LOCK TABLE public.adv_race IN ACCESS EXCLUSIVE MODE")
	bDone := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, "INSERT INTO adv_race VALUES (1)").ReadAll()
		bDone <- err
	}()
	waitState(t, "B's INSERT to wait for A's lock", func() bool {
		rs, err := direct.Exec(ctx, "SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks WHERE relation = 'public.adv_race'::pg_catalog.regclass AND NOT granted").ReadAll()
		return err == nil && string(rs[0].Rows[0][0]) != "0"
	})
	pgExec(ctx, t, a, "CREATE TRIGGER adv_race_trg AFTER INSERT ON public.adv_race FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()")
	pgExec(ctx, t, a, "COMMIT")
	if err := <-bDone; err != nil {
		t.Fatalf("B: %v", err)
	}
	_ = a.Close(ctx)
	_ = b.Close(ctx)
	waitState(t, "A and B to leave", func() bool { return len(h.pooler.Clients()) == 0 })
	// C1 and C2 hold both server connections at once.
	c1, c2 := pgConnect(ctx, t, h), pgConnect(ctx, t, h)
	v1 := simpleOne(ctx, t, c1, "BEGIN; "+hiddenView)
	v2 := simpleOne(ctx, t, c2, "BEGIN; "+hiddenView)
	pgExec(ctx, t, c1, "ROLLBACK")
	pgExec(ctx, t, c2, "ROLLBACK")
	for _, v := range []string{v1, v2} {
		if hiddenState(v) != hiddenState(before) {
			t.Errorf("case %q LEAKS: a later client sees\n  %s\ninstead of\n  %s", "trigger committed while a plain INSERT waited on the server", v, before)
		}
	}
}

// TestHiddenAdvCatalogReadBlockedByLock: deparsing defaults, constraints,
// index expressions and views (pg_get_expr, pg_get_viewdef) would take
// AccessShareLock on the relation, so a client holding ACCESS EXCLUSIVE on
// such a table (TRUNCATE in a block, a migration's ALTER TABLE) would make
// every catalog read wait, and the request that started it with it; the
// query reads the stored trees instead, which takes no lock.
func TestHiddenAdvCatalogReadBlockedByLock(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	advSetup(ctx, t, cluster, []string{"CREATE TABLE public.adv_lockt (a int DEFAULT 1)"}, []string{"DROP TABLE IF EXISTS public.adv_lockt"})
	direct, err := pgconn.Connect(ctx, cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	reg := prometheus.NewRegistry()
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 2, reg: reg,
		cfg: pooler.Config{Mode: pooler.ModeTransaction, CatalogRefresh: 100 * time.Millisecond}})
	c, b := pgConnect(ctx, t, h), pgConnect(ctx, t, h)
	pgExec(ctx, t, b, "SELECT 1")
	pgExec(ctx, t, c, "BEGIN")
	pgExec(ctx, t, c, "TRUNCATE public.adv_lockt")
	// B's requests, for two seconds: within CatalogRefresh one of them
	// reads the catalog. Each must be answered at once.
	var took time.Duration
	var berr error
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && took < 3*time.Second && berr == nil; {
		bctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		start := time.Now()
		_, berr = b.Exec(bctx, "SELECT 1").ReadAll()
		took = time.Since(start)
		cancel()
	}
	rs, err := direct.Exec(ctx, "SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH owner AS%'").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	waiting := string(rs[0].Rows[0][0])
	pgExec(ctx, t, c, "COMMIT")
	if took >= 3*time.Second || berr != nil {
		t.Errorf("case %q WEDGES: one of B's SELECT 1 took %v (err: %v) while another client held ACCESS EXCLUSIVE on a table with a DEFAULT;"+
			" %s server backends were left waiting on the lock with the catalog query; catalog reads failed: %v",
			"catalog read blocked by a table lock", took.Round(time.Millisecond), berr, waiting, metricValue(t, reg, catalogReads, "failed"))
	}
}

// TestHiddenAdvEncodings: in a database whose encoding is not UTF8, names
// are cut at 63 bytes of the server's encoding, not of the client's
// UTF-8, so the lexer's reading of a long non-ASCII name differs from the
// catalog's; the catalog's names are kept as the lexer would cut them too.
func TestHiddenAdvEncodings(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 3*time.Minute)
	for _, tc := range []struct {
		enc, db, table string
	}{
		// 44 characters: 44 bytes in LATIN1, 84 in UTF-8.
		{"LATIN1", "adv_enc_latin1", "adv_" + strings.Repeat("é", 40)},
		// 62 ASCII bytes then "é": SQL_ASCII cuts at 63 bytes, inside it.
		{"SQL_ASCII", "adv_enc_sqlascii", "adv_" + strings.Repeat("s", 58) + "é" + "zz"},
	} {
		t.Run(tc.enc, func(t *testing.T) {
			t.Cleanup(func() {
				cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := cluster.Exec(cctx, "DROP DATABASE IF EXISTS "+tc.db+" WITH (FORCE)"); err != nil {
					t.Errorf("drop database %s: %v", tc.db, err)
				}
			})
			for _, q := range []string{
				"DROP DATABASE IF EXISTS " + tc.db + " WITH (FORCE)",
				"CREATE DATABASE " + tc.db + " ENCODING '" + tc.enc + "' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
			} {
				if err := cluster.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			d, err := pgconn.Connect(ctx, cluster.SuperURL(tc.db))
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range append(append([]string(nil), advBaseSQL...),
				`CREATE TABLE public."`+tc.table+`" (a int)`,
				`CREATE TRIGGER adv_enc_trg AFTER INSERT ON public."`+tc.table+`" FOR EACH ROW EXECUTE FUNCTION adv.evil_trg()`) {
				if _, err := d.Exec(ctx, q).ReadAll(); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			_ = d.Close(ctx)
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1})
			url := strings.Replace(h.url(), "/postgres?", "/"+tc.db+"?", 1)
			advNextClient(ctx, t, h, url, cluster.SuperURL(tc.db), advCase{name: "long non-ASCII name in a " + tc.enc + " database",
				run: advSimple(`INSERT INTO "` + tc.table + `" VALUES (1)`)})
		})
	}
}

// TestHiddenAdvClientVanishesMidRequest: A leaves while its request, whose
// trigger changes the session, still runs on the server; B, borrowing the
// connection next, must not find what the trigger left.
func TestHiddenAdvClientVanishesMidRequest(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 2*time.Minute)
	advSetup(ctx, t, cluster, []string{
		"CREATE FUNCTION adv.evil_slow_trg() RETURNS trigger LANGUAGE plpgsql AS $f$BEGIN PERFORM adv.evil(); PERFORM pg_catalog.pg_sleep(0.5); RETURN NULL; END$f$",
		"CREATE TABLE public.adv_slow (a int)",
		"CREATE TRIGGER adv_slow_trg AFTER INSERT ON public.adv_slow FOR EACH ROW EXECUTE FUNCTION adv.evil_slow_trg()",
	}, []string{"DROP TABLE IF EXISTS public.adv_slow"})
	direct, err := pgconn.Connect(ctx, cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, minPool: 1})
	c0 := pgConnect(ctx, t, h)
	before := simpleOne(ctx, t, c0, hiddenView)
	_ = c0.Close(ctx)
	a := pgConnect(ctx, t, h)
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Exec(ctx, "INSERT INTO adv_slow VALUES (1)").ReadAll()
		aDone <- err
	}()
	waitState(t, "A's INSERT to run on the server", func() bool {
		rs, err := direct.Exec(ctx, "SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE state = 'active' AND query LIKE 'INSERT INTO adv_slow%'").ReadAll()
		return err == nil && string(rs[0].Rows[0][0]) != "0"
	})
	_ = a.Conn().Close() // gone, without Terminate
	<-aDone
	b := pgConnect(ctx, t, h)
	if v := simpleOne(ctx, t, b, hiddenView); hiddenState(v) != hiddenState(before) {
		t.Errorf("case %q LEAKS: B sees\n  %s\ninstead of\n  %s", "client vanishes while its hidden request runs", v, before)
	}
}

// advEach runs each case with advNextClient on a pool of one connection
// of its own.
func advEach(ctx context.Context, t *testing.T, cluster *pgtest.Cluster, cases []advCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, minPool: 1})
			advNextClient(ctx, t, h, "", "", tc)
		})
	}
}
