package sqllex

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// pieces are expressions that are hard to lex; statementText joins them into
// SELECTs with comments and odd spacing between tokens.
var pieces = []string{
	`1`, `1.5e3`, `.5`, `1e-3`, `'a'`, `'it''s'`, `'a;b'`, `'--'`, `'/*'`, `E'\''`, `E'a\\'`,
	`E'\\'';'`, `e'\x27;'`, `'\'`, `'C:\temp'`, `U&'\0041;'`, `U&'!0041' UESCAPE '!'`,
	`$$;$$`, `$a$;$$;$a$`, `$a$ $b$ ; $b$ $a$`, `$_1$x$_1$`, `b'01'`, `x'0f'`, `n'x'`,
	"'a'\n'b'", "'a' -- c;\n 'b'", "'a' \r\n\t 'b'", `'a' || 'b'`, "1 +-- ;\n 2", `1 */* ; */ 2`,
	`2 - -1`, `(SELECT ';')`, `ARRAY[';', '$$']`, `'x'::text`, `(SELECT "c"."relname" FROM pg_class "c" LIMIT 1)`, `1 AS "a$;""b"`, `(SELECT "relname" FROM pg_class LIMIT 1) AS "--"`,
}

// separators go between tokens; each is white space or a comment.
var separators = []string{" ", "  ", "\n", "\t", "/* ; */", "/* /* ; */ ; */", "-- ; '\n", " /*$$*/ "}

// statementText builds n statements from random pieces.
func statementText(r *rand.Rand, n int) string {
	var b strings.Builder
	sep := func() string { return separators[r.IntN(len(separators))] }
	for i := range n {
		if i > 0 {
			b.WriteString(sep() + ";" + sep())
			if r.IntN(4) == 0 {
				b.WriteString(";" + sep()) // an empty statement
			}
		}
		b.WriteString("SELECT" + sep() + pieces[r.IntN(len(pieces))])
		if r.IntN(2) == 0 {
			b.WriteString(sep() + "," + sep() + pieces[r.IntN(len(pieces))])
		}
		if r.IntN(3) == 0 {
			b.WriteString(sep() + "FROM" + sep() + `pg_class "c"` + sep() + "LIMIT 1")
		}
	}
	return b.String()
}

// TestAgainstPostgres checks the lexer's readings against a real
// PostgreSQL: where statements split, which texts are rejected, what names
// prepared statements get, and when the identity changes.
func TestAgainstPostgres(t *testing.T) {
	c := pgtest.New(t, pgtest.Options{})
	t.Run("Splits", func(t *testing.T) { splitsLikePostgres(t, c) })
	t.Run("IncompleteIsRejected", func(t *testing.T) { incompleteIsRejected(t, c) })
	t.Run("Names", func(t *testing.T) { namesLikePostgres(t, c) })
	t.Run("Identity", func(t *testing.T) { identityLikePostgres(t, c) })
	t.Run("SetConfig", func(t *testing.T) { setConfigLikePostgres(t, c) })
	t.Run("Mentions", func(t *testing.T) { mentionsLikePostgres(t, c) })
	t.Run("OpaqueBuiltins", func(t *testing.T) { opaqueBuiltinsRunUserCode(t, c) })
}

// mentionsLikePostgres creates temporary tables under tricky spellings
// (case, quotes, escapes, UESCAPE, multibyte characters, names past 63
// bytes) and checks that MentionsAny finds a query of each by the name
// PostgreSQL records in pg_class, and by no near name.
func mentionsLikePostgres(t *testing.T, c *pgtest.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := pgConnect(ctx, t, c)
	for _, spelling := range []string{
		"Hid_V", `"Hid_V"`, `"hid""v"`, `U&"hid\005fv"`, `U&"h!0069d" UESCAPE '!'`, `U&"\+01F600x"`,
		`U&"a\\b"`, "ÉCOLE_Ab", "a$b", strings.Repeat("Ab", 40), `"` + strings.Repeat("é", 40) + `"`,
		"xx" + strings.Repeat("é", 350), `"xx` + strings.Repeat("É", 350) + `"`,
		`"` + strings.Repeat(`""`, 350) + `"`, `U&"` + strings.Repeat(`\0064`, 70) + `"`,
	} {
		if _, err := conn.Exec(ctx, "CREATE TEMP TABLE "+spelling+" ()").ReadAll(); err != nil {
			t.Fatalf("CREATE TEMP TABLE %.80s: %v", spelling, err)
		}
		res := conn.ExecParams(ctx, "SELECT relname::text FROM pg_class WHERE relnamespace = pg_my_temp_schema()", nil, nil, nil, nil).Read()
		if res.Err != nil || len(res.Rows) != 1 {
			t.Fatalf("%.80s: pg_class: %v, %d rows", spelling, res.Err, len(res.Rows))
		}
		name := string(res.Rows[0][0])
		for _, sql := range []string{"SELECT * FROM " + spelling, "TABLE pg_temp." + spelling} {
			if !MentionsAny(sql, map[string]struct{}{name: {}}, nil) {
				t.Errorf("%.80q: PostgreSQL calls the table %q, MentionsAny does not see it", sql, name)
			}
			for _, near := range []string{strings.ToUpper(name), strings.ToLower(name), name + "x", name[:len(name)-1]} {
				if near != name && MentionsAny(sql, map[string]struct{}{near: {}}, nil) {
					t.Errorf("%.80q: PostgreSQL calls the table %q, MentionsAny takes %q for it", sql, name, near)
				}
			}
		}
		if _, err := conn.Exec(ctx, "DROP TABLE pg_temp."+spelling).ReadAll(); err != nil {
			t.Fatalf("DROP TABLE %.80s: %v", spelling, err)
		}
	}
}

// opaqueBuiltinsRunUserCode shows, for the built-ins sessionBuiltins lists
// because they run code their call does not show, that a call of each
// runs a user function whose name the text does not hold outside string
// constants (MentionsAny does not see it; only OpaqueCall flags the call):
// the function raises a NOTICE the connection counts. Not exercised here:
// the _xmlschema forms that read no rows, and pg_logical_slot_*, which
// need wal_level=logical and an output plugin.
func opaqueBuiltinsRunUserCode(t *testing.T, c *pgtest.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgconn.ParseConfig(c.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if n.Message == "hidden ran" {
			ran.Add(1)
		}
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(ctx)
		_ = c.Exec(ctx, "DROP SCHEMA IF EXISTS sqllex_opaque CASCADE")
	})
	const setup = `CREATE SCHEMA sqllex_opaque;
SET search_path = sqllex_opaque, pg_catalog;
CREATE FUNCTION hidden(int) RETURNS int LANGUAGE plpgsql AS $$BEGIN RAISE NOTICE 'hidden ran'; RETURN $1; END$$;
CREATE FUNCTION hidden_imm(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$BEGIN RAISE NOTICE 'hidden ran'; RETURN $1; END$$;
CREATE FUNCTION hidden_ok(int) RETURNS bool LANGUAGE plpgsql IMMUTABLE AS $$BEGIN RAISE NOTICE 'hidden ran'; RETURN true; END$$;
CREATE FUNCTION hidden_hash(int, bigint) RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$BEGIN RAISE NOTICE 'hidden ran'; RETURN hashint4extended($1, $2); END$$;
CREATE VIEW v AS SELECT hidden(a) AS a FROM (VALUES (1)) s (a);
CREATE VIEW docs AS SELECT to_tsvector('simple', 'a b') AS t FROM v;
CREATE VIEW rewrites AS SELECT 'a'::tsquery AS target, 'b'::tsquery AS substitute FROM v;
CREATE DOMAIN posint AS int CHECK (hidden_ok(VALUE));
CREATE TYPE comp AS (a posint);
CREATE TYPE rng AS RANGE (subtype = posint);
CREATE TABLE bt (a int);
INSERT INTO bt VALUES (1);
CREATE INDEX bt_brin ON bt USING brin (hidden_imm(a));
CREATE OPERATOR CLASS hidden_ops FOR TYPE int USING hash AS OPERATOR 1 =, FUNCTION 2 hidden_hash(int, bigint);
CREATE TABLE hp (a int) PARTITION BY HASH (a hidden_ops);
CREATE FUNCTION hidden_cmp(int, int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$BEGIN RAISE NOTICE 'hidden ran'; RETURN btint4cmp($1, $2); END$$;
CREATE OPERATOR CLASS hidden_gin_ops FOR TYPE int[] USING gin AS OPERATOR 2 @> (anyarray, anyarray),
	FUNCTION 1 hidden_cmp(int, int), FUNCTION 2 ginarrayextract(anyarray, internal, internal),
	FUNCTION 3 ginqueryarrayextract(anyarray, internal, int2, internal, internal, internal, internal),
	FUNCTION 4 ginarrayconsistent(internal, int2, anyarray, int4, internal, internal, internal, internal), STORAGE int;
CREATE TABLE ga (a int[]);
CREATE INDEX ga_gin ON ga USING gin (a hidden_gin_ops) WITH (fastupdate = on);
INSERT INTO ga VALUES ('{1,2,3}'), ('{3,4}')`
	if _, err := conn.Exec(ctx, setup).ReadAll(); err != nil {
		t.Fatal(err)
	}
	ran.Store(0)
	if _, err := conn.Exec(ctx, "SELECT lower('v'), count(*) FROM v").ReadAll(); err != nil || ran.Load() != 1 {
		t.Fatalf("the view's function ran %d times (%v), want once: the count is broken", ran.Load(), err)
	}
	hidden := map[string]struct{}{}
	for _, n := range []string{"hidden", "hidden_imm", "hidden_ok", "hidden_hash", "hidden_ops", "v", "docs",
		"rewrites", "posint", "comp", "rng", "rng_multirange", "bt", "bt_brin", "hp", "hidden_cmp", "hidden_gin_ops",
		"ga", "ga_gin", "sqllex_opaque"} {
		hidden[n] = struct{}{}
	}
	for _, tc := range []struct{ before, name, call, after string }{
		{"", "query_to_xml", "query_to_xml('SELECT * FROM v', true, false, '')", ""},
		{"", "query_to_xmlschema", "query_to_xmlschema('SELECT hidden_imm(4)', true, false, '')", ""},
		{"", "query_to_xml_and_xmlschema", "query_to_xml_and_xmlschema('SELECT * FROM v', true, false, '')", ""},
		{"BEGIN; DECLARE c CURSOR FOR SELECT * FROM v", "cursor_to_xml", "cursor_to_xml('c', 1, true, false, '')", "COMMIT"},
		{"", "table_to_xml", "table_to_xml('v', true, false, '')", ""},
		{"", "table_to_xml_and_xmlschema", "table_to_xml_and_xmlschema('v', true, false, '')", ""},
		{"", "schema_to_xml", "schema_to_xml('sqllex_opaque', true, false, '')", ""},
		{"", "schema_to_xml_and_xmlschema", "schema_to_xml_and_xmlschema('sqllex_opaque', true, false, '')", ""},
		{"", "database_to_xml", "database_to_xml(true, false, '')", ""},
		{"", "database_to_xml_and_xmlschema", "database_to_xml_and_xmlschema(true, false, '')", ""},
		{"", "ts_stat", "count(*) FROM ts_stat('SELECT t FROM docs')", ""},
		{"", "ts_rewrite", "ts_rewrite('a'::tsquery, 'SELECT target, substitute FROM rewrites')", ""},
		{"", "array_in", "array_in('{5}', 'posint'::regtype, -1)", ""},
		{"", "record_in", "record_in('(6)', 'comp'::regtype, -1)", ""},
		{"", "range_in", "range_in('[1,2]', 'rng'::regtype, -1)", ""},
		{"", "multirange_in", "multirange_in('{[3,4]}', 'rng_multirange'::regtype, -1)", ""},
		{"", "domain_in", "domain_in('7', 'posint'::regtype, -1) IS NULL", ""},
		{"SELECT brin_desummarize_range('bt_brin', 0)", "brin_summarize_range", "brin_summarize_range('bt_brin', 0)", ""},
		{"SELECT brin_desummarize_range('bt_brin', 0)", "brin_summarize_new_values", "brin_summarize_new_values('bt_brin')", ""},
		{"", "satisfies_hash_partition", "satisfies_hash_partition('hp'::regclass, 2, 0, 5)", ""},
		{"", "gin_clean_pending_list", "gin_clean_pending_list('ga_gin')", ""},
	} {
		if tc.before != "" {
			if _, err := conn.Exec(ctx, tc.before).ReadAll(); err != nil {
				t.Fatalf("%s: %v", tc.before, err)
			}
		}
		ran.Store(0)
		sql := "SELECT " + tc.call
		if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		if ran.Load() == 0 {
			t.Errorf("%s: ran no user function", sql)
		}
		if tc.after != "" {
			if _, err := conn.Exec(ctx, tc.after).ReadAll(); err != nil {
				t.Fatalf("%s: %v", tc.after, err)
			}
		}
		if f := Classify(sql).Flags; f&OpaqueCall == 0 || HarmlessBuiltin(tc.name) {
			t.Errorf("%s: Classify %v, HarmlessBuiltin(%s) %v; want OpaqueCall, false", sql, f, tc.name, HarmlessBuiltin(tc.name))
		}
		if MentionsAny(sql, hidden, nil) {
			t.Errorf("%s: MentionsAny sees a name outside its strings", sql)
		}
	}
}

// setConfigLikePostgres runs set_config calls whose arguments are spelled
// in many ways and checks the lexer's reading against the server's: a call
// read as transaction-local leaves search_path as it was once its implicit
// transaction ends, and one read as setting search_path for the session
// did set it. A call the lexer cannot read must say so (UnsureIdentity).
func setConfigLikePostgres(t *testing.T, c *pgtest.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := pgConnect(ctx, t, c)
	for _, call := range []string{
		"set_config('search_path', 'x', true)", "set_config('search_path', 'x', false)",
		"set_config('search_path', 'x', 't'::boolean)", "set_config('search_path', 'x', 'on'::text::bool)",
		"set_config('search_path', 'x', $$yes$$)", "set_config('search_path', 'x', true::boolean AND false)",
		"set_config('search_path', 'x', NOT true)", "set_config('search_path', 'x', (true))",
		"set_config('search_path', 'x', 'f'::pg_catalog.bool)", "set_config('search_path', 'x', '1'::int::bool)",
		"set_config('search_path', 'x', '0'::int::bool)", "set_config('search_path', 'x', NULL)",
		"set_config('search_path'::text, 'x', false)", "set_config('search_path'::varchar, 'x', false)",
		"set_config('search_'::text || 'path', 'x', false)", "set_config('search_path_x'::varchar(11), 'x', false)",
		"set_config(E'search\\x5fpath', 'x', false)", "pg_catalog.set_config($$search_path$$, 'x', false)",
	} {
		if _, err := conn.Exec(ctx, "RESET search_path").ReadAll(); err != nil {
			t.Fatal(err)
		}
		sql := "SELECT " + call
		if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%q: %v", sql, err)
		}
		res := conn.ExecParams(ctx, "SELECT current_setting('search_path') = 'x'", nil, nil, nil, nil).Read()
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		changed := string(res.Rows[0][0]) == "t"
		f := Classify(sql).Flags
		switch {
		case f&UnsureIdentity != 0:
			if f&SetParamLocal != 0 {
				t.Errorf("%q: unsure, yet read as local: %v", sql, f)
			}
		case f&SetParamLocal != 0 && changed:
			t.Errorf("%q: read as transaction-local (%v), but search_path stayed set", sql, f)
		case f&SetParam != 0 && !changed && strings.HasSuffix(call, "false)"):
			// Read as session-level while PostgreSQL made it local is the
			// safe mistake ('1'::int::bool, NOT true); with is_local false
			// search_path must have changed, or the name was misread.
			t.Errorf("%q: read as setting search_path (%v), but it did not change", sql, f)
		}
	}
}

func pgConnect(ctx context.Context, t *testing.T, c *pgtest.Cluster) *pgconn.PgConn {
	t.Helper()
	conn, err := pgconn.Connect(ctx, c.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(ctx)
	})
	return conn
}

// splitsLikePostgres sends generated multi-statement texts to a real
// PostgreSQL, with standard_conforming_strings on and off, and checks that
// PostgreSQL runs as many statements as the reading for that setting finds.
func splitsLikePostgres(t *testing.T, c *pgtest.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := pgConnect(ctx, t, c)
	r := rand.New(rand.NewPCG(1, 2))
	for _, scs := range []string{"on", "off"} {
		compared := 0
		if _, err := conn.Exec(ctx, "SET standard_conforming_strings = "+scs).ReadAll(); err != nil {
			t.Fatal(err)
		}
		for range 400 {
			sql := statementText(r, 1+r.IntN(4))
			want := summarize(sql, scs == "off")
			results, err := conn.Exec(ctx, sql).ReadAll()
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && scs == "off" && strings.Contains(sql, "U&") {
				continue // PostgreSQL refuses U& strings with standard_conforming_strings off
			}
			if errors.As(err, &pgErr) && pgErr.Code == "42601" && scs == "off" {
				continue // a backslash swallowed a quote: the text no longer parses
			}
			if err != nil {
				t.Fatalf("scs=%s %q: %v (the lexer found %v)", scs, sql, err, want.flags)
			}
			if len(results) != want.count || want.flags != 0 {
				t.Fatalf("scs=%s %q: PostgreSQL ran %d statements, the lexer found %d (%v)", scs, sql, len(results), want.count, want.flags)
			}
			// Classify reads both ways when a backslash makes it matter.
			if got := Classify(sql); got.Statements < want.count ||
				(got.Flags&Ambiguous == 0 && got.Statements != want.count) {
				t.Fatalf("%q: Classify found %d statements (%v), PostgreSQL ran %d", sql, got.Statements, got.Flags, want.count)
			}
			compared++
		}
		if compared < 200 {
			t.Fatalf("scs=%s: only %d of 400 texts ran", scs, compared)
		}
	}
}

// incompleteIsRejected checks that PostgreSQL rejects, with a syntax
// error and without running anything, the texts the lexer calls Incomplete.
func incompleteIsRejected(t *testing.T, c *pgtest.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := pgConnect(ctx, t, c)
	for _, tc := range classifyCases {
		if tc.flags&Incomplete == 0 || strings.Contains(strings.ToUpper(tc.sql), "ROLE") {
			continue
		}
		results, err := conn.Exec(ctx, tc.sql).ReadAll()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42601" {
			t.Errorf("%q: err = %v, want a syntax error (42601)", tc.sql, err)
		}
		for _, res := range results {
			if res.Err == nil {
				t.Errorf("%q: a statement ran (%s)", tc.sql, res.CommandTag)
			}
		}
	}
}

// namesLikePostgres prepares statements under tricky names and checks
// that Stmt.Name is the name PostgreSQL records in pg_prepared_statements.
func namesLikePostgres(t *testing.T, c *pgtest.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := pgConnect(ctx, t, c)
	for _, name := range []string{
		"Stmt1", `"Stmt""1"`, `"MiXed"`, `U&"d\0061t"`, `U&"d!0061t" UESCAPE '!'`, "ÉCOLE_Ab",
		strings.Repeat("Ab", 40), `"` + strings.Repeat("é", 40) + `"`, "prepare", `"all"`, "a$b",
	} {
		sql := "PREPARE " + name + " AS SELECT 1"
		var st Stmt
		for s := range Statements(sql) {
			st = s
		}
		if st.Flags != Prepare {
			t.Fatalf("%q: flags %v", sql, st.Flags)
		}
		if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%q: %v", sql, err)
		}
		res := conn.ExecParams(ctx, "SELECT name FROM pg_prepared_statements", nil, nil, nil, nil).Read()
		if res.Err != nil || len(res.Rows) != 1 {
			t.Fatalf("%q: pg_prepared_statements: %v, %d rows", sql, res.Err, len(res.Rows))
		}
		if got := string(res.Rows[0][0]); got != st.Name {
			t.Errorf("%q: PostgreSQL calls it %q, Stmt.Name is %q", sql, got, st.Name)
		}
		for d := range Statements("DEALLOCATE " + name) {
			if d.Flags != Deallocate || d.Name != st.Name {
				t.Errorf("DEALLOCATE %s: %v %q, want Deallocate %q", name, d.Flags, d.Name, st.Name)
			}
		}
		if _, err := conn.Exec(ctx, "DEALLOCATE ALL").ReadAll(); err != nil {
			t.Fatal(err)
		}
	}
}

// identityLikePostgres runs statements as a superuser and checks that
// the lexer reports a session-level identity change exactly when
// current_user or session_user changed for good.
func identityLikePostgres(t *testing.T, c *pgtest.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Exec(ctx, "CREATE ROLE bob"); err != nil {
		t.Fatal(err)
	}
	conn := pgConnect(ctx, t, c)
	const session = SetRole | ResetRole | SetSessionAuth | ResetSessionAuth
	for _, sql := range []string{
		"SET ROLE bob", "set/**/role bob", "SET SESSION ROLE bob", "SET LOCAL ROLE bob",
		"BEGIN; SET LOCAL ROLE bob; COMMIT", `SET "ROLE" = bob`, "SET role TO 'bob'",
		"SET SESSION AUTHORIZATION bob", "SET session_authorization = bob",
		"BEGIN; SET LOCAL SESSION AUTHORIZATION bob; COMMIT",
		"SELECT set_config('role', 'bob', false)", "SELECT set_config('ROLE', 'bob', 'off')",
		"BEGIN; SELECT set_config('role', 'bob', true); COMMIT",
		"SELECT set_config(E'\\x72ole', 'bob', false)",
		"SELECT set_config('ro'\n'le', 'bob', false)",
		"SELECT 'SET ROLE bob'", "SELECT $$; SET ROLE bob$$", "SELECT 1 -- ; SET ROLE bob",
		"EXPLAIN SELECT 1", "SELECT set_config('search_path', 'bob', false)", "RESET ALL",
		"SELECT 1; SET ROLE bob", "SELECT 'x'\n; SET ROLE bob",
		"CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql SET role = bob RETURN 1",
		"CREATE FUNCTION pg_temp.g() RETURNS text LANGUAGE sql RETURN set_config('role', 'bob', false)",
		"CREATE FUNCTION pg_temp.h() RETURNS text LANGUAGE sql BEGIN ATOMIC SELECT set_config('role', 'bob', false); END; SELECT 1",
		"CREATE TEMP TABLE t AS SELECT set_config('role', 'bob', false)",
	} {
		if _, err := conn.Exec(ctx, "RESET SESSION AUTHORIZATION; RESET ROLE; RESET ALL").ReadAll(); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%q: %v", sql, err)
		}
		res := conn.ExecParams(ctx, "SELECT current_user = 'bob' OR session_user = 'bob'", nil, nil, nil, nil).Read()
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		changed := string(res.Rows[0][0]) == "t"
		if flagged := Classify(sql).Flags&session != 0; flagged != changed {
			t.Errorf("%q: identity changed %v, Classify flags %v", sql, changed, Classify(sql).Flags)
		}
	}
}
