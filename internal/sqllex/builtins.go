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
//     pg_catalog; pgBuiltins) that neither changes session state nor
//     runs code its call does not show (sessionBuiltins lists those that
//     do: setseed, query_to_xml and the other functions that run a query
//     given as text or read a relation, type or index named by an
//     argument);
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
// names, or that run code the text of their call does not show, so a call
// of one is OpaqueCall; so is every binary_upgrade_* function (they set
// the OIDs the session's next objects get). set_config and the advisory
// lock functions are read by their own rules and never reach this list.
var sessionBuiltins = map[string]struct{}{
	"pg_replication_origin_session_reset": {},
	"pg_backup_stop":                      {},

	// They run a query given as text, or read the relations that a name,
	// a schema or the database (or a cursor) stands for, whose views and
	// row-level policies may call user functions: the lexer sees neither
	// the query nor the functions. query_to_xmlschema plans its query
	// without reading rows, which still evaluates an immutable function's
	// call on constants; the other _xmlschema forms read only the
	// relations' column lists today and are listed with their siblings,
	// erring towards opaque.
	"query_to_xml":                  {},
	"query_to_xmlschema":            {},
	"query_to_xml_and_xmlschema":    {},
	"cursor_to_xml":                 {}, // also fetches from, so moves, the cursor
	"cursor_to_xmlschema":           {},
	"table_to_xml":                  {},
	"table_to_xmlschema":            {},
	"table_to_xml_and_xmlschema":    {},
	"schema_to_xml":                 {},
	"schema_to_xmlschema":           {},
	"schema_to_xml_and_xmlschema":   {},
	"database_to_xml":               {},
	"database_to_xmlschema":         {},
	"database_to_xml_and_xmlschema": {},
	"ts_stat":                       {}, // ts_stat('SELECT tsvector FROM …')
	"ts_rewrite":                    {}, // ts_rewrite(tsquery, 'SELECT target, substitute FROM …')

	// They take a type by OID ('t'::regtype) and run its input function,
	// and the CHECK constraints of a domain among the types involved,
	// which may call user functions: domain_in('5', 'posint'::regtype, -1).
	"array_in":      {},
	"record_in":     {},
	"range_in":      {},
	"multirange_in": {},
	"domain_in":     {},

	// They take an index or a table by OID and evaluate its index
	// expressions (BRIN summarising), its operator classes' support
	// functions (GIN's pending list) or its hash partition key's, any of
	// which may be user functions.
	"brin_summarize_new_values": {},
	"brin_summarize_range":      {},
	"gin_clean_pending_list":    {},
	"satisfies_hash_partition":  {},
}

// processFuncs are the functions whose effect stays with the server
// process where no reset query reaches it (ProcessState, and OpaqueCall
// too), by name whatever their schema: dblink is an extension, installed
// in any schema, and a user function of one of these names is taken for
// it, erring towards keeping the client on its server process.
var processFuncs = map[string]struct{}{
	"setseed":                             {}, // the process's random() sequence
	"pg_backup_start":                     {}, // a backup in progress belongs to the process
	"pg_create_logical_replication_slot":  {}, // a temporary slot belongs to the process
	"pg_create_physical_replication_slot": {},
	"pg_copy_logical_replication_slot":    {},
	"pg_copy_physical_replication_slot":   {},
	"pg_replication_origin_session_setup": {},
	"dblink_connect":                      {}, // a named connection, reachable by name
	"dblink_connect_u":                    {},

	// They load the slot's output plugin, a shared library the text does
	// not name, into the process and run it, as LOAD would.
	"pg_logical_slot_get_changes":         {},
	"pg_logical_slot_peek_changes":        {},
	"pg_logical_slot_get_binary_changes":  {},
	"pg_logical_slot_peek_binary_changes": {},
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
	if _, ok := processFuncs[string(name)]; ok {
		return OpaqueCall | ProcessState, false
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
	if string(name) == "lastval" || string(name) == "currval" {
		return SequenceRead, false
	}
	if _, ok := sessionBuiltins[string(name)]; ok || bytes.HasPrefix(name, []byte("binary_upgrade_")) {
		return OpaqueCall, false
	}
	if _, ok := builtinSet[string(name)]; ok {
		return 0, false
	}
	return OpaqueCall, false
}

// pgCatalog is the qualifier HarmlessBuiltin calls with.
var pgCatalog = []byte("pg_catalog")

// HarmlessBuiltin reports whether a call of pg_catalog.name(…), name as
// PostgreSQL records it (proname, case kept), gets no flags at all from
// the function rules above: name is a PostgreSQL 15 built-in that does not
// change session state, act on other server processes or run code its
// call does not show (set_config, the advisory lock functions,
// OtherBackend ones and the OpaqueCall ones of sessionBuiltins report
// false, and so does any other name). A pooler uses it to judge the
// built-in functions that a view, a column default, a CHECK constraint or
// an index expression calls, which run whenever a statement touches the
// relation although its text shows none of them. It does not allocate.
func HarmlessBuiltin(name string) bool {
	if len(name) > nameMax {
		return false // no built-in's name is this long
	}
	var buf [nameMax]byte
	n := copy(buf[:], name)
	f, special := callFlags(buf[:n], pgCatalog, true)
	return f == 0 && !special
}

// MayHoldProcessState reports whether sql calls a function of
// processFuncs (Flags.ProcessState). It is for a caller that lexes
// nothing else, such as a session-mode pooler, which lends a server
// process to the next client after DISCARD ALL and must close it instead
// when one of them ran: one pass looks for the part of a name every such
// function has (case folded, and U& identifiers, which may spell any
// name), and only a text holding one is classified. It does not
// allocate.
func MayHoldProcessState(sql string) bool {
	return mayNameProcessFunc(sql) && Classify(sql).Flags&ProcessState != 0
}

// processNeedles hold, lower case, a part of every name in processFuncs
// (TestProcessNeedles checks it), and "u&", which begins an identifier
// written with Unicode escapes, by their first letter.
var processNeedles = [...][]string{
	's' - 'a': {"setseed", "slot_get_", "slot_peek_"},
	'b' - 'a': {"backup_start"},
	'r' - 'a': {"replication_slot", "replication_origin"},
	'd' - 'a': {"dblink_connect"},
	'u' - 'a': {"u&"},
	'z' - 'a': nil,
}

// mayNameProcessFunc reports whether sql holds one of processNeedles,
// ignoring ASCII case.
func mayNameProcessFunc(sql string) bool {
	for i := 0; i < len(sql); i++ {
		c := sql[i] | 0x20
		if c < 'a' || c > 'z' {
			continue
		}
		for _, n := range processNeedles[c-'a'] {
			if hasPrefixFold(sql[i:], n) {
				return true
			}
		}
	}
	return false
}

// hasPrefixFold reports whether s begins with prefix, a lower-case ASCII
// string, ignoring the ASCII case of s.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && eqFold(s[:len(prefix)], prefix)
}
