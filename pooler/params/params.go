// Package params knows which PostgreSQL run-time parameters the pooler
// follows and how it writes them back to a server.
//
// The server reports a few parameters with ParameterStatus whenever they
// change (Reported); the pooler follows those from the reports and sets
// them on every server connection it lends to a client whose values
// differ. The others the server keeps to itself, so the pooler sets a
// client's values for them again whenever another session may have
// changed them. Values go to the server through set_config with the
// literals of QuoteValue, which keep the client's bytes whatever
// client_encoding the connection has. The package knows nothing of
// sessions or connections: it is what the pooler's parameter tracking
// (the session's desired values, the per-connection state) is built on.
package params

import (
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"unique"
)

// reported are the run-time parameters the server reports with
// ParameterStatus that a client may set and that change how results look.
// In transaction mode consecutive transactions of one client may run on
// different server connections, so before lending a connection the pooler
// sets these to the client's values when they differ (as PgBouncer does for
// its track_extra_parameters).
var reported = map[string]bool{
	"application_name":            true,
	"client_encoding":             true,
	"DateStyle":                   true,
	"IntervalStyle":               true,
	"TimeZone":                    true,
	"standard_conforming_strings": true,
}

// Reported reports whether the server reports name (in its own spelling,
// see Canonical) with ParameterStatus. A change to any other parameter, by
// a client's SET, set_config or a function, produces no ParameterStatus,
// so the pooler cannot see that it drifted.
func Reported(name string) bool { return reported[name] }

// Count returns the number of reported parameters.
func Count() int { return len(reported) }

// All returns the names of the reported parameters, in no fixed order.
func All() iter.Seq[string] { return maps.Keys(reported) }

// Canonical maps a startup parameter name to the spelling the server
// reports, so "datestyle" and "DateStyle" are one parameter.
func Canonical(name string) string {
	for t := range reported {
		if strings.EqualFold(t, name) {
			return t
		}
	}
	return name
}

// notCarried are session-sourced parameters that are not carried to the
// next server connection: identity and the current transaction's own
// settings, which the pooler's identity handling and PostgreSQL take care
// of.
var notCarried = map[string]bool{
	"role":                   true,
	"session_authorization":  true,
	"is_superuser":           true,
	"transaction_isolation":  true,
	"transaction_read_only":  true,
	"transaction_deferrable": true,
}

// Carried reports whether a parameter the session set (a row of SessionSQL)
// is carried to the client's next server connection.
func Carried(name string) bool { return !notCarried[name] }

// SessionSQL lists the run-time parameters the session set; with the
// pooler's own set_config calls, that is every parameter whose value is not
// the server's default.
const SessionSQL = "SELECT name, pg_catalog.current_setting(name) FROM pg_catalog.pg_settings WHERE source = 'session'"

// Key serialises values (parameter name to value), so a server connection
// last synced for identical settings (the usual case: many clients of one
// application) needs no comparison at all. Sessions of one application
// share their settings: the key is interned, so each keeps a reference to
// one copy instead of its own few hundred bytes. With the key, Key returns
// reapply[:0] with the text of a SELECT appended that sets the unreported
// values again (set_config, in name order), or nothing when there are none.
func Key(values map[string]string, reapply []byte) (string, []byte) {
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(values[k])
		b.WriteByte(0)
	}
	key := unique.Make(b.String()).Value()
	reapply = reapply[:0]
	for _, k := range keys {
		if Reported(k) {
			continue
		}
		if len(reapply) == 0 {
			reapply = append(reapply, "SELECT "...)
		} else {
			reapply = append(reapply, ", "...)
		}
		reapply = append(reapply, "pg_catalog.set_config("+QuoteLiteral(k)+", "+QuoteValue(values[k])+", false)"...)
	}
	return key, reapply
}

// QuoteIdent quotes s as an SQL identifier.
func QuoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// QuoteLiteral quotes s as an SQL string literal by doubling its single
// quotes. Backslashes are left as they are, which is right with
// standard_conforming_strings on (PostgreSQL's default); QuoteValue escapes
// them for any setting.
func QuoteLiteral(s string) string {
	return `'` + strings.ReplaceAll(s, `'`, `''`) + `'`
}

// QuoteValue quotes a parameter value for set_config so that the server
// gets the client's bytes unchanged, as from a startup packet, whatever
// client_encoding the connection has at that moment: bytes outside ASCII are
// written as escapes (E'caf\xc3\xa9'), which the server does not convert.
func QuoteValue(v string) string {
	plain := true
	for i := 0; i < len(v); i++ {
		if v[i] >= 0x80 || v[i] == '\\' {
			plain = false
			break
		}
	}
	if plain {
		return QuoteLiteral(v)
	}
	var b strings.Builder
	b.WriteString("E'")
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\'':
			b.WriteString("''")
		case c == '\\':
			b.WriteString(`\\`)
		case c >= 0x80:
			fmt.Fprintf(&b, `\x%02x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// valueChecked are the unreported parameters whose every value PostgreSQL
// accepts or refuses by the value alone: a value one server process took,
// every server process of the same server takes. Others may be refused by
// one process and taken by another, for what that process did before or
// what the catalogs hold: temp_buffers once the process used temporary
// tables, a custom placeholder (myapp.x, plpgsql.x) once its prefix is
// reserved in that process, default_text_search_config or
// default_tablespace after the object was dropped. Nor are parameters
// only a superuser or a role granted SET may change (log_statement,
// log_min_duration_statement, track_io_timing): a value accepted once is
// refused after REVOKE, and a refused sync pipelined ahead of a
// statement rolls back whole, its RESET ALL included, so the statement
// would run with the previous client's values.
var valueChecked = map[string]bool{}

func init() {
	for _, k := range strings.Fields(`
		array_nulls backslash_quote bytea_output check_function_bodies
		client_min_messages commit_siblings constraint_exclusion
		cpu_index_tuple_cost cpu_operator_cost cpu_tuple_cost
		cursor_tuple_fraction default_statistics_target
		default_toast_compression default_transaction_deferrable
		default_transaction_isolation default_transaction_read_only
		effective_cache_size enable_async_append enable_bitmapscan
		enable_gathermerge enable_hashagg enable_hashjoin
		enable_incremental_sort enable_indexonlyscan enable_indexscan
		enable_material enable_memoize enable_mergejoin enable_nestloop
		enable_parallel_append enable_parallel_hash
		enable_partition_pruning enable_partitionwise_aggregate
		enable_partitionwise_join enable_seqscan enable_sort enable_tidscan
		escape_string_warning extra_float_digits force_parallel_mode
		from_collapse_limit geqo geqo_effort geqo_generations geqo_pool_size
		geqo_seed geqo_selection_bias geqo_threshold gin_fuzzy_search_limit
		gin_pending_list_limit hash_mem_multiplier
		idle_in_transaction_session_timeout idle_session_timeout jit
		jit_above_cost jit_inline_above_cost jit_optimize_above_cost
		join_collapse_limit lock_timeout logical_decoding_work_mem maintenance_work_mem
		max_parallel_maintenance_workers max_parallel_workers
		max_parallel_workers_per_gather min_parallel_index_scan_size
		min_parallel_table_scan_size parallel_leader_participation
		parallel_setup_cost parallel_tuple_cost plan_cache_mode
		quote_all_identifiers random_page_cost recursive_worktable_factor
		row_security search_path seq_page_cost statement_timeout
		synchronize_seqscans synchronous_commit
		transform_null_equals vacuum_cost_delay vacuum_cost_limit
		vacuum_cost_page_dirty vacuum_cost_page_hit vacuum_cost_page_miss
		vacuum_freeze_min_age vacuum_freeze_table_age
		vacuum_multixact_freeze_min_age vacuum_multixact_freeze_table_age
		work_mem xmlbinary xmloption`) {
		valueChecked[k] = true
	}
}

// ValueChecked reports whether a value of name that one server process
// accepted every process of the server accepts: setting it cannot fail on
// the next connection, so the pooler may pipeline the set_config ahead of a
// client's statement. For any other parameter a refusal would let the
// statement run with another client's value; the pooler waits for the
// server's answer first.
func ValueChecked(name string) bool {
	return reported[name] || valueChecked[strings.ToLower(name)]
}
