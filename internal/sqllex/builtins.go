package sqllex

import "bytes"

// Function calls.
//
// A call a statement makes may change the session in ways its text does
// not show: a user-defined function can run SET ROLE, set_config, CREATE
// TEMP or LISTEN. The lexer cannot read function bodies, so it sorts every
// name followed by "(" by a fixed rule, erring towards "opaque":
//
//   - SQL syntax is not a call: PostgreSQL 15's reserved, column-name and
//     type/function-name keywords (coalesce, exists, cast, extract,
//     overlay, position, substring, trim, xmlelement, numeric, varchar,
//     left, join…; pgKeywords) and a few unreserved keywords that take a
//     parenthesised list (VALUES, ON CONFLICT (…), SET (…), FILTER, OVER,
//     BY, CUBE, ROLLUP… ; syntaxWords);
//   - a name that is itself named, not called, is not a call: one right
//     after INTO, TABLE, AS, REFERENCES, ONLY, VIEW, WITH, RECURSIVE,
//     EXISTS, FUNCTION, PROCEDURE, ROUTINE, AGGREGATE, PREPARE, EXECUTE,
//     COPY or VACUUM, or after "::" (a type modifier), qualified or not:
//     INSERT INTO t (a, b), WITH c (x) AS, AS t (a, b), 'x'::vector(3);
//   - set_config, the advisory lock functions and the functions that act
//     on other server processes have flags of their own (SetConfig,
//     AdvisoryLock, AdvisoryUnlock, OtherBackend);
//   - any other name, unqualified or qualified by pg_catalog, is plain
//     when it is a PostgreSQL 15 built-in function (pg_proc in
//     pg_catalog; pgBuiltins) that does not change session state
//     (sessionBuiltins lists those that do);
//   - everything else is OpaqueCall: user-defined and extension functions
//     (dblink…), and anything qualified by another schema (pg_temp.f()).
//
// A function in a schema on search_path that shadows a built-in's name
// (possible only when search_path lists pg_catalog after it) is taken for
// the built-in. Operators are not calls, though one may be implemented by
// a user-defined function. The lists are generated from a real PostgreSQL
// 15 by TestBuiltinsMatchPostgres (builtins_gen.go), which also checks the
// committed lists against the server.

// syntaxWords are unreserved keywords that PostgreSQL's grammar follows
// with a parenthesised list of its own, so "word (" is not a call.
var syntaxWords = map[string]struct{}{
	"values": {}, "conflict": {}, "set": {}, "filter": {}, "over": {}, "within": {},
	"by": {}, "cube": {}, "rollup": {}, "sets": {}, "include": {}, "options": {},
	"key": {}, "varying": {}, "materialized": {}, "first": {}, "next": {},
	"insert": {}, "copy": {}, "vacuum": {}, "explain": {}, "reindex": {},
	"cluster": {},
}

// sessionBuiltins are built-ins that change session state no other flag
// names, so a call of one is OpaqueCall; so is every binary_upgrade_*
// function (they set the OIDs the session's next objects get). set_config
// and the advisory lock functions are read by their own rules and never
// reach this list.
var sessionBuiltins = map[string]struct{}{
	"setseed":                             {}, // the session's random() sequence
	"pg_replication_origin_session_setup": {},
	"pg_replication_origin_session_reset": {},
	"pg_create_logical_replication_slot":  {}, // temporary slots belong to the session
	"pg_create_physical_replication_slot": {},
	"pg_backup_start":                     {}, // a backup in progress belongs to the session
	"pg_backup_stop":                      {},
}

// otherBackendFuncs are built-ins that act on other server processes or
// on the whole server (OtherBackend).
var otherBackendFuncs = map[string]struct{}{
	"pg_terminate_backend":           {},
	"pg_cancel_backend":              {},
	"pg_reload_conf":                 {},
	"pg_rotate_logfile":              {},
	"pg_promote":                     {},
	"pg_log_backend_memory_contexts": {},
	"pg_wal_replay_pause":            {},
	"pg_wal_replay_resume":           {},
	"pg_switch_wal":                  {},
	"pg_create_restore_point":        {},
}

// builtinSet, keywordSet: the generated lists as sets.
var (
	builtinSet = toSet(pgBuiltins[:])
	keywordSet = toSet(pgKeywords[:])
)

func toSet(names []string) map[string]struct{} {
	m := make(map[string]struct{}, len(names))
	for _, n := range names {
		m[n] = struct{}{}
	}
	return m
}

// callFlags classifies a call of the function name (folded as PostgreSQL
// folds it); qualifier is its schema, "" when unqualified. quoted reports
// a quoted name, which is never a keyword. special reports set_config and
// the advisory lock functions, which the caller reads itself.
func callFlags(name, qualifier []byte, quoted bool) (f Flags, special bool) {
	if !quoted && len(qualifier) == 0 {
		if _, ok := keywordSet[string(name)]; ok {
			return 0, false
		}
		if _, ok := syntaxWords[string(name)]; ok {
			return 0, false
		}
	}
	if len(qualifier) > 0 && string(qualifier) != "pg_catalog" {
		return OpaqueCall, false
	}
	switch string(name) {
	case "set_config", "pg_advisory_lock", "pg_advisory_lock_shared",
		"pg_try_advisory_lock", "pg_try_advisory_lock_shared",
		"pg_advisory_unlock", "pg_advisory_unlock_shared", "pg_advisory_unlock_all":
		return 0, true
	}
	if _, ok := otherBackendFuncs[string(name)]; ok {
		return OtherBackend, false
	}
	if _, ok := sessionBuiltins[string(name)]; ok || bytes.HasPrefix(name, []byte("binary_upgrade_")) {
		return OpaqueCall, false
	}
	if _, ok := builtinSet[string(name)]; ok {
		return 0, false
	}
	return OpaqueCall, false
}
