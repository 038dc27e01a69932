package pooler_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
)

// Hidden session state: client A sends a text whose lexer reading is plain
// (it names only a table, a view, an operator, a type, a domain) while the
// server runs a user function behind it that changes the session: run-time
// parameters, a custom placeholder, an advisory lock, LISTEN, a temporary
// table, a SQL PREPAREd statement, a WITH HOLD cursor and the role. With
// pool size 1, B shares A's only server connection; whatever B sees there
// must be what A saw before its request (or A was pinned, and B sees it
// only after A left and the connection was reset).
//
// A text that names only a table, a view, an operator, a type or a domain
// carrying such code is found by the catalog the pooler reads
// (pooler/catalog.go) and read as opaque: the probe asks the server after
// it, and it never shares a server connection. A role change the server
// reports (is_superuser) during a pipelined request pins A, and A's
// connection is reset when A leaves (TestReportedRoleChangeResetOnLeave).
// The texts that name a function, and the lexing tricks, must not leak.

const hiddenRole = "hid_r"

// hiddenView reads every kind of session state a borrower may inherit, all
// names qualified, since an earlier borrower may have moved search_path.
const hiddenView = "SELECT 'pid=' || pg_catalog.pg_backend_pid()::text" +
	" || ' user=' || current_user || ' session_user=' || session_user" +
	" || ' search_path=' || pg_catalog.current_setting('search_path')" +
	" || ' work_mem=' || pg_catalog.current_setting('work_mem')" +
	" || ' hid.x=' || COALESCE(pg_catalog.current_setting('hid.x', true), '')" +
	" || ' temp=' || (SELECT pg_catalog.count(*) FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema())::text" +
	" || ' advisory=' || (SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid())::text" +
	" || ' listen=' || (SELECT pg_catalog.count(*) FROM pg_catalog.pg_listening_channels())::text" +
	" || ' cursors=' || (SELECT pg_catalog.count(*) FROM pg_catalog.pg_cursors)::text" +
	" || ' prepared=' || (SELECT pg_catalog.count(*) FROM pg_catalog.pg_prepared_statements WHERE from_sql)::text"

// hiddenSetup creates the role, the function that changes the session, and
// the objects that call it without the text naming it.
func hiddenSetup(ctx context.Context, t *testing.T, c *pgtest.Cluster) {
	t.Helper()
	warn := " EXCEPTION WHEN OTHERS THEN RAISE WARNING 'hid: %', SQLERRM; END;"
	setup := []string{
		"DROP ROLE IF EXISTS " + hiddenRole,
		"CREATE ROLE " + hiddenRole + " SUPERUSER NOLOGIN",
		"DROP SCHEMA IF EXISTS hid CASCADE",
		"CREATE SCHEMA hid",
		"CREATE FUNCTION hid.evil() RETURNS int LANGUAGE plpgsql AS $f$BEGIN" +
			" PERFORM pg_catalog.set_config('search_path', 'evil', false);" +
			" PERFORM pg_catalog.set_config('work_mem', '7777kB', false);" +
			" PERFORM pg_catalog.set_config('hid.x', 'leak', false);" +
			" PERFORM pg_catalog.pg_advisory_lock(4242);" +
			" BEGIN EXECUTE 'LISTEN hidchan';" + warn +
			" BEGIN EXECUTE 'CREATE TEMP TABLE IF NOT EXISTS hid_tmp (a int)';" + warn +
			" BEGIN EXECUTE 'PREPARE hid_p AS SELECT 1';" + warn +
			" BEGIN EXECUTE 'DECLARE hid_cur CURSOR WITH HOLD FOR SELECT 1';" + warn +
			" PERFORM pg_catalog.set_config('role', '" + hiddenRole + "', false);" +
			" RETURN 1; END$f$",
		"CREATE FUNCTION hid.evil_norole() RETURNS int LANGUAGE plpgsql AS $f$BEGIN" +
			" PERFORM pg_catalog.set_config('search_path', 'evil', false);" +
			" PERFORM pg_catalog.set_config('hid.x', 'leak', false);" +
			" PERFORM pg_catalog.pg_advisory_lock(4242);" +
			" EXECUTE 'LISTEN hidchan'; RETURN 1; END$f$",
		"CREATE FUNCTION hid.evil_trg_norole() RETURNS trigger LANGUAGE plpgsql AS $f$BEGIN PERFORM hid.evil_norole(); RETURN OLD; END$f$",
		// A role without SUPERUSER: switching to it changes is_superuser,
		// which the server reports.
		"DROP ROLE IF EXISTS " + hiddenRole + "_nosu",
		"CREATE ROLE " + hiddenRole + "_nosu NOLOGIN",
		"GRANT USAGE ON SCHEMA hid TO " + hiddenRole + "_nosu",
		"CREATE FUNCTION hid.evil_nosu() RETURNS int LANGUAGE plpgsql AS $f$BEGIN" +
			" PERFORM pg_catalog.set_config('role', '" + hiddenRole + "_nosu', false); RETURN 1; END$f$",
		"CREATE FUNCTION hid.evil_b(int) RETURNS boolean LANGUAGE plpgsql AS $f$BEGIN PERFORM hid.evil(); RETURN true; END$f$",
		"CREATE FUNCTION hid.evil_imm(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $f$BEGIN PERFORM hid.evil(); RETURN $1; END$f$",
		"CREATE FUNCTION hid.evil_trg() RETURNS trigger LANGUAGE plpgsql AS $f$BEGIN PERFORM hid.evil(); RETURN NEW; END$f$",
		"CREATE FUNCTION hid.evil_op(int, int) RETURNS int LANGUAGE plpgsql AS $f$BEGIN PERFORM hid.evil(); RETURN $1 + $2; END$f$",
		// Objects in public, so that unqualified texts find them.
		"DROP TABLE IF EXISTS public.hid_trig, public.hid_rule, public.hid_rule_log, public.hid_def, public.hid_chk, public.hid_gen, public.hid_idx, public.hid_fk_parent, public.hid_fk_child CASCADE",
		"DROP VIEW IF EXISTS public.hid_v",
		"DROP DOMAIN IF EXISTS public.hid_dom",
		"CREATE TABLE public.hid_trig (a int)",
		"CREATE TRIGGER hid_trig BEFORE INSERT OR UPDATE OR DELETE ON public.hid_trig FOR EACH ROW EXECUTE FUNCTION hid.evil_trg()",
		"CREATE VIEW public.hid_v AS SELECT hid.evil() AS x",
		"CREATE TABLE public.hid_rule (a int)",
		"CREATE TABLE public.hid_rule_log (a int)",
		"CREATE RULE hid_rule AS ON INSERT TO public.hid_rule DO ALSO INSERT INTO public.hid_rule_log SELECT hid.evil()",
		"CREATE TABLE public.hid_def (a int, b int DEFAULT hid.evil())",
		"CREATE TABLE public.hid_chk (a int CHECK (hid.evil_b(a)))",
		"CREATE TABLE public.hid_gen (a int, b int GENERATED ALWAYS AS (hid.evil_imm(a)) STORED)",
		"CREATE TABLE public.hid_idx (a int)",
		"CREATE INDEX ON public.hid_idx (hid.evil_imm(a))",
		"CREATE DOMAIN public.hid_dom AS int CHECK (hid.evil_b(VALUE))",
		"CREATE OPERATOR public.### (LEFTARG = int, RIGHTARG = int, FUNCTION = hid.evil_op)",
		"CREATE FUNCTION hid.evil_sfunc(int, int) RETURNS int LANGUAGE plpgsql AS $f$BEGIN PERFORM hid.evil(); RETURN COALESCE($1, 0) + $2; END$f$",
		"CREATE AGGREGATE public.hid_agg(int) (SFUNC = hid.evil_sfunc, STYPE = int)",
		"CREATE FUNCTION public.hid_srf() RETURNS SETOF int LANGUAGE plpgsql AS $f$BEGIN PERFORM hid.evil(); RETURN NEXT 1; END$f$",
		"DROP TYPE IF EXISTS public.hid_ty CASCADE",
		"CREATE TYPE public.hid_ty AS (a int)",
		"CREATE FUNCTION hid.evil_cast(int) RETURNS public.hid_ty LANGUAGE plpgsql AS $f$BEGIN PERFORM hid.evil(); RETURN ROW($1)::public.hid_ty; END$f$",
		"CREATE CAST (int AS public.hid_ty) WITH FUNCTION hid.evil_cast(int) AS ASSIGNMENT",
		"DROP TABLE IF EXISTS public.hid_casttab",
		"CREATE TABLE public.hid_casttab (c public.hid_ty)",
		"CREATE TABLE public.hid_fk_parent (a int PRIMARY KEY)",
		"CREATE TABLE public.hid_fk_child (a int REFERENCES public.hid_fk_parent ON DELETE CASCADE)",
		"CREATE TRIGGER hid_fk BEFORE DELETE ON public.hid_fk_child FOR EACH ROW EXECUTE FUNCTION hid.evil_trg_norole()",
		"DROP VIEW IF EXISTS public.hid_v_nosu, public.hid_settings",
		"CREATE VIEW public.hid_v_nosu AS SELECT hid.evil_nosu() AS x",
		"CREATE VIEW public.hid_settings AS SELECT name, setting FROM pg_catalog.pg_settings",
		"INSERT INTO public.hid_fk_parent VALUES (1), (2), (3), (4), (5), (6), (7), (8)",
		"INSERT INTO public.hid_fk_child VALUES (1), (2), (3), (4), (5), (6), (7), (8)",
	}
	for _, q := range setup {
		if err := c.Exec(ctx, q); err != nil {
			t.Fatalf("setup %q: %v", q, err)
		}
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, q := range []string{
			"DROP TABLE IF EXISTS public.hid_trig, public.hid_rule, public.hid_rule_log, public.hid_def, public.hid_chk, public.hid_gen, public.hid_idx, public.hid_fk_child, public.hid_fk_parent CASCADE",
			"DROP VIEW IF EXISTS public.hid_v, public.hid_v_nosu, public.hid_settings",
			"DROP DOMAIN IF EXISTS public.hid_dom CASCADE",
			"DROP TABLE IF EXISTS public.hid_casttab",
			"DROP TYPE IF EXISTS public.hid_ty CASCADE",
			"DROP AGGREGATE IF EXISTS public.hid_agg(int)",
			"DROP FUNCTION IF EXISTS public.hid_srf()",
			"DROP SCHEMA IF EXISTS hid CASCADE",
			"DROP ROLE IF EXISTS " + hiddenRole,
			"DROP ROLE IF EXISTS " + hiddenRole + "_nosu",
		} {
			if err := c.Exec(cctx, q); err != nil {
				t.Errorf("cleanup %q: %v", q, err)
			}
		}
	})
}

// hiddenAttack is what client A sends.
type hiddenAttack struct {
	name string
	run  func(ctx context.Context, a *pgconn.PgConn) error
	// lexer marks texts the pooler can read: it may refuse them (0A000),
	// or they may change nothing on the server.
	lexer bool
}

func hiddenSimple(q string) func(context.Context, *pgconn.PgConn) error {
	return func(ctx context.Context, a *pgconn.PgConn) error {
		_, err := a.Exec(ctx, q).ReadAll()
		return err
	}
}

func hiddenExtended(q string) func(context.Context, *pgconn.PgConn) error {
	return func(ctx context.Context, a *pgconn.PgConn) error {
		return a.ExecParams(ctx, q, nil, nil, nil, nil).Read().Err
	}
}

func hiddenPrepared(q string) func(context.Context, *pgconn.PgConn) error {
	return func(ctx context.Context, a *pgconn.PgConn) error {
		if _, err := a.Prepare(ctx, "hid_stmt", q, nil); err != nil {
			return err
		}
		return a.ExecPrepared(ctx, "hid_stmt", nil, nil, nil).Read().Err
	}
}

func hiddenCopy(q string) func(context.Context, *pgconn.PgConn) error {
	return func(ctx context.Context, a *pgconn.PgConn) error {
		_, err := a.CopyTo(ctx, io.Discard, q)
		return err
	}
}

// hiddenAttacks are texts whose statements name no user function.
var hiddenAttacks = []hiddenAttack{
	{"trigger on INSERT", hiddenSimple("INSERT INTO hid_trig VALUES (1)"), false},
	{"trigger on INSERT, extended", hiddenExtended("INSERT INTO hid_trig VALUES (1)"), false},
	{"trigger on INSERT, prepared", hiddenPrepared("INSERT INTO hid_trig VALUES (1)"), false},
	{"trigger on UPDATE in explicit block", hiddenSimple("BEGIN; UPDATE public.hid_trig SET a = a; INSERT INTO public.hid_trig VALUES (2); COMMIT"), false},
	{"trigger via ON DELETE CASCADE", hiddenSimple("DELETE FROM hid_fk_parent WHERE a = 1"), false},
	{"view", hiddenSimple("SELECT * FROM hid_v"), false},
	{"view, TABLE", hiddenSimple("TABLE hid_v"), false},
	{"view, extended", hiddenExtended("SELECT x FROM hid_v"), false},
	{"view in CTE", hiddenSimple("WITH c AS (SELECT * FROM public.hid_v) SELECT count(*) FROM c"), false},
	{"view in COPY TO", hiddenCopy("COPY (SELECT * FROM hid_v) TO STDOUT"), false},
	{"second statement of a Query", hiddenSimple("SELECT 1; SELECT x FROM hid_v"), false},
	{"rule", hiddenSimple("INSERT INTO hid_rule VALUES (1)"), false},
	{"column DEFAULT", hiddenSimple("INSERT INTO hid_def (a) VALUES (1)"), false},
	{"column DEFAULT VALUES, extended", hiddenExtended("INSERT INTO hid_def DEFAULT VALUES"), false},
	{"CHECK constraint", hiddenSimple("INSERT INTO hid_chk VALUES (1)"), false},
	{"generated column", hiddenSimple("INSERT INTO hid_gen (a) VALUES (1)"), false},
	{"index expression", hiddenSimple("INSERT INTO hid_idx VALUES (1)"), false},
	{"domain CHECK", hiddenSimple("SELECT 1::hid_dom"), false},
	{"domain CHECK, CAST", hiddenExtended("SELECT CAST(1 AS public.hid_dom)"), false},
	{"user operator", hiddenSimple("SELECT 1 ### 2"), false},
	{"user operator, OPERATOR()", hiddenSimple("SELECT 1 OPERATOR(public.###) 2"), false},
	{"user operator, extended", hiddenExtended("SELECT 1 ### 2"), false},
	{"user cast, ::", hiddenSimple("SELECT (1::hid_ty).a"), false},
	{"user cast, CAST", hiddenExtended("SELECT CAST(1 AS public.hid_ty)"), false},
	{"user cast, assignment in INSERT", hiddenSimple("INSERT INTO hid_casttab VALUES (1)"), false},
	// Function names in the text: the lexer sees a call it cannot vouch for.
	{"user aggregate", hiddenSimple("SELECT hid_agg(x) FROM generate_series(1, 2) x"), false},
	{"set-returning function in FROM", hiddenSimple("SELECT * FROM hid_srf()"), false},
	{"user function in CTE", hiddenSimple("WITH c AS (SELECT hid.evil()) SELECT * FROM c"), false},
	{"user function in VALUES", hiddenSimple("SELECT * FROM (VALUES (hid.evil())) v"), false},
	{"user function in VALUES, extended", hiddenExtended("SELECT * FROM (VALUES (hid.evil())) v"), false},
	{"view over pg_settings", hiddenSimple("UPDATE hid_settings SET setting = 'evil' WHERE name = 'search_path'"), false},

	// Texts the lexer reads: quoting and lexing tricks.
	{"U& identifier set_config", hiddenSimple(`SELECT U&"\0073et_config"('search_path', 'evil', false)`), true},
	{"quoted set_config", hiddenSimple(`SELECT pg_catalog."set_config"('search_path', 'evil', false)`), true},
	{"set_config name from VALUES", hiddenSimple("SELECT set_config(n, 'evil', false) FROM (VALUES ('search_path')) t(n)"), true},
	{"set_config name from VALUES, custom", hiddenSimple("SELECT set_config(n, 'leak', false) FROM (VALUES ('hid.x')) t(n)"), true},
	{"nested comment then SET", hiddenSimple("/* a /* b */ SELECT 1; */ SET search_path = evil"), true},
	{"SET after string with backslash", hiddenSimple(`SELECT 'a\'; SET search_path = evil; SELECT '--'`), true},
	{"SET after E string", hiddenSimple(`SELECT E'a\\'; SET search_path = evil`), true},
	{"SET after dollar quote", hiddenSimple("SELECT $a$ $$ ; $a$; SET search_path = evil"), true},
	{"SET after dollar quote with tag digits", hiddenSimple("SELECT $q1$x$q1$; SET search_path = evil"), true},
	{"set_config in second statement", hiddenSimple("SELECT 1; SELECT pg_catalog.set_config('hid.x', 'leak', false)"), true},
	{"SET hidden in a string then run", hiddenSimple("SELECT 'SET search_path = evil'; SET work_mem = '7777kB'"), true},
	{"UPDATE pg_settings alias", hiddenSimple("UPDATE pg_catalog.pg_settings AS s SET setting = 'evil' WHERE s.name = 'search_path'"), true},
	{"UPDATE quoted pg_settings", hiddenSimple(`UPDATE "pg_catalog"."pg_settings" SET setting = 'evil' WHERE name = 'search_path'`), true},
	{"pg_settings in a data-modifying CTE", hiddenSimple("WITH u AS (UPDATE pg_settings SET setting = 'evil' WHERE name = 'search_path' RETURNING 1) SELECT count(*) FROM u"), true},
	{"advisory lock, quoted name", hiddenSimple(`SELECT "pg_advisory_lock"(4242)`), true},
	{"advisory lock in FROM", hiddenSimple(`SELECT * FROM pg_catalog.pg_advisory_lock(4242)`), true},
	{"advisory lock, U& name", hiddenSimple(`SELECT U&"pg_advisory_\006Cock"(4242)`), true},
	{"LISTEN, odd case and comment", hiddenSimple("/**/LiStEn/**/hidchan"), true},
	{"PREPARE after comment", hiddenSimple("-- x\nPREPARE hid_p AS SELECT 1"), true},
	{"DECLARE WITH HOLD in block", hiddenSimple("BEGIN; DECLARE hid_cur CURSOR WITH HOLD FOR SELECT 1; COMMIT"), true},
	{"temp table via SELECT INTO in second statement", hiddenSimple("SELECT 1; SELECT 1 AS a INTO TEMP hid_tmp2"), true},
	{"set_config in a CTE", hiddenSimple("WITH c AS (SELECT pg_catalog.set_config('hid.x', 'leak', false)) SELECT * FROM c"), true},
	{"set_config in VALUES", hiddenSimple("SELECT * FROM (VALUES (pg_catalog.set_config('hid.x', 'leak', false))) v"), true},
	{"set_config, extended, after error in earlier Query", func(ctx context.Context, a *pgconn.PgConn) error {
		_, _ = a.Exec(ctx, "SELECT 1/0; SET search_path = evil").ReadAll()
		return a.ExecParams(ctx, "SELECT pg_catalog.set_config('hid.x', 'leak', false)", nil, nil, nil, nil).Read().Err
	}, true},
}

// checkHiddenLeak compares what B saw with what it should have seen: the
// same session as before A's request.
func checkHiddenLeak(t *testing.T, got, want, detail string) {
	t.Helper()
	if hiddenState(got) != hiddenState(want) {
		t.Errorf("B sees\n  %s\ninstead of\n  %s\n%s", got, want, detail)
	}
}

// TestHiddenStateNextClient: A runs the text and stays connected; B, on
// the same only server connection, must see the session as A saw it
// before. If B is still waiting once A's request is done (A was pinned), A
// leaves and B must then find the connection reset.
func TestHiddenStateNextClient(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 5*time.Minute)
	hiddenSetup(ctx, t, cluster)
	for _, tc := range hiddenAttacks {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, minPool: 1})
			a, err := pgconn.Connect(ctx, h.url())
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(context.Background())
			before := simpleOne(ctx, t, a, hiddenView)
			if err := tc.run(ctx, a); err != nil {
				if !tc.lexer {
					t.Fatalf("A: %v", err)
				}
				t.Logf("A: %v", err)
			}
			// A's own view afterwards: the attack really changed the session
			// (otherwise the case tests nothing).
			own := simpleOne(ctx, t, a, hiddenView)
			if own == before && !tc.lexer {
				t.Fatalf("A's request changed nothing on its session (%q); the case tests nothing", own)
			}
			b, err := pgconn.Connect(ctx, h.url())
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close(context.Background())
			type res struct {
				v   string
				err error
			}
			got := make(chan res, 1)
			go func() {
				rs, err := b.Exec(ctx, hiddenView).ReadAll()
				if err != nil {
					got <- res{err: err}
					return
				}
				got <- res{v: string(rs[0].Rows[0][0])}
			}()
			// Either B is answered, or it waits for the only connection
			// while A holds it (A was pinned): then A leaves, and B gets
			// the connection after its reset. Caught in the moment before
			// A's release, A leaves too, which changes nothing for B: a
			// connection A has let go of is not reset on A's leaving.
			waitState(t, "B's answer, or B waiting while A holds the connection", func() bool {
				return len(got) > 0 || (hiddenWaiting(h) >= 1 && hiddenHeld(h))
			})
			var r res
			pinned := len(got) == 0
			if pinned {
				if err := a.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
			r = <-got
			if r.err != nil {
				t.Fatalf("B: %v", r.err)
			}
			checkHiddenLeak(t, r.v, before,
				fmt.Sprintf("(A pinned: %v; A saw after its request\n  %s)", pinned, own))
		})
	}
}

// hiddenState is a view without its server process ID: a connection reset
// after a pinned client may be a new process.
func hiddenState(v string) string {
	if i := strings.Index(v, " user="); i >= 0 {
		return v[i:]
	}
	return v
}

// TestReportedRoleChangeResetOnLeave: A switches to a role without
// SUPERUSER, which the server reports (is_superuser), by a view the text
// only names, by a user function and by DO. A is pinned for it; once A
// leaves, the connection must be reset before B borrows it: B runs as its
// own login role.
func TestReportedRoleChangeResetOnLeave(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	hiddenSetup(ctx, t, cluster)
	for _, tc := range []struct{ name, sql string }{
		{"view", "SELECT * FROM hid_v_nosu"},
		{"user function", "SELECT hid.evil_nosu()"},
		{"DO", "DO $$BEGIN PERFORM pg_catalog.set_config('role', '" + hiddenRole + "_nosu', false); END$$"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, minPool: 1, reg: reg})
			a, err := pgconn.Connect(ctx, h.url())
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(context.Background())
			before := simpleOne(ctx, t, a, hiddenView)
			if _, err := a.Exec(ctx, tc.sql).ReadAll(); err != nil {
				t.Fatalf("A: %v", err)
			}
			if got := simpleOne(ctx, t, a, "SELECT current_user"); got != hiddenRole+"_nosu" {
				t.Fatalf("A: current_user = %q, want %q", got, hiddenRole+"_nosu")
			}
			if n := metricValue(t, reg, "pgquic_pooler_pins_total", "role"); n != 1 {
				t.Errorf("pins_total{reason=role} = %v after A's role change, want 1", n)
			}
			if err := a.Close(ctx); err != nil {
				t.Fatal(err)
			}
			b, err := pgconn.Connect(ctx, h.url())
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close(context.Background())
			if got := simpleOne(ctx, t, b, hiddenView); hiddenState(got) != hiddenState(before) {
				t.Errorf("B after A left sees\n  %s\nA saw before\n  %s", got, before)
			}
		})
	}
}

// hiddenWaiting counts the sessions waiting for a server connection.
func hiddenWaiting(h *harness) int {
	n := 0
	for _, ci := range h.pooler.Clients() {
		if ci.State == pooler.ClientWaiting {
			n++
		}
	}
	return n
}

// hiddenHeld reports whether a session holds a server connection (state
// active): once A's request has been answered, a pinned A between its
// requests, or A in the moment before its release.
func hiddenHeld(h *harness) bool {
	for _, ci := range h.pooler.Clients() {
		if ci.State == pooler.ClientActive && ci.ServerPID != 0 {
			return true
		}
	}
	return false
}

// TestHiddenStatePoolFull: with pool size 1, C holds the only server
// connection with a slow query while A's request and then B's view queue
// behind it; when C is done A runs first, and B must still see nothing of
// A's: A's session state pins A (B gets the connection only once A left
// and it was reset) and A's parameters are undone before B's turn.
func TestHiddenStatePoolFull(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 5*time.Minute)
	hiddenSetup(ctx, t, cluster)
	for _, tc := range []hiddenAttack{
		{"user function", hiddenSimple("SELECT hid.evil()"), false},
		{"user function, extended", hiddenExtended("SELECT hid.evil()"), false},
		{"user function in second statement", hiddenSimple("SELECT 1; SELECT hid.evil()"), false},
		{"DO", hiddenSimple("DO $$BEGIN PERFORM hid.evil(); END$$"), false},
		{"SET", hiddenSimple("SET search_path = evil"), false},
		{"set_config custom", hiddenSimple("SELECT pg_catalog.set_config('hid.x', 'leak', false)"), false},
		{"advisory lock", hiddenSimple("SELECT pg_catalog.pg_advisory_lock(4242)"), false},
		{"LISTEN", hiddenSimple("LISTEN hidchan"), false},
		{"temp table", hiddenSimple("CREATE TEMP TABLE hid_tmp3 (a int)"), false},
		{"view", hiddenSimple("SELECT * FROM hid_v"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, minPool: 1})
			conn := func() *pgconn.PgConn {
				c, err := pgconn.Connect(ctx, h.url())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close(context.Background()) })
				return c
			}
			a, b, c := conn(), conn(), conn()
			before := simpleOne(ctx, t, b, hiddenView)
			v, aErr, pinned := hiddenPoolFullRace(ctx, t, h, a, b, c, func() error { return tc.run(ctx, a) })
			if aErr != nil {
				t.Logf("A: %v", aErr)
			}
			checkHiddenLeak(t, v, before, fmt.Sprintf("(A pinned: %v)", pinned))
		})
	}
}

// hiddenPoolFullRace runs A's request (run) on the pool's only connection
// while B waits for it, C holding the pool full with a slow query first,
// and returns what B's hiddenView saw, A's error, and whether A
// was pinned: B, waiting, is answered once A's request released the
// connection, or A keeps it (A was pinned), and then A leaves and B gets
// the connection after its reset.
func hiddenPoolFullRace(ctx context.Context, t *testing.T, h *harness, a, b, c *pgconn.PgConn, run func() error) (string, error, bool) {
	t.Helper()
	cDone := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "SELECT pg_catalog.pg_sleep(0.3)").ReadAll()
		cDone <- err
	}()
	waitState(t, "C's slow query to run", func() bool {
		for _, ci := range h.pooler.Clients() {
			if ci.State == pooler.ClientActive {
				return true
			}
		}
		return false
	})
	aDone := make(chan error, 1)
	go func() { aDone <- run() }()
	waitState(t, "A to wait", func() bool { return hiddenWaiting(h) >= 1 })
	type res struct {
		v   string
		err error
	}
	bDone := make(chan res, 1)
	go func() {
		rs, err := b.Exec(ctx, hiddenView).ReadAll()
		if err != nil {
			bDone <- res{err: err}
			return
		}
		bDone <- res{v: string(rs[0].Rows[0][0])}
	}()
	waitState(t, "B to wait", func() bool { return hiddenWaiting(h) >= 2 || len(bDone) > 0 })
	if err := <-cDone; err != nil {
		t.Fatalf("C: %v", err)
	}
	var r res
	pinned := false
	select {
	case r = <-bDone:
		// B ran before or after A, on the same server connection.
	case err := <-aDone:
		aDone <- err
		waitState(t, "B's answer, or A holding the connection", func() bool {
			return len(bDone) > 0 || (hiddenWaiting(h) >= 1 && hiddenHeld(h))
		})
		if pinned = len(bDone) == 0; pinned {
			if err := a.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
		r = <-bDone
	}
	aErr := <-aDone
	if r.err != nil {
		t.Fatalf("B: %v", r.err)
	}
	return r.v, aErr, pinned
}
