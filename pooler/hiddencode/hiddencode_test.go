package hiddencode_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler/hiddencode"
)

// setup creates, next to objects that run only harmless built-ins, one
// object of every kind that makes the server run a user function behind
// a name.
var setup = []string{
	// Functions that change the session (set_config), and harmless ones.
	"CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$SELECT length(set_config('x.y', 'z', false))$$",
	"CREATE FUNCTION fb(int) RETURNS boolean LANGUAGE sql AS $$SELECT set_config('x.y', 'z', false) IS NOT NULL$$",
	"CREATE FUNCTION ftrg() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM set_config('x.y', 'z', false); RETURN NEW; END$$",
	"CREATE FUNCTION fimm(int) RETURNS int LANGUAGE sql IMMUTABLE AS $$SELECT $1 + length(set_config('x.y', 'z', false))$$",
	"CREATE FUNCTION fop(int, int) RETURNS int LANGUAGE sql AS $$SELECT $1 + $2 + length(set_config('x.y', 'z', false))$$",
	"CREATE FUNCTION hf() RETURNS int LANGUAGE sql AS 'SELECT 42'",
	"CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN NEW.b := now()::text; RETURN NEW; END$$",
	"CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$DECLARE n int; BEGIN IF TG_OP = 'UPDATE' THEN UPDATE plain_log SET op = TG_OP WHERE false; END IF; INSERT INTO plain_log VALUES (TG_OP) ON CONFLICT DO NOTHING; RETURN NEW; END$$",
	"CREATE FUNCTION chain() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN INSERT INTO t_trig VALUES (1); RETURN NEW; END$$",
	"CREATE FUNCTION ifset() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN IF true THEN SET search_path = evil; END IF; RETURN NEW; END$$",
	"CREATE FUNCTION dyn() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN EXECUTE 'SELECT 1'; RETURN NEW; END$$",
	"CREATE FUNCTION calls_f() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM hf(); RETURN NEW; END$$",
	"CREATE FUNCTION public.lower(int) RETURNS int LANGUAGE sql AS 'SELECT $1'",

	// Harmless: built-ins only.
	"CREATE TABLE plain (a int PRIMARY KEY, b text DEFAULT 'x', c serial, d timestamptz DEFAULT now() CHECK (d > '2000-01-01'), e text GENERATED ALWAYS AS (lower(b)) STORED)",
	"CREATE INDEX ON plain (lower(b))",
	"CREATE VIEW plain_v AS SELECT a, upper(b) AS b FROM plain",
	"CREATE VIEW plain_vv AS SELECT * FROM plain_v",
	"CREATE TYPE mood AS ENUM ('sad', 'ok')",
	"CREATE TABLE plain_enum (m mood)",
	"CREATE TYPE pair AS (x int, y text)",
	"CREATE TABLE plain_pair (p pair)",
	"CREATE DOMAIN posint AS int CHECK (VALUE > 0)",
	"CREATE TABLE plain_dom (v posint)",
	"CREATE TABLE plain_rls (a int, owner name DEFAULT current_user)",
	"ALTER TABLE plain_rls ENABLE ROW LEVEL SECURITY",
	"CREATE POLICY p ON plain_rls USING (owner = current_user)",
	"CREATE TABLE plain_parent (a int PRIMARY KEY)",
	"CREATE TABLE plain_child (a int REFERENCES plain_parent ON DELETE CASCADE)",
	"CREATE TABLE plain_hdef (a int DEFAULT hf())",
	"CREATE TABLE plain_touch (a int, b text)",
	"CREATE TRIGGER t BEFORE INSERT OR UPDATE ON plain_touch FOR EACH ROW EXECUTE FUNCTION touch()",
	"CREATE TABLE plain_log (op text UNIQUE)",
	"CREATE TABLE plain_audited (a int)",
	"CREATE TRIGGER t AFTER INSERT OR UPDATE ON plain_audited FOR EACH ROW EXECUTE FUNCTION audit()",

	// Code behind names.
	"CREATE TABLE t_trig (a int)",
	"CREATE TRIGGER t BEFORE INSERT ON t_trig FOR EACH ROW EXECUTE FUNCTION ftrg()",
	"CREATE TABLE t_rule (a int)",
	"CREATE RULE r AS ON INSERT TO t_rule DO ALSO SELECT f()",
	"CREATE TABLE t_def (a int DEFAULT f())",
	"CREATE TABLE t_chk (a int CHECK (fb(a)))",
	"CREATE TABLE t_gen (a int, b int GENERATED ALWAYS AS (fimm(a)) STORED)",
	"CREATE TABLE t_idx (a int)",
	"CREATE INDEX ON t_idx (fimm(a))",
	"CREATE TABLE t_rls (a int)",
	"ALTER TABLE t_rls ENABLE ROW LEVEL SECURITY",
	"CREATE POLICY p ON t_rls USING (fb(a))",
	"CREATE VIEW v AS SELECT f() AS x",
	"CREATE VIEW v_over_v AS SELECT * FROM v",
	"CREATE VIEW v_over_trig AS SELECT * FROM t_trig",
	"CREATE VIEW v_setting AS SELECT name FROM pg_catalog.pg_settings",
	"CREATE VIEW v_set_config AS SELECT set_config('work_mem', '1MB', false)",
	"CREATE MATERIALIZED VIEW mv AS SELECT f() AS x",
	"CREATE DOMAIN d_user AS int CHECK (fb(VALUE))",
	"CREATE TABLE t_dom (v d_user)",
	"CREATE TABLE t_dom_arr (v d_user[])",
	"CREATE TYPE wrap AS (v d_user)",
	"CREATE TABLE t_wrap (w wrap)",
	"CREATE TABLE fk_parent (a int PRIMARY KEY)",
	"CREATE TABLE fk_child (a int REFERENCES fk_parent ON DELETE CASCADE)",
	"CREATE TRIGGER t BEFORE DELETE ON fk_child FOR EACH ROW EXECUTE FUNCTION ftrg()",
	"CREATE TABLE fk_restrict_parent (a int PRIMARY KEY)",
	"CREATE TABLE fk_restrict_child (a int REFERENCES fk_restrict_parent)",
	"CREATE TRIGGER t BEFORE DELETE ON fk_restrict_child FOR EACH ROW EXECUTE FUNCTION ftrg()",
	"CREATE TABLE part (a int) PARTITION BY RANGE (a)",
	"CREATE TABLE part_1 PARTITION OF part FOR VALUES FROM (0) TO (10)",
	"CREATE TRIGGER t BEFORE INSERT ON part_1 FOR EACH ROW EXECUTE FUNCTION ftrg()",
	"CREATE TYPE castme AS (a int)",
	"CREATE FUNCTION fcast(int) RETURNS castme LANGUAGE sql AS $$SELECT ROW($1 + length(set_config('x.y', 'z', false)))::castme$$",
	"CREATE CAST (int AS castme) WITH FUNCTION fcast(int) AS ASSIGNMENT",
	"CREATE FUNCTION fdiff(float8, float8) RETURNS float8 LANGUAGE sql IMMUTABLE AS $$SELECT $1 - $2 + length(set_config('x.y', 'z', false))$$",
	"CREATE TYPE frange AS RANGE (subtype = float8, subtype_diff = fdiff)",
	"CREATE TABLE t_range (r frange)",
	"CREATE OPERATOR ### (LEFTARG = int, RIGHTARG = int, FUNCTION = fop)",
	"CREATE TABLE t_chain (a int)",
	"CREATE TRIGGER t BEFORE INSERT ON t_chain FOR EACH ROW EXECUTE FUNCTION chain()",
	"CREATE TABLE t_ifset (a int)",
	"CREATE TRIGGER t BEFORE INSERT ON t_ifset FOR EACH ROW EXECUTE FUNCTION ifset()",
	"CREATE TABLE t_dyn (a int)",
	"CREATE TRIGGER t BEFORE INSERT ON t_dyn FOR EACH ROW EXECUTE FUNCTION dyn()",
	"CREATE TABLE t_calls (a int)",
	"CREATE TRIGGER t BEFORE INSERT ON t_calls FOR EACH ROW EXECUTE FUNCTION calls_f()",
	"CREATE DOMAIN d_def AS int DEFAULT f()",
	"CREATE TABLE t_domdef (a int, v d_def)",
	"CREATE TABLE t_partkey (a int) PARTITION BY RANGE (fimm(a))",
}

// hidden are the names whose use runs a user function; plain those that
// run only harmless built-ins.
var (
	hidden = []string{
		"t_trig", "t_rule", "t_def", "t_chk", "t_gen", "t_idx", "t_rls", "v", "v_over_v", "v_over_trig",
		"v_setting", "v_set_config", "mv", "d_user", "_d_user", "t_dom", "t_dom_arr", "wrap", "t_wrap",
		"fk_parent", "fk_child", "fk_restrict_child", "part", "part_1", "castme", "frange", "t_range",
		"t_chain", "t_ifset", "t_dyn", "t_calls", "d_def", "t_domdef", "t_partkey",
		"fk_restrict_parent", // TRUNCATE … CASCADE reaches the child's triggers
	}
	plain = []string{
		"plain", "plain_v", "plain_vv", "mood", "plain_enum", "pair", "plain_pair", "posint", "plain_dom",
		"plain_rls", "plain_parent", "plain_child", "pg_class", "pg_stat_activity",
		"plain_hdef", "plain_touch", "plain_log", "plain_audited",
		"pg_settings", // its rules are the lexer's to read (UPDATE pg_settings)
	}
)

// TestBuildFromPostgres reads a real catalog and checks which names
// Mentions finds.
func TestBuildFromPostgres(t *testing.T) {
	c := pgtest.New(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgconn.Connect(ctx, c.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if n := build(ctx, t, conn); !n.Empty() {
		// The common case costs the pooler nothing per request.
		t.Errorf("a fresh database has %d names with code behind them, want none", n.Len())
	}
	for _, q := range setup {
		if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	n := build(ctx, t, conn)
	for _, name := range hidden {
		if !n.Mentions("SELECT * FROM " + name) {
			t.Errorf("%s: not found to run user code", name)
		}
	}
	for _, name := range plain {
		if n.Mentions("SELECT * FROM " + name) {
			t.Errorf("%s: found to run user code, though it runs built-ins only", name)
		}
	}
	for _, q := range []string{"SELECT 1 ### 2", "SELECT 1 OPERATOR(public.###) 2", `SELECT * FROM "t_trig"`, "SELECT * FROM public.T_TRIG", "SELECT 1::castme",
		"SELECT lower(1)", // public.lower(int) shadows no built-in of that signature: PostgreSQL picks it
	} {
		if !n.Mentions(q) {
			t.Errorf("%q: not found to run user code", q)
		}
	}
	for _, q := range []string{"SELECT 'v'", "SELECT 1 -- t_trig", "SELECT 1 + 2", `SELECT * FROM "T_TRIG"`, "SELECT upper('a')"} {
		if n.Mentions(q) {
			t.Errorf("%q: found to run user code", q)
		}
	}

	// A user-defined cast between two built-in types may run behind any
	// coercion: every text counts.
	for _, q := range []string{
		"CREATE FUNCTION fbytes(int) RETURNS bytea LANGUAGE sql AS 'SELECT ''\\x00''::bytea'",
		"CREATE CAST (int AS bytea) WITH FUNCTION fbytes(int)",
	} {
		if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if n := build(ctx, t, conn); !n.Mentions("SELECT 1") {
		t.Error("with a user cast between built-in types, SELECT 1 is not found to run user code")
	}
}

// build runs Query on conn and builds its Names.
func build(ctx context.Context, t *testing.T, conn *pgconn.PgConn) *hiddencode.Names {
	t.Helper()
	return rows(ctx, t, conn, hiddencode.Query).Build()
}

// fingerprint runs FingerprintQuery on conn.
func fingerprint(ctx context.Context, t *testing.T, conn *pgconn.PgConn) string {
	t.Helper()
	return rows(ctx, t, conn, hiddencode.FingerprintQuery).Fingerprint()
}

// rows runs q, one of the package's queries, on conn and adds every row
// of its result to a Builder.
func rows(ctx context.Context, t *testing.T, conn *pgconn.PgConn, q string) *hiddencode.Builder {
	t.Helper()
	res, err := conn.Exec(ctx, q).ReadAll()
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	var b hiddencode.Builder
	for _, rr := range res {
		for _, r := range rr.Rows {
			if err := b.Add(dataRow(r)); err != nil {
				t.Fatalf("Add: %v", err)
			}
		}
	}
	return &b
}

// TestFingerprint: the fingerprint Query carries is FingerprintQuery's,
// and any DDL Query could see changes it.
func TestFingerprint(t *testing.T) {
	ctx, conn, exec := catalogConn(t)
	exec("CREATE TABLE fp (a int, b text)")
	exec("CREATE FUNCTION fpf() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'")
	exec("CREATE FUNCTION fpg() RETURNS event_trigger LANGUAGE plpgsql AS 'BEGIN END'")
	n := build(ctx, t, conn)
	if n.Fingerprint() == "" || n.Fingerprint() != fingerprint(ctx, t, conn) {
		t.Fatalf("Query's fingerprint %q, FingerprintQuery's %q", n.Fingerprint(), fingerprint(ctx, t, conn))
	}
	exec("SELECT 1; INSERT INTO fp VALUES (1, 'x')")
	if got := fingerprint(ctx, t, conn); got != n.Fingerprint() {
		t.Fatalf("the fingerprint changed without DDL: %q, was %q", got, n.Fingerprint())
	}
	last := n.Fingerprint()
	for _, ddl := range []string{
		"CREATE TRIGGER t BEFORE INSERT ON fp FOR EACH ROW EXECUTE FUNCTION fpf()",
		"ALTER TABLE fp DISABLE TRIGGER t",
		"DROP TRIGGER t ON fp",
		"ALTER TABLE fp ALTER COLUMN b SET DEFAULT 'y'",
		"ALTER TABLE fp ADD CHECK (a > 0)",
		"CREATE INDEX ON fp (lower(b))",
		"CREATE VIEW fpv AS SELECT * FROM fp",
		"CREATE OR REPLACE VIEW fpv AS SELECT a, b, 1 AS c FROM fp",
		"ALTER TABLE fp ENABLE ROW LEVEL SECURITY",
		"CREATE POLICY p ON fp USING (true)",
		"CREATE DOMAIN fpd AS text",
		"CREATE TABLE fp2 (b text)",
		"ALTER TABLE fp2 ALTER COLUMN b TYPE fpd",
		"CREATE TABLE fpc () INHERITS (fp)",
		"CREATE OR REPLACE FUNCTION fpf() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN PERFORM 1; RETURN NEW; END'",
		"CREATE EVENT TRIGGER fpe ON ddl_command_end EXECUTE FUNCTION fpg()",
	} {
		exec(ddl)
		got := fingerprint(ctx, t, conn)
		if got == last {
			t.Errorf("%s: the fingerprint did not change", ddl)
		}
		last = got
	}
}

// TestSameCode: DDL that adds no code behind a name leaves a catalog
// with the same code (SameCode), though its fingerprint changes; DDL that
// adds or removes such code does not. Nil is the same as nothing.
func TestSameCode(t *testing.T) {
	ctx, conn, exec := catalogConn(t)
	exec("CREATE TABLE sc (a int, b text)")
	exec("CREATE FUNCTION scf() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN PERFORM set_config(''x.y'', ''1'', false); RETURN NEW; END'")
	exec("CREATE FUNCTION scg() RETURNS text LANGUAGE plpgsql AS 'BEGIN PERFORM set_config(''x.y'', ''1'', false); RETURN ''m''; END'")
	last := build(ctx, t, conn)
	if !last.SameCode(last) || !last.SameCode(build(ctx, t, conn)) {
		t.Fatal("a catalog read twice without DDL does not hold the same code")
	}
	var unknown *hiddencode.Names
	if unknown.SameCode(last) || last.SameCode(nil) || unknown.SameCode(nil) {
		t.Error("nothing known is the same as something")
	}
	for _, tc := range []struct {
		ddl  string
		same bool
	}{
		{"ALTER TABLE sc ADD COLUMN c integer", true},
		{"CREATE INDEX ON sc (b)", true},
		{"CREATE TABLE sc2 (x int)", true},
		{"ALTER TABLE sc ALTER COLUMN b SET DEFAULT 'y'", true},
		{"CREATE TRIGGER t BEFORE INSERT ON sc FOR EACH ROW EXECUTE FUNCTION scf()", false},
		{"DROP TRIGGER t ON sc", false},
		{"ALTER TABLE sc2 ALTER COLUMN x SET DEFAULT length(scg())", false},
		{"CREATE VIEW scv AS SELECT scg() AS m", false},
	} {
		exec(tc.ddl)
		n := build(ctx, t, conn)
		if n.Fingerprint() == last.Fingerprint() {
			t.Errorf("%s: the fingerprint did not change", tc.ddl)
		}
		if got := n.SameCode(last); got != tc.same {
			t.Errorf("%s: SameCode = %v, want %v", tc.ddl, got, tc.same)
		}
		last = n
	}
}

// catalogConn connects to a throwaway cluster of its own and returns the
// connection, its context and an exec that fails t on an error.
func catalogConn(t *testing.T) (context.Context, *pgconn.PgConn, func(string)) {
	t.Helper()
	c := pgtest.New(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	conn, err := pgconn.Connect(ctx, c.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return ctx, conn, func(q string) {
		t.Helper()
		if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// dataRow encodes values as a DataRow body.
func dataRow(vals [][]byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(vals)))
	for _, v := range vals {
		if v == nil {
			b = binary.BigEndian.AppendUint32(b, 0xFFFFFFFF)
			continue
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

// TestNilAndNone: nothing known mentions everything; None nothing.
func TestNilAndNone(t *testing.T) {
	var unknown *hiddencode.Names
	if !unknown.Mentions("SELECT 1") || unknown.Empty() {
		t.Error("a nil Names must mention every text")
	}
	if hiddencode.None.Mentions("SELECT * FROM anything") || !hiddencode.None.Empty() {
		t.Error("None must mention nothing")
	}
}

// TestAddRejectsMalformedRows: rows that are not Query's are errors, not
// panics.
func TestAddRejectsMalformedRows(t *testing.T) {
	var b hiddencode.Builder
	for _, body := range [][]byte{
		nil,
		{0},
		{0, 8},
		dataRow([][]byte{[]byte("n"), []byte("r")}),
		dataRow([][]byte{[]byte("x"), []byte("r"), []byte("1"), nil, nil, nil, nil, nil}),
		dataRow([][]byte{[]byte("n"), []byte("r"), []byte("-1"), []byte("t"), nil, nil, nil, nil}),
		dataRow([][]byte{[]byte("e"), []byte("r"), []byte("1"), nil, nil, []byte("f"), []byte("x"), nil}),
		append(dataRow([][]byte{[]byte("n")}), 0, 0, 0, 9),
	} {
		if err := b.Add(body); err == nil {
			t.Errorf("Add(%q) accepted a malformed row", body)
		}
	}
}
