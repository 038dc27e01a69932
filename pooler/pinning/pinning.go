// Package pinning classifies the session state that keeps a client on its
// server connection in transaction mode, from the statement text and from
// the server's own answer.
//
// Some session state cannot follow a client to another server connection:
// temporary tables, LISTEN, session advisory locks, WITH HOLD cursors,
// SQL-level PREPAREd statements, and an identity change made outside a
// transaction block. Read says what a text may do to that state, from the
// lexer's flags (internal/sqllex); it errs towards pinning. Unpinning asks
// the server: ProbeQuery is the query the pooler pipelines behind a
// client's synchronisation point to list what the session still holds,
// and ReadProbeRow reads its answer. The package holds no state; the
// session's pins, and when to probe, are the pooler's.
package pinning

import (
	"encoding/binary"

	"github.com/pgquic/pgquic/internal/sqllex"
	"github.com/pgquic/pgquic/pooler/params"
)

// Role is the pin an identity change outside a transaction block sets, or
// one the probe found after DO, CALL or a function; Opaque is the pin a
// FunctionCall message sets: the function it calls (set_config, say) may
// have changed anything; Process is the pin a call of a function whose
// effect stays with the server process sets (sqllex.ProcessState:
// setseed, pg_backup_start, a replication slot or origin, dblink_connect),
// which no probe can see and no reset undoes, so the connection is closed
// when the client leaves. None is lifted before the client leaves. The
// other bits are sqllex.Held kinds.
const (
	Process sqllex.Held = 1 << 5
	Opaque  sqllex.Held = 1 << 6
	Role    sqllex.Held = 1 << 7
)

// Sticky are the pins no probe lifts.
const Sticky = Process | Opaque | Role

// Names returns the reasons in h, for the metric label and log lines.
func Names(h sqllex.Held) []string {
	names := h.Names()
	if h&Process != 0 {
		names = append(names, "process")
	}
	if h&Opaque != 0 {
		names = append(names, "opaque")
	}
	if h&Role != 0 {
		names = append(names, "role")
	}
	return names
}

// Info is what a statement text may do to unmovable session state.
type Info struct {
	Holds    sqllex.Held // state it may create
	Releases sqllex.Held // state it may drop
	Opaque   bool        // DO, CALL, an opaque function call or DDL: may create state the text does not show
	Outside  bool        // a holding statement comes where the text has not opened a block
	Kind     string      // the first holding statement, for logs and errors
}

// Read reads what sql, whose statements' union of flags is sum, does to
// session state. Text that holds nothing costs nothing more.
func Read(sql string, sum sqllex.Flags) Info {
	// CREATE and SELECT INTO of an unqualified name create a temporary
	// object when the session's search_path lists pg_temp first, which the
	// text does not show: the probe asks the server, as after DO.
	in := Info{Holds: sum.Holds(), Releases: sum.Releases(), Opaque: sum.Opaque() || sum&sqllex.SchemaChange != 0}
	if sum&sqllex.ProcessState != 0 {
		in.Holds |= Process
	}
	if in.Holds == 0 {
		return in
	}
	in.Kind = sqllex.StateKind(sql)
	if sum&sqllex.Unsure != 0 {
		in.Outside = true
		return in
	}
	open := false
	for st := range sqllex.Statements(sql) {
		open, _ = Block(open, st.Flags)
		if (st.Flags.Holds() != 0 || st.Flags&sqllex.ProcessState != 0) && !open {
			in.Outside = true
		}
	}
	return in
}

// Block follows the transaction block through a text's statements: given
// whether a block was open before a statement with flags f, it returns
// whether one is open after it, and whether the statement ended one
// (COMMIT, ROLLBACK or PREPARE TRANSACTION; with AND CHAIN the next block
// is open at once). What is outside a block is what a pin outlives.
func Block(open bool, f sqllex.Flags) (after, ends bool) {
	switch {
	case f&sqllex.Begin != 0:
		return true, false
	case f&(sqllex.Commit|sqllex.Rollback|sqllex.PrepareTransaction) != 0:
		return f&sqllex.Chain != 0, true
	}
	return open, false
}

// probeSQL asks the server which unmovable state the session holds, one
// boolean per sqllex.Held kind in bit order; ProbeQuery adds whether the
// identity moved away from the login role. Operators are qualified, so a
// client's objects cannot stand in for them.
//
// Temporary objects are found through pg_depend, where every object
// created in a schema (a table, view, sequence, function, type, domain,
// operator...) records its dependency on it, by the index on the referenced
// object; an index or TOAST table of a temporary table depends on the
// table. Scanning pg_class, pg_proc and pg_type for the schema instead took
// most of the probe's time (they have no index on it). A session with no
// temporary schema at all skips the look.
const probeSQL = "SELECT" +
	" pg_catalog.pg_my_temp_schema() OPERATOR(pg_catalog.<>) 0 AND EXISTS (SELECT 1 FROM pg_catalog.pg_depend" +
	" WHERE refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass" +
	" AND refobjid OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()), " +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_listening_channels()), " +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory'" +
	" AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()), " +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_cursors WHERE is_holdable), " +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_prepared_statements WHERE from_sql)"

// probeColumns is the number of columns of the probe's row.
const probeColumns = 6

// ProbeQuery returns the probe's SQL for a connection that logged in as
// login ("" when unknown). Its last column is true when current_user or
// session_user differs from the login role: DO, CALL, a function or a
// FunctionCall message may have run SET ROLE or SET SESSION AUTHORIZATION,
// which the server reports (through is_superuser) only when superuser
// status changes. CURRENT_USER and SESSION_USER are keywords, which no
// client's object can stand in for.
func ProbeQuery(login string) string {
	id := "NOT (current_user OPERATOR(pg_catalog.=) session_user"
	if login != "" {
		id += " AND session_user OPERATOR(pg_catalog.=) " + params.QuoteLiteral(login) + "::pg_catalog.name"
	}
	return probeSQL + ", " + id + ")"
}

// Probe is the server's answer to the probe.
type Probe struct {
	Found    sqllex.Held // the kinds of state the session holds
	Role     bool        // the identity moved away from the login role
	Complete bool        // the row had every column the probe asks for
}

// ReadProbeRow reads the body of the probe's DataRow. A column that is
// true, or any other value but "f", counts as held: it errs towards
// pinning. ok is false for a body that does not parse (too short for the
// columns it announces, or a NULL column); the caller then keeps whatever
// it read before.
func ReadProbeRow(body []byte) (p Probe, ok bool) {
	if len(body) < 2 {
		return Probe{}, false
	}
	n := int(binary.BigEndian.Uint16(body))
	body = body[2:]
	var found sqllex.Held
	role := false
	for i := range n {
		if len(body) < 4 {
			return Probe{}, false
		}
		l := int(int32(binary.BigEndian.Uint32(body)))
		body = body[4:]
		if l < 0 || l > len(body) {
			return Probe{}, false
		}
		if l != 1 || body[0] != 'f' {
			// True, or anything unexpected: err towards pinning.
			if i == probeColumns-1 {
				role = true
			} else {
				found |= 1 << i
			}
		}
		body = body[l:]
	}
	return Probe{Found: found & sqllex.HeldAll, Role: role, Complete: n == probeColumns}, true
}
