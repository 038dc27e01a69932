package pooler

import (
	"time"
	"unsafe"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/sqllex"
	"github.com/pgquic/pgquic/pooler/pinning"
)

// Identity changes in transaction mode.
//
// SET ROLE, SET SESSION AUTHORIZATION, their RESETs and SET SESSION
// CHARACTERISTICS last for the rest of the server session, not the
// transaction. In transaction mode the client's next statement may run on
// another server connection, and the next client of this one would run
// under an identity it never chose. So, outside a transaction block, the
// pooler either refuses them (RoleChangesRefuse, the default) or pins the
// client to its server connection until it disconnects (RoleChangesPin),
// after which the connection is reset. Inside a transaction block they are
// allowed (SET LOCAL ROLE is the usual way), and a connection on which a
// session-level change may have happened is reset before anyone else
// borrows it: the statements are found by a lexer (internal/sqllex), and a
// ParameterStatus for session_authorization or is_superuser, which the
// server reports however the change was made, marks it too. What the lexer
// cannot read counts as a change: a set_config whose name is not exactly a
// constant, a write to pg_settings. What it cannot see into (DO, CALL,
// functions that are not known harmless built-ins, FunctionCall messages)
// is followed by the probe of pin.go, which compares the identity with the
// login role and pins the client when they differ.

// identityChange holds the sqllex flags of statements whose effect outlives
// the transaction. SET LOCAL variants end with it and are not included.
const identityChange = sqllex.SetRole | sqllex.ResetRole | sqllex.SetSessionAuth |
	sqllex.ResetSessionAuth | sqllex.SessionCharacteristics | sqllex.UnsureIdentity

// sessionParams holds the sqllex flags of statements that change run-time
// parameters for the rest of the session.
const sessionParams = sqllex.SetParam | sqllex.ResetParam | sqllex.ResetAll

// identityResetSQL undoes every identity change on a server connection
// before it is lent to another client. RESET SESSION AUTHORIZATION is
// allowed for any login role (it returns to that role).
const identityResetSQL = "RESET SESSION AUTHORIZATION; RESET ROLE; " +
	"RESET default_transaction_isolation; RESET default_transaction_read_only; " +
	"RESET default_transaction_deferrable"

// noQueryFlags are the flags of statements that run no query, and so no
// code behind a name (catalog.go): a text of one of them alone is never
// read as hidden code. Reading it so would have the parameters read back
// right behind it, and a BEGIN followed by that query has its snapshot
// taken, and SET TRANSACTION ISOLATION LEVEL refused, before the client's
// first statement.
const noQueryFlags = sqllex.Begin | sqllex.SetTransaction | sqllex.SetParam | sqllex.SetParamLocal |
	sqllex.ResetParam | sqllex.Savepoint | sqllex.Release

// sqlInfo is what transaction mode needs to know of a statement text.
type sqlInfo struct {
	identity bool // changes the identity beyond the transaction
	outside  bool // ...at a point where the text itself has not opened a block
	begins   bool // leaves a transaction block open
	ends     bool // ends a transaction block

	params    []string // run-time parameters SET for the session (SET or set_config)
	resets    []string // run-time parameters RESET
	paramsAll bool     // RESET ALL, set_config of a parameter the lexer cannot name, or an opaque statement
	resetAll  bool     // RESET ALL
	copy      bool     // a COPY, which may leave the server waiting for the client's data
	schema    bool     // CREATE, ALTER, DROP or COMMIT PREPARED: statements prepared before may have changed shape
	load      bool     // LOAD: a library stays in the server process for good
	noQuery   bool     // one statement that runs no query (BEGIN, SET, SAVEPOINT…): no code behind names to reach
	seqRead   bool     // calls lastval or currval, which answer with the server process's last nextval (sequences.go)

	pins pinning.Info // unmovable session state (pin.go)

	pipe bool   // nothing but plain statements: may share a server connection (pipeline.go)
	fp   uint64 // the text's fingerprint when pipe (sqllex.Fingerprint)
}

// inspectSQL reads what a Query's or Parse's text does to transactions and
// identity. The common statement costs one allocation-free classification.
// It is the one place that says what a text may change: the identity
// (identity), run-time parameters (params, resets, paramsAll), unmovable
// session state (pins.Holds), anything at all (pins.Opaque: DO, CALL and
// calls of functions that are not known harmless built-ins; also DDL and
// SELECT INTO, which create temporary objects when search_path lists
// pg_temp first), or nothing anyone can be sure of (sqllex.Unsure flags,
// read as identity changes).
func inspectSQL(sql []byte) sqlInfo {
	if len(sql) == 0 {
		return sqlInfo{}
	}
	text := unsafe.String(&sql[0], len(sql)) // sql is not modified while text is in use
	cl := sqllex.Classify(text)
	sum := cl.Flags
	// COMMIT PREPARED may commit DDL prepared earlier, and a DO block
	// (a migration's, most often) may run DDL: the catalog may change as
	// after DDL (catalog.go).
	info := sqlInfo{pins: pinning.Read(text, sum), copy: sum&sqllex.Copy != 0,
		schema: sum&(sqllex.SchemaChange|sqllex.CommitPrepared|sqllex.DoBlock) != 0, load: sum&sqllex.Load != 0,
		noQuery: cl.Statements == 1 && sum != 0 && sum&^noQueryFlags == 0, seqRead: sum&sqllex.SequenceRead != 0}
	if sum == 0 {
		info.pipe, info.fp = true, sqllex.Fingerprint(text)
	}
	if sum.Opaque() || sum&sqllex.SchemaChange != 0 {
		// DO, CALL or a function the lexer cannot vouch for may set any
		// parameter for the session, and so may an event trigger DDL
		// fires: read them back, and start the connection from its
		// defaults for its next borrower (params.go). Whether the
		// identity changed the probe asks the server (pin.go).
		info.paramsAll = true
	}
	if sum&(identityChange|sqllex.Transaction|sessionParams|sqllex.DiscardAll) == 0 {
		return info
	}
	if sum&identityChange != 0 && sum&sqllex.Unsure != 0 {
		// Unterminated, or split differently with standard_conforming_strings
		// off: take it as an identity change outside any block.
		info.identity, info.outside = true, true
	}
	open := false
	for st := range sqllex.Statements(text) {
		var ends bool
		if open, ends = pinning.Block(open, st.Flags); ends {
			info.ends = true
		}
		if st.Flags&identityChange != 0 {
			info.identity = true
			if !open {
				info.outside = true
			}
		}
		switch {
		case st.Flags&(sqllex.ResetAll|sqllex.SetConfig) != 0 && st.Flags&sessionParams != 0:
			// A statement may call set_config more than once; Name is
			// one of them at most.
			info.paramsAll = true
			info.resetAll = info.resetAll || st.Flags&sqllex.ResetAll != 0
			if st.Flags&sqllex.SetParam != 0 && st.Name != "" {
				info.params = append(info.params, st.Name)
			}
		case st.Flags&sqllex.DiscardAll != 0:
			// DISCARD ALL runs RESET ALL, among other things.
			info.paramsAll, info.resetAll = true, true
		case st.Flags&sqllex.ResetParam != 0 && st.Name != "":
			info.resets = append(info.resets, st.Name)
		case st.Flags&sqllex.SetParam != 0 && st.Name != "":
			info.params = append(info.params, st.Name)
		}
	}
	info.begins = open
	return info
}

// inBlock reports whether a transaction block is, or is about to be, open
// on a's server: the last ReadyForQuery said so, or a BEGIN was sent since.
// s.mu must be held.
func (a *attachment) inBlock() bool {
	return a.begun || a.status == 'T' || a.status == 'E'
}

// checkIdentity refuses an identity change outside a transaction block
// under RoleChangesRefuse, before any server connection is taken for it.
func (s *session) checkIdentity(info sqlInfo) error {
	if err := s.checkState(info); err != nil {
		return err
	}
	if !info.identity || !info.outside || s.p.cfg.RoleChanges != RoleChangesRefuse {
		return nil
	}
	s.mu.Lock()
	ok := s.pin.held&pinning.Role != 0 || (s.att != nil && !s.att.released && s.att.inBlock())
	s.mu.Unlock()
	if ok {
		return nil
	}
	return &PGError{
		Severity: "ERROR",
		Code:     pgproto.CodeFeatureNotSupported,
		Message:  "SET ROLE, SET SESSION AUTHORIZATION and SET SESSION CHARACTERISTICS are not supported outside a transaction block in transaction pooling mode",
		Hint:     "Use SET LOCAL ROLE inside BEGIN ... COMMIT, or connect in session mode; the pooler's role_changes setting \"pin\" keeps such clients on one server connection instead.",
	}
}

// noteSQL records, once a's server is about to run the statement, what it
// does to the transaction and the identity. s.mu must be held.
func (s *session) noteSQL(a *attachment, info sqlInfo) {
	if info.identity && s.pin.held&pinning.Role == 0 {
		if info.outside && !a.inBlock() {
			// Only RoleChangesPin gets here (checkIdentity refused it otherwise).
			s.pinLocked(a, pinning.Role, "an identity change")
		} else {
			a.identity = true
		}
	}
	switch {
	case info.begins:
		a.begun = true
	case info.ends:
		a.begun = false
	}
	a.copy = a.copy || info.copy
	a.copyOpen = a.copyOpen || info.copy
	if info.schema && s.p.cfg.Mode == ModeTransaction {
		// The pooler's statements on this connection were prepared before
		// the change: prepare each again (closing the old one) at its next
		// use, so a client's new statement of the same text cannot meet
		// 0A000 "cached plan must not change result type".
		a.st.stmts.Drop(false)
		s.noteDDLLocked(a)
	}
	if info.paramsAll || len(info.params) > 0 || len(info.resets) > 0 {
		a.st.clientSet(info.params, info.paramsAll)
		a.st.clientSet(info.resets, false)
		s.clientParamsLocked(info, true)
	}
	s.noteState(a, info.pins)
}

// identityReported handles an identity change the server reported but the
// lexer did not see. s.mu must be held.
func (s *session) identityReported(a *attachment) {
	switch {
	case s.pin.held&pinning.Role != 0 || s.p.cfg.Mode == ModeSession:
	case a.identity:
		// The lexer saw the change inside a block; the report comes
		// only at ReadyForQuery, after the block may have ended.
	case a.inBlock():
		a.identity = true
	default:
		s.pinLocked(a, pinning.Role, "an identity change the server reported")
	}
}

// resetIdentity undoes identity changes on a connection being returned to
// the pool; the caller destroys the connection if it fails.
func resetIdentity(conn *backend.Conn) error {
	err := exchange(conn, identityResetSQL, time.Now().Add(5*time.Second), nil)
	if st, _ := conn.State.(*serverState); st != nil {
		// The RESETs may have changed parameters the pooler synced.
		st.syncedKey = ""
		st.lastUser = 0
	}
	return err
}
