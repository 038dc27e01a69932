package sqllex

import (
	"math/bits"
	"strings"
)

// Flags is a set of facts about SQL text: what its statements do to the
// session (identity, run-time parameters, prepared statements, cursors,
// temporary objects, notifications), which transaction boundaries they
// cross, and whether the text could be read with certainty at all. A
// pooler tests the bits it cares about; unknown bits can be ignored.
type Flags uint64

// Identity changes. SET ROLE and SET SESSION AUTHORIZATION decide the
// permissions every later statement runs with, so a pooler that lends the
// server connection to another client must undo them. The Local variants
// (SET LOCAL, or set_config with is_local true) end with the transaction.
const (
	// SetRole marks SET [SESSION] ROLE, SET role = …, or
	// set_config('role', …, false).
	SetRole Flags = 1 << iota
	// SetRoleLocal marks SET LOCAL ROLE, SET LOCAL role = …, or
	// set_config('role', …, true).
	SetRoleLocal
	// ResetRole marks RESET ROLE (RESET role).
	ResetRole
	// SetSessionAuth marks SET [SESSION] SESSION AUTHORIZATION,
	// SET session_authorization = …, or set_config('session_authorization',
	// …, false). It also resets the role.
	SetSessionAuth
	// SetSessionAuthLocal marks SET LOCAL SESSION AUTHORIZATION and its
	// transaction-scoped equivalents.
	SetSessionAuthLocal
	// ResetSessionAuth marks RESET SESSION AUTHORIZATION.
	ResetSessionAuth
	// SetConfig marks a call of set_config(…) anywhere in a statement, or a
	// write to pg_settings; the flags above (or SetParam) say what it sets
	// when that can be read. An is_local argument that is not exactly one
	// constant (perhaps cast to bool, boolean or text) is read as false:
	// the change lasts for the session.
	SetConfig
	// UnsureIdentity marks a set_config call whose parameter name is not
	// exactly one string constant (perhaps cast to text or varchar), or a
	// write to pg_settings (UPDATE, INSERT, DELETE or MERGE of
	// [pg_catalog.]pg_settings, which calls set_config for the row's
	// name): it may change the role.
	UnsureIdentity
)

// Run-time parameters. RESET ALL leaves the role and the session
// authorization alone in PostgreSQL, so it is not an identity change.
const (
	// SetParam marks SET or SET SESSION of any other run-time parameter
	// (including SET TIME ZONE, SET NAMES, SET SCHEMA, SET XML OPTION), or a
	// set_config call with is_local false.
	SetParam Flags = 1 << (iota + 8)
	// SetParamLocal marks SET LOCAL of a parameter, or set_config with
	// is_local true: the value lasts until the transaction ends.
	SetParamLocal
	// ResetParam marks RESET of one parameter (RESET TIME ZONE included).
	ResetParam
	// ResetAll marks RESET ALL.
	ResetAll
	// SessionCharacteristics marks SET SESSION CHARACTERISTICS AS
	// TRANSACTION …, which changes the default_transaction_* parameters for
	// the rest of the session.
	SessionCharacteristics
	// SetTransaction marks SET TRANSACTION … (SNAPSHOT included) and SET
	// CONSTRAINTS: settings that end with the current transaction.
	SetTransaction
)

// Transaction control.
const (
	// Begin marks BEGIN and START TRANSACTION.
	Begin Flags = 1 << (iota + 16)
	// Commit marks COMMIT and END.
	Commit
	// Rollback marks ROLLBACK and ABORT (not ROLLBACK TO SAVEPOINT).
	Rollback
	// Chain marks COMMIT/END/ROLLBACK/ABORT AND CHAIN, after which a new
	// transaction is already open.
	Chain
	// Savepoint marks SAVEPOINT.
	Savepoint
	// Release marks RELEASE [SAVEPOINT].
	Release
	// RollbackTo marks ROLLBACK TO [SAVEPOINT].
	RollbackTo
	// PrepareTransaction marks PREPARE TRANSACTION 'gid'.
	PrepareTransaction
	// CommitPrepared marks COMMIT PREPARED 'gid'.
	CommitPrepared
	// RollbackPrepared marks ROLLBACK PREPARED 'gid'.
	RollbackPrepared
)

// SQL-level prepared statements and DISCARD.
const (
	// Prepare marks SQL PREPARE name … (not PREPARE TRANSACTION).
	Prepare Flags = 1 << (iota + 28)
	// Execute marks EXECUTE name, alone or after EXPLAIN.
	Execute
	// Deallocate marks DEALLOCATE [PREPARE] name or ALL.
	Deallocate
	// DeallocateAll marks DEALLOCATE [PREPARE] ALL (Deallocate is set too).
	DeallocateAll
	// DiscardAll marks DISCARD ALL, which also resets the session
	// authorization, every parameter, prepared statements, cursors,
	// advisory locks, plans, temporary tables, sequences and LISTEN.
	DiscardAll
	// DiscardPlans marks DISCARD PLANS.
	DiscardPlans
	// DiscardSequences marks DISCARD SEQUENCES.
	DiscardSequences
	// DiscardTemp marks DISCARD TEMP or DISCARD TEMPORARY.
	DiscardTemp
)

// Other statements that tie state or traffic to one server connection.
const (
	// Copy marks COPY.
	Copy Flags = 1 << (iota + 36)
	// Listen marks LISTEN.
	Listen
	// Unlisten marks UNLISTEN.
	Unlisten
	// Notify marks NOTIFY.
	Notify
	// DeclareCursor marks DECLARE … CURSOR.
	DeclareCursor
	// DeclareHold marks DECLARE … CURSOR WITH HOLD, a cursor that outlives
	// its transaction (DeclareCursor is set too).
	DeclareHold
	// CreateTemp marks CREATE [GLOBAL|LOCAL] TEMP|TEMPORARY …, CREATE of an
	// object qualified by pg_temp, and SELECT … INTO [TABLE] TEMP … or
	// INTO [TABLE] pg_temp.name.
	CreateTemp
	// DoBlock marks DO: procedural code that may do anything, SET ROLE
	// included.
	DoBlock
	// Call marks CALL of a procedure, which may likewise do anything.
	Call
	// Load marks LOAD, which loads a shared library into the session.
	Load
	// AdvisoryLock marks a call of a session-level advisory lock function
	// (pg_advisory_lock, pg_try_advisory_lock and their _shared forms).
	AdvisoryLock
	// CloseCursor marks CLOSE name or CLOSE ALL, which may drop a WITH HOLD
	// cursor (Name is the cursor, empty for ALL).
	CloseCursor
	// AdvisoryUnlock marks a call of pg_advisory_unlock,
	// pg_advisory_unlock_shared or pg_advisory_unlock_all anywhere in a
	// statement, which may release session advisory locks.
	AdvisoryUnlock
	// Drop marks DROP …, which may drop a temporary object.
	Drop
	// SchemaChange marks CREATE, ALTER and DROP, and SELECT … INTO (a
	// CREATE TABLE … AS): after them a statement prepared earlier on the
	// connection may no longer describe what the same text returns now. A
	// CREATE or SELECT INTO of an unqualified name creates a temporary
	// object when search_path lists pg_temp first, which only the server
	// can tell.
	SchemaChange
	// OtherBackend marks a call of a function that acts on another server
	// process or on the whole server (pg_terminate_backend,
	// pg_cancel_backend, pg_reload_conf, pg_rotate_logfile and the like;
	// see otherBackendFuncs). It changes nothing in the session, but a
	// request that may end its own server process must never share that
	// process with other clients' requests.
	OtherBackend
	// OpaqueCall marks a call of a function the lexer cannot prove harmless
	// to the session: one that is not a PostgreSQL built-in (user-defined,
	// from an extension, or qualified by a schema other than pg_catalog),
	// or a built-in that changes session state in ways no other flag names
	// (setseed, replication-origin and backup sessions, temporary
	// replication slots) or runs code its call does not show (query_to_xml,
	// table_to_xml, ts_stat and the like run a query given as text or read
	// a relation named by an argument; domain_in runs a domain's CHECK;
	// see builtins.go). Like DO and CALL it may do anything, SET ROLE
	// included (Flags.Opaque).
	OpaqueCall
	// Maintenance marks ANALYZE (ANALYSE), VACUUM, CLUSTER and REINDEX,
	// which run the index expressions, extended statistics expressions
	// and operator class functions of tables they need not name, so they
	// are opaque too.
	Maintenance
	// SequenceRead marks a call of lastval or currval, which return what
	// nextval or setval last gave in the session, and so, on a server
	// process shared by many clients, another client's value.
	SequenceRead
	// ProcessState marks a call of a function whose effect stays with the
	// server process and that no reset query undoes: setseed (the
	// process's random() sequence), pg_backup_start (a backup in
	// progress), the replication slot functions (a temporary slot, and the
	// output plugin a logical slot's changes load), the replication-origin
	// session and dblink's named connections. A call of one is OpaqueCall
	// too. A pooler must keep the client on that process for the rest of
	// its session and close the process's connection when the client
	// leaves, since DISCARD ALL leaves all of it in place.
	ProcessState
)

// Uncertainty. When either is set a caller should take its safe path.
const (
	// Incomplete marks an unterminated string, quoted identifier, comment
	// or dollar quote, unbalanced parentheses, or a BEGIN ATOMIC body left
	// open. PostgreSQL rejects such text, but what it would be is unknown.
	Incomplete Flags = 1 << (iota + 56)
	// Ambiguous marks text whose statements differ depending on
	// standard_conforming_strings (a backslash in a plain '…' string).
	// The flags are then the union of both readings.
	Ambiguous
)

// Useful unions of flags.
const (
	// Identity holds every flag that may change the current role or
	// session authorization, local or not.
	Identity = SetRole | SetRoleLocal | ResetRole | SetSessionAuth | SetSessionAuthLocal |
		ResetSessionAuth | UnsureIdentity
	// Unsure holds the flags that say the text could not be read with
	// certainty.
	Unsure = Incomplete | Ambiguous
	// Transaction holds the transaction-control flags.
	Transaction = Begin | Commit | Rollback | Chain | Savepoint | Release | RollbackTo |
		PrepareTransaction | CommitPrepared | RollbackPrepared
)

var flagNames = [64]string{
	"SetRole", "SetRoleLocal", "ResetRole", "SetSessionAuth", "SetSessionAuthLocal",
	"ResetSessionAuth", "SetConfig", "UnsureIdentity",
	8: "SetParam", "SetParamLocal", "ResetParam", "ResetAll", "SessionCharacteristics",
	"SetTransaction",
	16: "Begin", "Commit", "Rollback", "Chain", "Savepoint", "Release", "RollbackTo",
	"PrepareTransaction", "CommitPrepared", "RollbackPrepared",
	28: "Prepare", "Execute", "Deallocate", "DeallocateAll", "DiscardAll", "DiscardPlans",
	"DiscardSequences", "DiscardTemp",
	36: "Copy", "Listen", "Unlisten", "Notify", "DeclareCursor", "DeclareHold", "CreateTemp",
	"DoBlock", "Call", "Load", "AdvisoryLock", "CloseCursor", "AdvisoryUnlock", "Drop", "SchemaChange",
	"OtherBackend", "OpaqueCall", "Maintenance", "SequenceRead", "ProcessState",
	56: "Incomplete", "Ambiguous",
}

// String lists the set flags by name, separated by '|', for logs and test
// failures; an empty set prints as "0".
func (f Flags) String() string {
	if f == 0 {
		return "0"
	}
	var sb strings.Builder
	for f != 0 {
		i := bits.TrailingZeros64(uint64(f))
		f &^= 1 << i
		if sb.Len() > 0 {
			sb.WriteByte('|')
		}
		if name := flagNames[i]; name != "" {
			sb.WriteString(name)
		} else {
			sb.WriteString("bit")
			sb.WriteString(string(rune('0' + i/10)))
			sb.WriteString(string(rune('0' + i%10)))
		}
	}
	return sb.String()
}
