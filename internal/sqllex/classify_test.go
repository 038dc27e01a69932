package sqllex

import (
	"testing"
)

// classifyCases pairs SQL text with the flags and statement count Classify
// must report.
var classifyCases = []struct {
	sql   string
	flags Flags
	count int
}{
	// Nothing, or nothing of interest.
	{"", 0, 0},
	{"  \n\t ", 0, 0},
	{";;;", 0, 0},
	{"-- only a comment", 0, 0},
	{"/* only /* nested */ a comment */ ;", 0, 0},
	{"SELECT * FROM t WHERE id = $1", 0, 1},
	{"select 1; select 2;", 0, 2},
	{"SELECT 1;;SELECT 2", 0, 2},
	{"SHOW role", 0, 1},
	{"VALUES (1), (2)", 0, 1},

	// SET ROLE in every spelling.
	{"SET ROLE bob", SetRole, 1},
	{"set role 'bob'", SetRole, 1},
	{"SET ROLE NONE", SetRole, 1},
	{"SET SESSION ROLE bob", SetRole, 1},
	{"SET LOCAL ROLE bob", SetRoleLocal, 1},
	{"SET role = bob", SetRole, 1},
	{"SET role TO 'bob'", SetRole, 1},
	{"SET ROLE TO DEFAULT", SetRole, 1},
	{`SET "role" = bob`, SetRole, 1},
	{`SET "ROLE" = bob`, SetRole, 1},
	{"SET LOCAL role = bob", SetRoleLocal, 1},
	{"SET SESSION role TO bob", SetRole, 1},
	{"RESET ROLE", ResetRole, 1},
	{"reset role;", ResetRole, 1},
	{`RESET "role"`, ResetRole, 1},
	{"SET/*x*/ROLE bob", SetRole, 1},
	{"SET--x\nROLE bob", SetRole, 1},
	{"  set\n\trole\r\nbob  ", SetRole, 1},
	{"SeT RoLe bob", SetRole, 1},
	{"SET role.x = 1", SetParam, 1},
	{"SET myapp.role = 1", SetParam, 1},
	{"SET rolex = 1", SetParam, 1},

	// SESSION AUTHORIZATION.
	{"SET SESSION AUTHORIZATION 'alice'", SetSessionAuth, 1},
	{"set  session\nauthorization 'x'", SetSessionAuth, 1},
	{"SET SESSION AUTHORIZATION DEFAULT", SetSessionAuth, 1},
	{"SET SESSION SESSION AUTHORIZATION alice", SetSessionAuth, 1},
	{"SET LOCAL SESSION AUTHORIZATION alice", SetSessionAuthLocal, 1},
	{"SET session_authorization = 'alice'", SetSessionAuth, 1},
	{"SET LOCAL session_authorization TO alice", SetSessionAuthLocal, 1},
	{"RESET SESSION AUTHORIZATION", ResetSessionAuth, 1},
	{"RESET session_authorization", ResetSessionAuth, 1},
	{"SET SESSION/**/AUTHORIZATION alice", SetSessionAuth, 1},

	// SESSION CHARACTERISTICS and transaction-scoped settings.
	{"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE", SessionCharacteristics, 1},
	{"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", SetTransaction, 1},
	{"SET TRANSACTION SNAPSHOT '00000003-0000001B-1'", SetTransaction, 1},
	{"SET SESSION TRANSACTION READ ONLY", SetTransaction, 1},
	{"SET CONSTRAINTS ALL DEFERRED", SetTransaction, 1},

	// Other parameters.
	{"SET search_path TO public, app", SetParam, 1},
	{"SET search_path = DEFAULT", SetParam, 1},
	{"SET LOCAL statement_timeout = '5s'", SetParamLocal, 1},
	{"SET SESSION statement_timeout = 0", SetParam, 1},
	{"SET TIME ZONE 'UTC'", SetParam, 1},
	{"SET LOCAL TIME ZONE LOCAL", SetParamLocal, 1},
	{"SET NAMES 'UTF8'", SetParam, 1},
	{"SET SCHEMA 'app'", SetParam, 1},
	{"SET XML OPTION DOCUMENT", SetParam, 1},
	{"SET myapp.user_id = 42", SetParam, 1},
	{`SET "MyApp".user_id TO '42'`, SetParam, 1},
	{"SET local.x = 1", SetParam, 1},
	{"SET work_mem FROM CURRENT", SetParam, 1},
	{"RESET search_path", ResetParam, 1},
	{"RESET TIME ZONE", ResetParam, 1},
	{"RESET TRANSACTION ISOLATION LEVEL", ResetParam, 1},
	{"RESET myapp.user_id", ResetParam, 1},
	{"RESET ALL", ResetAll, 1},
	{`RESET "all"`, ResetParam, 1},

	// set_config.
	{"SELECT set_config('role', 'bob', false)", SetConfig | SetRole, 1},
	{"SELECT set_config('role', 'bob', true)", SetConfig | SetRoleLocal, 1},
	{"SELECT set_config('ROLE', 'bob', 'on')", SetConfig | SetRoleLocal, 1},
	{"SELECT set_config('role', 'bob', 't')", SetConfig | SetRoleLocal, 1},
	{"SELECT set_config('role', 'bob', 'of')", SetConfig | SetRole, 1},
	{"SELECT set_config('role', 'bob', NULL)", SetConfig | SetRole, 1},
	{"SELECT set_config('role', 'bob', $1)", SetConfig | SetRole, 1},
	{"SELECT set_config('role', 'bob', 1 = 1)", SetConfig | SetRole, 1},
	{"SELECT set_config('role', 'bob')", SetConfig | SetRole, 1},
	{"SELECT SET_CONFIG('Session_Authorization', 'x', FALSE)", SetConfig | SetSessionAuth, 1},
	{"SELECT pg_catalog.set_config('session_authorization', 'x', true)", SetConfig | SetSessionAuthLocal, 1},
	{`SELECT "set_config"('role', 'x', false)`, SetConfig | SetRole, 1},
	{`SELECT "SET_CONFIG"('role', 'x', false)`, OpaqueCall, 1},
	{"SELECT set_config('role'::text, 'x', false)", SetConfig | SetRole, 1},
	{"SELECT set_config($$role$$, 'x', false)", SetConfig | SetRole, 1},
	{"SELECT set_config(E'\\x72ole', 'x', false)", SetConfig | SetRole, 1},
	{"SELECT set_config(U&'r\\006Fle', 'x', false)", SetConfig | SetRole, 1},
	{"SELECT set_config(U&'r!006Fle' UESCAPE '!', 'x', false)", SetConfig | SetRole, 1},
	{"SELECT set_config('ro'\n'le', 'x', false)", SetConfig | SetRole, 1},
	{"SELECT set_config('ro' -- split\n  'le', 'x', false)", SetConfig | SetRole, 1},
	{"SELECT set_config('ro' 'le', 'x', false)", SetConfig | UnsureIdentity | SetParam, 1}, // no newline: a syntax error
	{"SELECT set_config('search_path', 'app', false)", SetConfig | SetParam, 1},
	{"SELECT set_config('search_path', 'app', true)", SetConfig | SetParamLocal, 1},
	{"SELECT set_config('a_very_long_parameter_name_indeed', 'x', false)", SetConfig | SetParam, 1},
	{"SELECT set_config($1, $2, false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config(name, 'x', false) FROM t", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config('ro' || 'le', 'x', false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config(('role'), 'x', false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config(", SetConfig | UnsureIdentity | SetParam | Incomplete, 1},
	{"SELECT set_config(is_local => true, new_value => 'x', setting_name => 'role')", SetConfig | SetRoleLocal, 1},
	{"SELECT set_config('role', new_value := 'x', is_local := false)", SetConfig | SetRole, 1},
	{"SELECT set_config(setting_name => lower('ROLE'), new_value => 'x', is_local => false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config('role', array_to_string(ARRAY['a', 'b'], ','), true)", SetConfig | SetRoleLocal, 1},
	{"SELECT set_config('role', coalesce(x, 'y'), false), set_config('search_path', 'p', true) FROM t",
		SetConfig | SetRole | SetParamLocal, 1},
	{"SELECT set_config('role', set_config('search_path', 'p', false), true)", SetConfig | SetRoleLocal | SetParam, 1},
	{"SELECT set_config FROM t", 0, 1},
	{"SELECT my_set_config('role', 'x', false)", OpaqueCall, 1},
	{"SELECT 'set_config(''role'', ''x'', false)'", 0, 1},
	{"WITH s AS (SELECT set_config('role', 'x', false)) SELECT * FROM s", SetConfig | SetRole, 1},
	{"UPDATE t SET a = set_config('role', 'x', false)", SetConfig | SetRole, 1},

	// Advisory locks.
	{"SELECT pg_advisory_lock(1)", AdvisoryLock, 1},
	{"SELECT pg_try_advisory_lock_shared(1, 2)", AdvisoryLock, 1},
	{"SELECT pg_advisory_xact_lock(1)", 0, 1},
	{"SELECT pg_advisory_lock", 0, 1},

	// Transaction control.
	{"BEGIN", Begin, 1},
	{"begin transaction isolation level serializable", Begin, 1},
	{"START TRANSACTION READ ONLY", Begin, 1},
	{"START foo", 0, 1},
	{"COMMIT", Commit, 1},
	{"COMMIT WORK", Commit, 1},
	{"COMMIT AND CHAIN", Commit | Chain, 1},
	{"COMMIT TRANSACTION AND NO CHAIN", Commit, 1},
	{"END", Commit, 1},
	{"END AND CHAIN", Commit | Chain, 1},
	{"ROLLBACK", Rollback, 1},
	{"ROLLBACK WORK AND CHAIN", Rollback | Chain, 1},
	{"ABORT", Rollback, 1},
	{"ABORT AND CHAIN", Rollback | Chain, 1},
	{"SAVEPOINT sp1", Savepoint, 1},
	{"RELEASE SAVEPOINT sp1", Release, 1},
	{"RELEASE sp1", Release, 1},
	{"ROLLBACK TO SAVEPOINT sp1", RollbackTo, 1},
	{"ROLLBACK TRANSACTION TO sp1", RollbackTo, 1},
	{"PREPARE TRANSACTION 'gid1'", PrepareTransaction, 1},
	{"COMMIT PREPARED 'gid1'", CommitPrepared, 1},
	{"ROLLBACK PREPARED 'gid1'", RollbackPrepared, 1},
	{"BEGIN; SET LOCAL ROLE bob; SELECT 1; COMMIT", Begin | SetRoleLocal | Commit, 4},

	// SQL-level prepared statements and DISCARD.
	{"PREPARE q1 AS SELECT 1", Prepare, 1},
	{"PREPARE q1 (int, text) AS SELECT $1, $2", Prepare, 1},
	{"PREPARE transaction AS SELECT 1", Prepare, 1},
	{"EXECUTE q1", Execute, 1},
	{"EXECUTE q1(1, 'a')", Execute, 1},
	{"DEALLOCATE q1", Deallocate, 1},
	{"DEALLOCATE PREPARE q1", Deallocate, 1},
	{"DEALLOCATE ALL", Deallocate | DeallocateAll, 1},
	{"DEALLOCATE PREPARE ALL", Deallocate | DeallocateAll, 1},
	{`DEALLOCATE "all"`, Deallocate, 1},
	{"DISCARD ALL", DiscardAll, 1},
	{"DISCARD PLANS", DiscardPlans, 1},
	{"DISCARD SEQUENCES", DiscardSequences, 1},
	{"DISCARD TEMP", DiscardTemp, 1},
	{"DISCARD TEMPORARY", DiscardTemp, 1},
	{"EXPLAIN EXECUTE q1", Execute, 1},
	{"EXPLAIN (ANALYZE, BUFFERS) EXECUTE q1(1)", Execute, 1},

	// Other session-bound statements.
	{"COPY t FROM STDIN", Copy, 1},
	{"copy (select 1) to stdout", Copy, 1},
	{"LISTEN chan", Listen, 1},
	{"UNLISTEN *", Unlisten, 1},
	{"NOTIFY chan, 'payload'", Notify, 1},
	{"DECLARE c CURSOR FOR SELECT 1", DeclareCursor, 1},
	{"DECLARE c BINARY INSENSITIVE NO SCROLL CURSOR WITH HOLD FOR SELECT 1", DeclareCursor | DeclareHold, 1},
	{"DECLARE c SCROLL CURSOR WITHOUT HOLD FOR SELECT 1", DeclareCursor, 1},
	{"CREATE TEMP TABLE t (a int)", CreateTemp, 1},
	{"CREATE TEMPORARY TABLE t AS SELECT 1", CreateTemp, 1},
	{"CREATE GLOBAL TEMPORARY TABLE t (a int)", CreateTemp, 1},
	{"CREATE LOCAL TEMP SEQUENCE s", CreateTemp, 1},
	{"CREATE OR REPLACE TEMP VIEW v AS SELECT 1", CreateTemp, 1},
	{"CREATE TABLE pg_temp.t (a int)", CreateTemp, 1},
	{`CREATE FUNCTION "pg_temp".f() RETURNS int LANGUAGE sql AS 'SELECT 1'`, CreateTemp, 1},
	{"CREATE TABLE pg_temp_3.t (a int)", CreateTemp, 1},
	{"CREATE TABLE temp (a int)", 0, 1},
	{"CREATE TABLE t (a int)", 0, 1},
	{"CREATE TABLE pg_temporary.t (a int)", 0, 1},
	{"SELECT * INTO TEMP t FROM s", CreateTemp, 1},
	{"SELECT * INTO LOCAL TEMPORARY TABLE t FROM s", CreateTemp, 1},
	{"INSERT INTO temp VALUES (1)", 0, 1},
	{"WITH x AS (SELECT 1) INSERT INTO temp SELECT * FROM x", 0, 1},
	{"EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1", CreateTemp, 1},
	{"DO $$BEGIN EXECUTE 'SET ROLE bob'; END$$", DoBlock, 1},
	{"DO LANGUAGE plpgsql 'BEGIN NULL; END'", DoBlock, 1},
	{"CALL p(1)", Call, 1},
	{"LOAD 'auto_explain'", Load, 1},
	{"CLOSE c", CloseCursor, 1},
	{"close all", CloseCursor, 1},
	{"DROP TABLE t", Drop, 1},
	{"SELECT pg_advisory_unlock(1)", AdvisoryUnlock, 1},
	{"SELECT pg_catalog.pg_advisory_unlock_all()", AdvisoryUnlock, 1},
	{`SELECT "pg_advisory_unlock_shared"(1, 2), pg_advisory_lock(3)`, AdvisoryUnlock | AdvisoryLock, 1},
	{"SELECT pg_advisory_xact_lock(1), pg_try_advisory_xact_lock_shared(2)", 0, 1},
	{"SELECT pg_advisory_unlock_all", 0, 1},

	// Keywords inside strings, comments, dollar quotes and identifiers.
	{"SELECT 'SET ROLE x'", 0, 1},
	{"SELECT 'a; SET ROLE x'", 0, 1},
	{"SELECT $$; SET ROLE x$$", 0, 1},
	{"SELECT $fn$; SET ROLE x; $$ $fn$", 0, 1},
	{"SELECT $a$ $b$; SET ROLE x; $b$ $a$", 0, 1},
	{"SELECT 1 -- ; SET ROLE x", 0, 1},
	{"SELECT 1 /* ; SET ROLE x */", 0, 1},
	{"SELECT 1 /* /* ; */ SET ROLE x */", 0, 1},
	{`SELECT 1 AS "; SET ROLE x"`, 0, 1},
	{`SELECT 1 AS "a"";SET ROLE x"`, 0, 1},
	{"SELECT E'\\'; SET ROLE x'", 0, 1},
	{"SELECT e'\\\\'; SET ROLE x", SetRole, 2},
	{"SELECT U&'\\0041'; SET ROLE x", SetRole, 2},
	{"SELECT 'it''s'; SET ROLE x", SetRole, 2},
	{"SELECT b'1010'; SET ROLE x", SetRole, 2},
	{"SELECT x'ff'; SET ROLE x", SetRole, 2},
	{"SELECT n'a'; SET ROLE x", SetRole, 2},
	{"SELECT a$$; SET ROLE x$$", SetRole, 2}, // a$$ is an identifier, not a dollar quote
	{"SELECT 1$$; SET ROLE x$$", 0, 1},       // a number ends before the dollar quote
	{"SELECT $1$$; SET ROLE x$$", 0, 1},      // so does a parameter
	{"SELECT $x; SET ROLE y", SetRole, 2},    // "$x" opens no dollar quote
	{"SELECT 1 ---; SET ROLE x\n", 0, 1},
	{"SELECT 1 +--; SET ROLE x\n", 0, 1},
	{"SELECT 1 */; SET ROLE x", SetRole, 2},
	{"SELECT 1; SET ROLE x -- ; RESET ROLE", SetRole, 2},

	// Only the first keywords decide.
	{"EXPLAIN ANALYZE SELECT 1", 0, 1},
	{"EXPLAIN SET ROLE x", 0, 1},
	{"CREATE FUNCTION f() RETURNS int LANGUAGE sql SET role = 'x' AS 'SELECT 1'", 0, 1},
	{"ALTER ROLE bob SET search_path = app", 0, 1},
	{"ALTER DATABASE d SET role = 'x'", 0, 1},
	{"CREATE FUNCTION f() RETURNS int SET search_path = app AS $$ SET ROLE x $$ LANGUAGE sql", 0, 1},
	{"UPDATE t SET role = 'x'", 0, 1},
	{"SELECT * FROM role", 0, 1},
	{"WITH x AS (SELECT 1) SELECT 1", 0, 1},

	// BEGIN ATOMIC bodies hold semicolons that do not end the statement.
	{"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END; SET ROLE x",
		SetRole, 2},
	{"CREATE OR REPLACE PROCEDURE p() LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN true THEN 1 END; END; RESET ROLE",
		ResetRole, 2},
	{"create function f(begin int) returns int language sql return begin; SET ROLE x", SetRole, 2},
	// A routine's body does not run when it is created; a CREATE TABLE AS does.
	{"CREATE FUNCTION f() RETURNS text LANGUAGE sql RETURN set_config('role', 'x', false)", 0, 1},
	{"CREATE FUNCTION f() RETURNS text LANGUAGE sql BEGIN ATOMIC SELECT set_config('role', 'x', false); END", 0, 1},
	{`CREATE PROCEDURE p() LANGUAGE sql BEGIN ATOMIC SELECT "set_config"('role', 'x', false); END`, 0, 1},
	{"CREATE TABLE t AS SELECT set_config('role', 'x', false)", SetConfig | SetRole, 1},
	{"CREATE VIEW v AS SELECT pg_advisory_lock(1)", AdvisoryLock, 1},
	{"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SET ROLE x", Incomplete, 1},
	{"CREATE TABLE begin_atomic (a int); BEGIN", Begin, 2},

	// Unterminated or unbalanced text.
	{"SELECT 'abc", Incomplete, 1},
	{"SELECT 'abc''", Incomplete, 1},
	{"SELECT E'abc\\'", Incomplete, 1},
	{`SELECT "abc`, Incomplete, 1},
	{"SELECT $$abc", Incomplete, 1},
	{"SELECT $a$abc$b$", Incomplete, 1},
	{"SELECT 1 /* abc", Incomplete, 1},
	{"SELECT 1 /* /* */ abc", Incomplete, 1},
	{"SELECT (1", Incomplete, 1},
	{"SET ROLE bob; SELECT '", SetRole | Incomplete, 2},
	{"SET ROLE bob; /*", SetRole | Incomplete, 2},
	{"SELECT U&'\\0041' UESCAPE '", Incomplete, 1},

	// standard_conforming_strings: a backslash in a plain string.
	{"SELECT 'C:\\temp'", 0, 1},
	{"SELECT '\\'; SET ROLE x; --'", SetRole | Ambiguous, 2},
	{"SELECT 'a\\'; SET ROLE x'; SELECT 1", SetRole | Incomplete | Ambiguous, 2},
	{"SELECT 'a\\', 'b'; SET ROLE x; SELECT '", SetRole | Incomplete | Ambiguous, 3},
	{"SELECT E'\\'; SET ROLE x'", 0, 1},

	// set_config arguments count only as exactly one constant, perhaps cast.
	{"SELECT set_config('search_path', 'evil', true::boolean AND false)", SetConfig | SetParam, 1},
	{"SELECT set_config('search_path', 'evil', true OR false)", SetConfig | SetParam, 1},
	{"SELECT set_config('search_path', 'evil', 't'::boolean)", SetConfig | SetParamLocal, 1},
	{"SELECT set_config('search_path', 'evil', false::bool)", SetConfig | SetParam, 1},
	{"SELECT set_config('search_path', 'evil', true::pg_catalog.bool)", SetConfig | SetParamLocal, 1},
	{"SELECT set_config('search_path', 'evil', 'on'::text::bool)", SetConfig | SetParamLocal, 1},
	{"SELECT set_config('search_path', 'evil', $$yes$$)", SetConfig | SetParamLocal, 1},
	{"SELECT set_config('search_path', 'evil', (true))", SetConfig | SetParam, 1},
	{"SELECT set_config('search_path', 'evil', NOT false)", SetConfig | SetParam, 1},
	{"SELECT set_config('search_path', 'evil', true COLLATE \"C\")", SetConfig | SetParam, 1},
	{"SELECT set_config('ro'::text || 'le', 'r2', false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config('ro'::text||'le', 'r2', true)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config('role'::varchar, 'r2', false)", SetConfig | SetRole, 1},
	{"SELECT set_config('role'::pg_catalog.text, 'r2', false)", SetConfig | SetRole, 1},
	{"SELECT set_config('roleX'::varchar(4), 'r2', false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config('search_path'::app.mytext, 'r2', false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config('role'::text[], 'r2', false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config('role'::\"char\", 'r2', false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config('search_path', 'evil', true::app.mybool)", SetConfig | SetParam, 1},
	{"SELECT set_config('search_path', 'evil', 'yes'::text::boolean)", SetConfig | SetParamLocal, 1},
	{"SELECT set_config('role'::text COLLATE \"C\", 'r2', false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config(text 'role', 'r2', false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config(E'ro' 'le', 'r2', false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT set_config((SELECT 'role'), 'r2', false)", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT pg_catalog.set_config('role', 'r2', false)", SetConfig | SetRole, 1},
	{`SELECT "pg_catalog"."set_config"('role', 'r2', true)`, SetConfig | SetRoleLocal, 1},
	{"SELECT public.set_config('role', 'r2', false)", OpaqueCall, 1},

	// Writes to pg_settings call set_config for a name the text hides.
	{"UPDATE pg_settings SET setting = 'evil' WHERE name = 'search_path'", SetConfig | UnsureIdentity | SetParam, 1},
	{"update ONLY pg_catalog.pg_settings SET setting = 'r2' WHERE name = 'role'", SetConfig | UnsureIdentity | SetParam, 1},
	{`UPDATE "pg_catalog"."pg_settings" s SET setting = 'x'`, SetConfig | UnsureIdentity | SetParam, 1},
	{"WITH x AS (SELECT 1) UPDATE pg_settings SET setting = 'x' WHERE name = 'search_path'", SetConfig | UnsureIdentity | SetParam, 1},
	{"INSERT INTO pg_settings (name, setting) VALUES ('role', 'x')", SetConfig | UnsureIdentity | SetParam, 1},
	{"DELETE FROM pg_settings", SetConfig | UnsureIdentity | SetParam, 1},
	{"MERGE INTO pg_catalog.pg_settings s USING t ON true WHEN MATCHED THEN DO NOTHING", SetConfig | UnsureIdentity | SetParam, 1},
	{"SELECT * FROM pg_settings WHERE name = 'search_path'", 0, 1},
	{"UPDATE app.pg_settings SET setting = 'x'", 0, 1},
	{"UPDATE t SET a = 1 FROM pg_settings", 0, 1},
	{"SELECT * FROM pg_settings FOR UPDATE", 0, 1},

	// SELECT INTO a table of the temporary schema.
	{"SELECT 1 INTO pg_temp.leak", CreateTemp, 1},
	{"SELECT * INTO TABLE pg_temp.leak FROM t", CreateTemp, 1},
	{`SELECT 1 INTO "pg_temp".leak`, CreateTemp, 1},
	{"SELECT 1 INTO pg_temp_7.leak", CreateTemp, 1},
	{"SELECT 1 INTO TABLE TEMP leak", CreateTemp, 1},
	{"CREATE TABLE pg_temp.x AS SELECT 1", CreateTemp, 1},
	{"CREATE UNLOGGED TABLE IF NOT EXISTS pg_temp.x AS SELECT 1", CreateTemp, 1},
	{"EXPLAIN ANALYZE SELECT 1 INTO pg_temp.leak", CreateTemp, 1},
	{"SELECT 1 INTO pg_temp", 0, 1},
	{"INSERT INTO pg_temp.t VALUES (1)", 0, 1},

	// Functions that act on other server processes or the server.
	{"SELECT pg_terminate_backend(pg_backend_pid())", OtherBackend, 1},
	{"SELECT pg_catalog.pg_cancel_backend(42)", OtherBackend, 1},
	{"SELECT pg_reload_conf()", OtherBackend, 1},
	{"SELECT lastval()", SequenceRead, 1},
	{"SELECT pg_catalog.currval('s'), nextval('s')", SequenceRead, 1},
	{"SELECT CURRVAL ('s')", SequenceRead, 1},
	{"select PG_ROTATE_LOGFILE()", OtherBackend, 1},

	// Function calls: built-ins and syntax are plain, the rest opaque.
	{"SELECT now(), lower(name), count(*), pg_backend_pid() FROM t", 0, 1},
	{"SELECT int4('1'), text(1), date(now()), pg_catalog.upper('x')", 0, 1},
	{"SELECT coalesce(a, 1), greatest(1, 2), least(1, 2), nullif(a, b) FROM t", 0, 1},
	{"SELECT cast(a AS numeric(10, 2)), extract(year FROM now()), a::varchar(10) FROM t", 0, 1},
	{"SELECT overlay('abc' placing 'x' from 2), position('a' in 'b'), substring('abc' from 1 for 2), trim(both ' ' from 'a')", 0, 1},
	{"SELECT xmlelement(name a, xmlattributes(1 AS b)), row(1, 2), array(SELECT 1)", 0, 1},
	{"SELECT * FROM t WHERE exists (SELECT 1) AND a IN (1, 2) AND b = any($1)", 0, 1},
	{"SELECT count(*) FILTER (WHERE a) OVER (PARTITION BY b ORDER BY (c)) FROM t GROUP BY ROLLUP (a), CUBE (b), GROUPING SETS ((a))", 0, 1},
	{"INSERT INTO t (a, b) VALUES (1, 2) ON CONFLICT (a) DO UPDATE SET (a, b) = (1, 2)", 0, 1},
	{"INSERT INTO app.t (a) SELECT 1 RETURNING (a)", 0, 1},
	{"WITH RECURSIVE c (n) AS (SELECT 1) SELECT * FROM c AS x (m) JOIN t USING (n)", 0, 1},
	{"SELECT 1 FROM t TABLESAMPLE bernoulli (10)", 0, 1},
	{"SELECT 'x'::vector(3), CAST(1 AS mytype(2))", 0, 1},
	{"SELECT a FROM t LIMIT (1) FETCH FIRST (2) ROWS ONLY", 0, 1},
	{"SELECT (a, b) OVERLAPS (c, d), left('abc', 1) FROM t", 0, 1},
	{"SELECT my_func(1)", OpaqueCall, 1},
	{"SELECT * FROM t WHERE app.check_access(id)", OpaqueCall, 1},
	{`SELECT "Now"()`, OpaqueCall, 1},
	{"SELECT pg_temp.f()", OpaqueCall, 1},
	{"SELECT dblink_exec('x', 'SET ROLE r2')", OpaqueCall, 1},
	{"SELECT setseed(0.5)", OpaqueCall | ProcessState, 1},
	{"SELECT public.dblink_connect('c', 'dbname=x')", OpaqueCall | ProcessState, 1},
	{"SELECT 1 FROM pg_create_logical_replication_slot('s', 'test_decoding', true)", OpaqueCall | ProcessState, 1},
	{"SELECT query_to_xml('SELECT * FROM v', true, false, '')", OpaqueCall, 1},
	{"SELECT * FROM pg_catalog.ts_stat('SELECT t FROM docs')", OpaqueCall, 1},
	{"SELECT table_to_xml('v'::regclass, true, false, ''), nextval('s'::regclass)", OpaqueCall, 1},
	{"SELECT domain_in('5', 'posint'::regtype, -1) IS NULL", OpaqueCall, 1},
	{"SELECT brin_summarize_range('i'::regclass, 0)", OpaqueCall, 1},
	{"SELECT * FROM t JOIN u ON my_match(t.a, u.b)", OpaqueCall, 1},
	{"SELECT count(*) FROM t, LATERAL unnest(a), LATERAL my_srf(b)", OpaqueCall, 1},
	{"SELECT 1 FROM t WHERE a = " + "1" + " AND lower(my_func(a)) = 'x'", OpaqueCall, 1},
	{"PREPARE p (int) AS SELECT my_func($1)", Prepare | OpaqueCall, 1},
	{"PREPARE p (int) AS SELECT $1", Prepare, 1},
	{"COPY t (a, b) FROM STDIN", Copy, 1},
	{"DROP FUNCTION my_func(int)", Drop, 1},
	{"CREATE FUNCTION f(a int) RETURNS int LANGUAGE sql RETURN my_func(a)", 0, 1},
	{"CREATE TABLE t (a varchar(10) CHECK (a <> ''), b int REFERENCES u (id), PRIMARY KEY (a))", 0, 1},
}

// TestClassify checks classifyCases; SchemaChange, set on every CREATE,
// ALTER and DROP, is left out of them and checked by TestSchemaChange.
func TestClassify(t *testing.T) {
	for _, tc := range classifyCases {
		got := Classify(tc.sql)
		got.Flags &^= SchemaChange
		if got.Flags != tc.flags || got.Statements != tc.count {
			t.Errorf("Classify(%q) = %v, %d statements; want %v, %d", tc.sql, got.Flags, got.Statements, tc.flags, tc.count)
		}
	}
}

// TestClassifyAgreesWithStatements checks on every table entry that
// Classify reports what Statements does, statement by statement.
// TestSchemaChange: CREATE, ALTER and DROP of anything are schema changes,
// in any statement of a text; a keyword in a string, a comment or a
// quoted identifier is not.
func TestSchemaChange(t *testing.T) {
	for sql, want := range map[string]bool{
		"CREATE TEMP TABLE t (a int)":     true,
		"create table t (a int)":          true,
		"ALTER TABLE t ADD COLUMN b text": true,
		"DROP TABLE IF EXISTS t":          true,
		"SELECT 1; drop view v":           true,
		"CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'": true,
		"SELECT 'create table t'":                               false,
		"SELECT 1 -- drop table t":                              false,
		`SELECT "alter" FROM t`:                                 false,
		"INSERT INTO t VALUES (1)":                              false,
		"SELECT $$ ALTER TABLE t $$":                            false,
		"SELECT 1 AS a INTO t":                                  true,
		"SELECT * INTO TABLE t FROM s":                          true,
		"INSERT INTO t SELECT 1":                                false,
		"MERGE INTO t USING s ON true WHEN MATCHED THEN DELETE": false,
	} {
		if got := Classify(sql).Flags&SchemaChange != 0; got != want {
			t.Errorf("Classify(%q) SchemaChange = %v, want %v", sql, got, want)
		}
	}
}

func TestClassifyAgreesWithStatements(t *testing.T) {
	for _, tc := range classifyCases {
		checkAgreement(t, tc.sql)
	}
}

// checkAgreement checks that the statements of sql lie in order within it
// and that Classify summarises them.
func checkAgreement(t *testing.T, sql string) {
	t.Helper()
	var union Flags
	n, prevEnd := 0, 0
	for st := range Statements(sql) {
		if st.Start < prevEnd || st.End <= st.Start || st.End > len(sql) {
			t.Fatalf("%q: statement %d spans [%d,%d) after %d", sql, n, st.Start, st.End, prevEnd)
		}
		prevEnd = st.End
		union |= st.Flags
		n++
	}
	got := Classify(sql)
	if got.Flags&Ambiguous == 0 {
		if got.Flags != union || got.Statements != n {
			t.Fatalf("%q: Classify = %v, %d; Statements = %v, %d", sql, got.Flags, got.Statements, union, n)
		}
		return
	}
	if union&^got.Flags != 0 || union&Ambiguous == 0 || got.Statements < n {
		t.Fatalf("%q: ambiguous Classify = %v, %d; Statements = %v, %d", sql, got.Flags, got.Statements, union, n)
	}
}
