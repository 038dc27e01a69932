package pooler

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// oracleSetupSQL creates, once per database, the objects the generated
// statements use: two roles to switch between (neither a superuser, so
// that a switch between them is not reported by ParameterStatus), a table, and functions, procedures,
// a trigger and a view whose bodies change session state where the text
// that calls them shows nothing of it.
const oracleSetupSQL = `
DO $$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'oracle_r2') THEN CREATE ROLE oracle_r2; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'oracle_r3') THEN CREATE ROLE oracle_r3; END IF;
END$$;
GRANT oracle_r2 TO CURRENT_USER;
GRANT oracle_r3 TO oracle_r2;
CREATE TABLE IF NOT EXISTS oracle_t (a int, b text);
GRANT ALL ON oracle_t TO oracle_r2, oracle_r3;
CREATE OR REPLACE FUNCTION oracle_fn_set(k text, v text) RETURNS text LANGUAGE sql AS $$ SELECT pg_catalog.set_config(k, v, false) $$;
CREATE OR REPLACE FUNCTION oracle_fn_plain(i int) RETURNS int LANGUAGE sql AS $$ SELECT i + 1 $$;
CREATE OR REPLACE FUNCTION oracle_fn_temp() RETURNS void LANGUAGE plpgsql AS $$BEGIN CREATE TEMP TABLE IF NOT EXISTS oracle_fn_tt (a int); END$$;
CREATE OR REPLACE FUNCTION oracle_fn_listen() RETURNS void LANGUAGE plpgsql AS $$BEGIN LISTEN oracle_fn_ch; END$$;
CREATE OR REPLACE FUNCTION oracle_fn_lock() RETURNS void LANGUAGE plpgsql AS $$BEGIN PERFORM pg_advisory_lock(4242); END$$;
CREATE OR REPLACE FUNCTION oracle_fn_role() RETURNS void LANGUAGE plpgsql AS $$BEGIN EXECUTE 'SET ROLE oracle_r2'; END$$;
CREATE OR REPLACE PROCEDURE oracle_proc_set(v text) LANGUAGE plpgsql AS $$BEGIN PERFORM set_config('work_mem', v, false); END$$;
CREATE OR REPLACE PROCEDURE oracle_proc_noop() LANGUAGE plpgsql AS $$BEGIN NULL; END$$;
CREATE TABLE IF NOT EXISTS oracle_trig (a int);
CREATE OR REPLACE FUNCTION oracle_trig_fn() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM set_config('work_mem', '77kB', false); RETURN NEW; END$$;
DROP TRIGGER IF EXISTS oracle_trig_set ON oracle_trig;
CREATE TRIGGER oracle_trig_set BEFORE INSERT ON oracle_trig FOR EACH ROW EXECUTE FUNCTION oracle_trig_fn();
GRANT ALL ON oracle_trig TO oracle_r2;
CREATE OR REPLACE VIEW oracle_view AS SELECT oracle_fn_set('work_mem', '88kB') AS v;
GRANT SELECT ON oracle_view TO oracle_r2;
`

// oracleGen produces SQL texts for the oracle, deterministically from its
// seed. It mixes every way we know of changing session state, spelled in
// odd quoting and casing, inside comments, dollar quotes and multi-statement
// texts, with plain statements that change nothing; names come from small
// pools so that statements meet each other's objects.
type oracleGen struct {
	r *rand.Rand
}

func newOracleGen(seed uint64) *oracleGen {
	return &oracleGen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (g *oracleGen) pick(xs ...string) string { return xs[g.r.IntN(len(xs))] }

func (g *oracleGen) n(k int) int { return 1 + g.r.IntN(k) }

// casing randomises the case of a keyword.
func (g *oracleGen) casing(s string) string {
	switch g.r.IntN(4) {
	case 0:
		return strings.ToUpper(s)
	case 1:
		return strings.ToLower(s)
	case 2:
		b := []byte(s)
		for i := range b {
			if g.r.IntN(2) == 0 && 'a' <= b[i] && b[i] <= 'z' {
				b[i] -= 'a' - 'A'
			}
		}
		return string(b)
	}
	return s
}

// ws returns whitespace, sometimes with a comment.
func (g *oracleGen) ws() string {
	switch g.r.IntN(12) {
	case 0:
		return " /* " + g.pick("SET ROLE oracle_r2", "x", "/* nested; SET work_mem = 1 */", "';") + " */ "
	case 1:
		return " -- " + g.pick("SET ROLE x;", "LISTEN a", "c") + "\n"
	case 2:
		return "\n\t"
	}
	return " "
}

// param returns a run-time parameter and a value for it. Timeouts stay
// large so that the state query can still run.
func (g *oracleGen) param() (string, string) {
	switch g.r.IntN(10) {
	case 0:
		return "search_path", g.pick("public", "pg_temp, public", `"$user", public`, "oracle_none")
	case 1:
		return "application_name", fmt.Sprintf("'app%d'", g.n(3))
	case 2:
		return "DateStyle", g.pick("'ISO, DMY'", "'SQL, MDY'", "'Postgres'")
	case 3:
		return "TimeZone", g.pick("'UTC'", "'Europe/Paris'", "'America/New_York'")
	case 4:
		return "extra_float_digits", fmt.Sprint(g.r.IntN(4))
	case 5:
		return "enable_seqscan", g.pick("off", "on", "false")
	case 6:
		return g.pick("oracle.custom", "app.tenant_id"), fmt.Sprintf("'v%d'", g.n(3))
	case 7:
		return "statement_timeout", g.pick("'4s'", "'7s'", "0")
	case 8:
		return "geqo_threshold", fmt.Sprint(2 + g.r.IntN(20))
	}
	return "work_mem", fmt.Sprintf("'%dkB'", 64*g.n(40))
}

// quoteParam spells a parameter name as SET accepts it.
func (g *oracleGen) quoteParam(p string) string {
	if g.r.IntN(5) == 0 && !strings.Contains(p, ".") {
		return `"` + strings.ToLower(p) + `"`
	}
	return g.casing(p)
}

// nameExpr spells the text k as a SQL expression: a literal, or something
// only evaluation can read.
func (g *oracleGen) nameExpr(k string) string {
	switch g.r.IntN(12) {
	case 0:
		return "'" + k[:1] + "' || '" + k[1:] + "'"
	case 1:
		return "'" + k + "'::text"
	case 2:
		return "lower('" + strings.ToUpper(k) + "')"
	case 3:
		return "(SELECT '" + k + "')"
	case 4:
		return "format('%s', '" + k + "')"
	case 5:
		return "$$" + k + "$$"
	case 6:
		return "$q$" + k + "$q$"
	case 7:
		return "E'" + strings.ReplaceAll(k, "_", `\137`) + "'"
	case 8:
		return "U&'" + strings.ReplaceAll(k, "_", `\005f`) + "'"
	case 9:
		return "CAST('" + k + "' AS text)"
	}
	return "'" + k + "'"
}

// boolExpr spells false (or true when local) in one of many ways.
func (g *oracleGen) boolExpr(local bool) string {
	if local {
		return g.pick("true", "'t'", "1=1", "NOT false", "true::bool")
	}
	return g.pick("false", "false", "'f'", "'off'", "1=0", "NOT true", "(SELECT false)", "0::bool", "false::text::bool", "NULL::bool IS NOT NULL")
}

// setConfigCall returns a call of set_config in one of its spellings.
func (g *oracleGen) setConfigCall(k, v string, local bool) string {
	fn := g.pick("set_config", "set_config", "pg_catalog.set_config", `"set_config"`, "SET_CONFIG", "pg_catalog . set_config", `"pg_catalog"."set_config"`, "set_config/**/", `U&"set\005fconfig"`)
	return fn + "(" + g.nameExpr(k) + ", " + g.nameExpr(v) + ", " + g.boolExpr(local) + ")"
}

// statement returns one statement without its semicolon.
func (g *oracleGen) statement() string {
	k, v := g.param()
	plainV := strings.Trim(v, "'")
	tn := fmt.Sprintf("ot%d", g.n(3))
	switch g.r.IntN(40) {
	case 0: // SET in its forms
		return g.casing("set") + g.pick(" ", " session ", " SESSION ", " local ") + g.quoteParam(k) + g.pick(" = ", " TO ", " to ") + v
	case 1:
		return g.pick("SET TIME ZONE 'UTC'", "set time zone local", "SET NAMES 'UTF8'", "SET SCHEMA 'public'", "SET XML OPTION DOCUMENT", "set xml option content", "SET SEED TO 0.5")
	case 2:
		return g.casing("reset ") + g.quoteParam(k)
	case 3:
		return g.pick("RESET ALL", "SET "+k+" TO DEFAULT", "SET "+k+" = DEFAULT", "SET "+k+" FROM CURRENT")
	case 4, 5: // set_config
		kk, vv := k, plainV
		if g.r.IntN(4) == 0 {
			// Between two roles that are not superusers no
			// ParameterStatus tells the pooler of the change.
			kk, vv = "role", g.pick("oracle_r2", "oracle_r3")
		}
		return g.pick("SELECT ", "select ", "SELECT 1, ", "SELECT * FROM ") + g.setConfigCall(kk, vv, g.r.IntN(4) == 0)
	case 6:
		return g.pick(
			"SELECT set_config(name, '"+fmt.Sprint(64*g.n(30))+"kB', false) FROM pg_settings WHERE name = 'work_mem'",
			"SELECT set_config(v, 'app9', false) FROM (VALUES ('application_name')) t(v)",
			"SELECT set_config('work_mem', '3MB', l) FROM (VALUES (false)) t(l)",
			"SELECT x FROM (VALUES ("+g.setConfigCall("work_mem", "2MB", false)+")) v(x)",
			"WITH s AS ("+g.setConfigCall(k, plainV, false)+") SELECT 1",
			"SELECT 1 WHERE "+g.setConfigCall(k, plainV, false)+" IS NOT NULL",
			"SELECT set_config(is_local => false, new_value => '"+plainV+"', setting_name => '"+k+"')",
			"SELECT set_config(new_value => 'oracle_r2', setting_name => 'role', is_local => false)",
			"SELECT set_config('ro'::text || 'le', '"+g.pick("oracle_r2", "oracle_r3")+"', false)",
			"SELECT set_config(concat('ro', 'le'), '"+g.pick("oracle_r2", "oracle_r3")+"', false)",
			"COPY (SELECT set_config('work_mem', '2222kB', false)) TO STDOUT",
			"INSERT INTO oracle_t VALUES (3, 'r') RETURNING set_config('"+k+"', '"+plainV+"', false)",
			"SELECT set_config('"+k+"' COLLATE \"C\", '"+plainV+"', false)",
		)
	case 7: // pg_settings writes
		return g.pick("UPDATE pg_settings SET setting = '"+fmt.Sprint(64*g.n(30))+"kB' WHERE name = 'work_mem'",
			"update pg_catalog.pg_settings set setting = 'off' where name = 'enable_seqscan'",
			`UPDATE "pg_settings" SET setting = '5' WHERE name = 'geqo_threshold'`)
	case 8: // identity
		return g.pick("SET ROLE oracle_r2", "SET ROLE oracle_r3", "set role NONE", "RESET ROLE", "SET SESSION ROLE oracle_r2", "SET LOCAL ROLE oracle_r2",
			"SET role = 'oracle_r2'", `SET "role" TO oracle_r2`, "SET SESSION AUTHORIZATION oracle_r2", "RESET SESSION AUTHORIZATION",
			"SET SESSION AUTHORIZATION DEFAULT", "set session characteristics as transaction isolation level serializable",
			"SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", "RESET default_transaction_read_only")
	case 9, 10: // temporary objects
		return g.pick(
			"CREATE TEMP TABLE "+tn+" (a int)", "create temporary table "+tn+"(a int)", "CREATE LOCAL TEMP TABLE "+tn+" (a int)",
			"CREATE GLOBAL TEMPORARY TABLE "+tn+" (a int)", "CREATE TABLE pg_temp."+tn+" (a int)", `CREATE TABLE "pg_temp".`+tn+" (a int)",
			"CREATE TABLE PG_TEMP."+tn+" (a int)", "CREATE UNLOGGED TABLE pg_temp."+tn+" (a int)",
			"SELECT 1 AS a INTO TEMP "+tn, "SELECT 1 AS a INTO TEMPORARY TABLE "+tn, "SELECT 1 AS a INTO pg_temp."+tn,
			"select 1 as a into table pg_temp."+tn, "WITH w AS (SELECT 1 AS a) SELECT * INTO TEMP "+tn+" FROM w",
			"CREATE TABLE pg_temp."+tn+" AS SELECT 1 AS a", "CREATE TEMP TABLE "+tn+" AS SELECT 1 AS a",
			"CREATE TEMP TABLE "+tn+" (a int) ON COMMIT DROP", "CREATE TEMP TABLE "+tn+" (a int) ON COMMIT DELETE ROWS",
			"CREATE TEMP VIEW ov"+tn+" AS SELECT 1", "CREATE VIEW pg_temp.ov"+tn+" AS SELECT 1", "CREATE OR REPLACE TEMP VIEW ov"+tn+" AS SELECT 2",
			"CREATE TEMP SEQUENCE os"+tn, "CREATE SEQUENCE pg_temp.os"+tn,
			"CREATE FUNCTION pg_temp.of"+tn+"() RETURNS int LANGUAGE sql AS 'SELECT 1'",
			"CREATE TYPE pg_temp.oe"+tn+" AS ENUM ('a')", "CREATE TYPE pg_temp.oc"+tn+" AS (a int)",
			"EXPLAIN ANALYZE CREATE TABLE pg_temp."+tn+" AS SELECT 1 AS a", "EXPLAIN (ANALYZE) SELECT 1 AS a INTO pg_temp."+tn,
			"CREATE TABLE IF NOT EXISTS pg_temp."+tn+" (a int)", "CREATE INDEX ON pg_temp."+tn+" (a)",
		)
	case 11:
		return g.pick("DROP TABLE IF EXISTS "+tn, "DROP TABLE IF EXISTS pg_temp."+tn, "DISCARD TEMP", "DROP VIEW IF EXISTS ov"+tn,
			"DROP SEQUENCE IF EXISTS os"+tn, "DROP FUNCTION IF EXISTS pg_temp.of"+tn+"()", "DROP TYPE IF EXISTS pg_temp.oe"+tn)
	case 12: // LISTEN
		ch := fmt.Sprintf("och%d", g.n(3))
		return g.pick("LISTEN "+ch, "listen "+ch, `LISTEN "`+ch+`"`, "UNLISTEN "+ch, "UNLISTEN *", "SELECT pg_notify('"+ch+"', 'x')", "NOTIFY "+ch)
	case 13: // advisory locks
		id := fmt.Sprint(g.n(3))
		return g.pick("SELECT pg_advisory_lock("+id+")", "SELECT pg_try_advisory_lock("+id+")", "SELECT pg_advisory_lock_shared(1, "+id+")",
			"SELECT pg_catalog.pg_advisory_lock("+id+")", `SELECT "pg_advisory_lock"(`+id+")", "SELECT (SELECT pg_advisory_lock("+id+"))",
			"SELECT pg_advisory_xact_lock("+id+")", "SELECT pg_advisory_unlock("+id+")", "SELECT pg_advisory_unlock_all()",
			"SELECT pg_advisory_unlock_shared(1, "+id+")", "SELECT PG_ADVISORY_LOCK("+id+")")
	case 14: // cursors
		c := fmt.Sprintf("oc%d", g.n(3))
		return g.pick("DECLARE "+c+" CURSOR WITH HOLD FOR SELECT 1", "declare "+c+" binary cursor with hold for select 1",
			"DECLARE "+c+" NO SCROLL CURSOR WITH HOLD FOR SELECT * FROM oracle_t", "DECLARE "+c+" CURSOR FOR SELECT 1",
			"DECLARE "+c+" CURSOR WITHOUT HOLD FOR SELECT 1", "CLOSE "+c, "CLOSE ALL", "FETCH "+c, "MOVE "+c)
	case 15: // prepared statements
		p := fmt.Sprintf("op%d", g.n(3))
		return g.pick("PREPARE "+p+" AS SELECT 1", "prepare "+p+"(int) as select $1", "PREPARE "+p+" AS SELECT set_config($1, $2, false)",
			"PREPARE "+p+"(text) AS SELECT set_config('work_mem', $1, false)", "DEALLOCATE "+p, "DEALLOCATE PREPARE "+p, "DEALLOCATE ALL",
			"EXECUTE "+p, "EXECUTE "+p+"(1)", "EXECUTE "+p+"('work_mem', '1234kB')", "EXECUTE "+p+"('4321kB')", "EXPLAIN ANALYZE EXECUTE "+p+"('999kB')")
	case 16:
		return g.pick("DISCARD ALL", "DISCARD PLANS", "DISCARD SEQUENCES", "DISCARD TEMP", "discard temporary")
	case 17: // DO
		return "DO " + g.pick("", "LANGUAGE plpgsql ") + g.pick(
			"$$BEGIN PERFORM set_config('work_mem', '5MB', false); END$$",
			"$$BEGIN EXECUTE 'SET work_mem = 6000'; END$$",
			"$do$BEGIN EXECUTE 'LISTEN och1'; END$do$",
			"$$BEGIN CREATE TEMP TABLE IF NOT EXISTS ot_do (a int); END$$",
			"$$BEGIN PERFORM pg_advisory_lock(7); END$$",
			"$$BEGIN NULL; END$$",
			"$$BEGIN EXECUTE 'SET ROLE oracle_r2'; END$$",
			"$$BEGIN EXECUTE 'SET ROLE oracle_r3'; END$$",
			"$$BEGIN EXECUTE 'SET oracle.custom = ''do'''; END$$",
			"'BEGIN SET LOCAL work_mem = 1234; END'",
		)
	case 18:
		return g.pick("CALL oracle_proc_set('"+fmt.Sprint(64*g.n(30))+"kB')", "call oracle_proc_noop()", "CALL public.oracle_proc_noop()")
	case 19, 20: // user functions
		return g.pick("SELECT oracle_fn_set('work_mem', '"+fmt.Sprint(64*g.n(30))+"kB')", "SELECT oracle_fn_plain(1)",
			"SELECT oracle_fn_temp()", "SELECT oracle_fn_listen()", "SELECT oracle_fn_lock()", "SELECT oracle_fn_role()",
			"SELECT * FROM oracle_t WHERE oracle_fn_set('application_name', 'fn') IS NOT NULL", "SELECT public.oracle_fn_plain(a) FROM oracle_t",
			"SELECT oracle_fn_set('app.tenant_id', 't"+fmt.Sprint(g.n(3))+"')")
	case 21: // triggers and views
		return g.pick("INSERT INTO oracle_trig VALUES (1)", "SELECT * FROM oracle_view", "DELETE FROM oracle_trig")
	case 22, 23, 24: // transaction control
		return g.pick("BEGIN", "START TRANSACTION", "begin isolation level repeatable read", "COMMIT", "END", "ROLLBACK", "ABORT",
			"SAVEPOINT os", "ROLLBACK TO SAVEPOINT os", "RELEASE os", "COMMIT AND CHAIN", "ROLLBACK AND CHAIN")
	case 25: // state hidden in strings and comments
		return g.pick("SELECT 'SET ROLE oracle_r2'", "SELECT $$set_config('role','oracle_r2',false)$$", "/* SET work_mem = 1 */ SELECT 1",
			"SELECT 'a;SET ROLE oracle_r2; --'", `SELECT "set_config" FROM (SELECT 1 AS "set_config") s`, "SELECT E'\\';SET ROLE oracle_r2;'",
			"SELECT $x$ $$ LISTEN och1 $$ $x$", "SELECT 1 -- ; SET ROLE oracle_r2")
	case 26:
		return g.pick("SHOW work_mem", "SELECT current_setting('work_mem')", "EXPLAIN SELECT 1", "SELECT count(*) FROM pg_settings",
			"SHOW ALL", "SELECT current_user", "VALUES (1), (2)", "TABLE oracle_t LIMIT 1")
	}
	// Plain statements: most of the traffic.
	return g.pick("SELECT 1", "select 2", "SELECT * FROM oracle_t LIMIT 1", "INSERT INTO oracle_t VALUES (1, 'x')",
		"UPDATE oracle_t SET b = 'y' WHERE a = 1", "DELETE FROM oracle_t WHERE a > 100", "SELECT now()", "SELECT oracle_fn_plain(2)",
		"SELECT pg_backend_pid()", "SELECT a, b FROM oracle_t WHERE b LIKE 'x%'", "SELECT length('"+strings.Repeat("z", g.r.IntN(20))+"')")
}

// text returns one simple-Query text: usually one statement, sometimes a
// block or several statements separated by semicolons.
func (g *oracleGen) text() string {
	var b strings.Builder
	switch g.r.IntN(10) {
	case 0, 1:
		for i, n := 0, 1+g.n(3); i < n; i++ {
			b.WriteString(g.statement())
			b.WriteString(g.ws() + ";" + g.ws())
		}
	case 2:
		b.WriteString(g.pick("BEGIN", "START TRANSACTION") + ";" + g.ws())
		for i, n := 0, g.n(3); i < n; i++ {
			b.WriteString(g.statement() + ";" + g.ws())
		}
		b.WriteString(g.pick("COMMIT", "ROLLBACK", "END"))
	default:
		b.WriteString(g.ws())
		b.WriteString(g.statement())
		if g.r.IntN(2) == 0 {
			b.WriteString(";")
		}
	}
	return b.String()
}
