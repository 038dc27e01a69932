package pooler

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/sqllex"
	"github.com/pgquic/pgquic/pooler/params"
)

// Pinning in transaction mode.
//
// Some session state cannot follow a client to another server connection:
// temporary tables, LISTEN, session advisory locks, WITH HOLD cursors,
// SQL-level PREPAREd statements, and (identity.go) an identity change made
// outside a transaction block. A client that may hold any of them keeps its
// server connection (it is pinned) until it disconnects or the server holds
// none of them any more; with SessionStateError the statements are refused
// outside a transaction block instead.
//
// The statements are found by a lexer (internal/sqllex) in every simple
// Query and every Parse's text, noted when the server is about to run them,
// and a statement that may hold state pins at once, whether or not it
// succeeds: the pooler errs towards pinning. Unpinning, in contrast, asks
// the server: after a statement that may hold state (it may have failed or
// been rolled back), one that may drop state the client holds (DISCARD
// ALL/TEMP, DROP, UNLISTEN, pg_advisory_unlock*, CLOSE, DEALLOCATE) or one
// that may change the session in ways the text does not show (DO, CALL, a
// call of a function the lexer cannot vouch for), the pooler pipelines one
// quiet probe query behind the client's next synchronisation point, at a
// moment no transaction block is open. The probe reads the server's own
// catalogues (pg_my_temp_schema, pg_listening_channels, pg_locks,
// pg_cursors, pg_prepared_statements) and whether current_user or
// session_user differs from the login role; the client stays pinned for
// exactly the kinds it still reports, and is pinned for kinds, or an
// identity, a DO block, procedure or function created. The client never
// waits for the probe: its reply has been sent before the probe's answer
// comes. An identity pin, and the pin of a FunctionCall message (whose
// effects no probe can list), last until the client disconnects.

// pinRole is the pin an identity change outside a transaction block sets
// (see identity.go), or one the probe found after DO, CALL or a function;
// pinOpaque is the pin a FunctionCall message sets: the function it calls
// (set_config, say) may have changed anything. Neither is lifted before
// the client leaves. The other bits are sqllex.Held kinds.
const (
	pinOpaque sqllex.Held = 1 << 6
	pinRole   sqllex.Held = 1 << 7
)

// pinNames returns the reasons in h, for the metric label and log lines.
func pinNames(h sqllex.Held) []string {
	names := h.Names()
	if h&pinOpaque != 0 {
		names = append(names, "opaque")
	}
	if h&pinRole != 0 {
		names = append(names, "role")
	}
	return names
}

// pinState is what a session knows of the state pinning it. It is guarded
// by the session's mu; s.pinned mirrors held != 0 for the code that only
// asks whether the client is pinned.
type pinState struct {
	held  sqllex.Held // why the client keeps its server connection
	gen   uint64      // bumped whenever a statement may have created state
	probe bool        // ask the server at the next safe point what it holds

	found     sqllex.Held // the probe's answer, being read
	foundRole bool        // the probe found the identity changed
	foundOK   bool        // the probe returned its row
}

// pinInfo is what a statement text may do to unmovable session state.
type pinInfo struct {
	holds    sqllex.Held // state it may create
	releases sqllex.Held // state it may drop
	opaque   bool        // DO, CALL, an opaque function call or DDL: may create state the text does not show
	outside  bool        // a holding statement comes where the text has not opened a block
	kind     string      // the first holding statement, for logs and errors
}

// readPins reads what sql, whose statements' union of flags is sum, does
// to session state. Text that holds nothing costs nothing more.
func readPins(sql string, sum sqllex.Flags) pinInfo {
	// CREATE and SELECT INTO of an unqualified name create a temporary
	// object when the session's search_path lists pg_temp first, which the
	// text does not show: the probe asks the server, as after DO.
	in := pinInfo{holds: sum.Holds(), releases: sum.Releases(), opaque: sum.Opaque() || sum&sqllex.SchemaChange != 0}
	if in.holds == 0 {
		return in
	}
	in.kind = sqllex.StateKind(sql)
	if sum&sqllex.Unsure != 0 {
		in.outside = true
		return in
	}
	open := false
	for st := range sqllex.Statements(sql) {
		switch {
		case st.Flags&sqllex.Begin != 0:
			open = true
		case st.Flags&(sqllex.Commit|sqllex.Rollback|sqllex.PrepareTransaction) != 0:
			open = st.Flags&sqllex.Chain != 0
		}
		if st.Flags.Holds() != 0 && !open {
			in.outside = true
		}
	}
	return in
}

// checkState refuses, under SessionStateError, a statement that would pin
// the client outside a transaction block, before any server connection is
// taken for it. Inside a block the statement runs and pins the client, as
// the state it creates outlives the block.
func (s *session) checkState(info sqlInfo) error {
	in := info.pins
	if in.holds == 0 || !in.outside || s.p.cfg.SessionState != SessionStateError || s.p.cfg.Mode != ModeTransaction {
		return nil
	}
	s.mu.Lock()
	ok := s.pin.held != 0 || (s.att != nil && !s.att.released && s.att.inBlock())
	s.mu.Unlock()
	if ok {
		return nil
	}
	return &PGError{
		Severity: "ERROR",
		Code:     pgproto.CodeFeatureNotSupported,
		Message:  fmt.Sprintf("%s is not supported outside a transaction block in transaction pooling mode (the pooler's session_state setting is \"error\")", in.kind),
		Hint:     "Connect in session mode, or set session_state to \"pin\" to keep such clients on one server connection until they run DISCARD ALL or disconnect.",
	}
}

// handleFunctionCall forwards a FunctionCall message. The function is
// named by OID and the pooler does not look it up: it may be set_config,
// or anything else that changes the session, and no probe can tell what
// changed. In transaction mode the client is therefore pinned to its
// server connection (reason "opaque") until it leaves, when the connection
// is reset; with SessionStateError the message is refused outside a
// transaction block instead. A FunctionCall never shares a server
// connection with other clients' requests (pipeline.go does not take it).
func (s *session) handleFunctionCall(ctx context.Context) error {
	if s.p.cfg.Mode != ModeTransaction {
		return s.forward(ctx, eFunc)
	}
	s.mu.Lock()
	ok := s.pin.held != 0 || (s.att != nil && !s.att.released && s.att.inBlock())
	s.mu.Unlock()
	if !ok && s.p.cfg.SessionState == SessionStateError {
		return s.raise(&PGError{
			Severity: "ERROR",
			Code:     pgproto.CodeFeatureNotSupported,
			Message:  "FunctionCall messages are not supported outside a transaction block in transaction pooling mode (the pooler's session_state setting is \"error\")",
			Hint:     "Call the function with a query instead, connect in session mode, or set session_state to \"pin\".",
		}, true)
	}
	s.mu.Lock()
	a, err := s.attachLocked(ctx)
	if err != nil {
		s.mu.Unlock()
		return s.raise(err, true)
	}
	s.pinLocked(a, pinOpaque, "FunctionCall")
	s.push(a, entry{kind: eFunc})
	err = s.writeServer(a, nil)
	s.mu.Unlock()
	return err
}

// noteState records, once a's server is about to run a statement, the
// state it may create or drop. s.mu must be held.
func (s *session) noteState(a *attachment, in pinInfo) {
	if s.p.cfg.Mode != ModeTransaction {
		return
	}
	if in.holds != 0 {
		// Pin at once; the probe then lifts the pin if the statement
		// failed, was rolled back, or made a table ON COMMIT DROP.
		s.pin.gen++
		s.pinLocked(a, in.holds, in.kind)
		s.pin.probe = true
	}
	if in.opaque {
		s.pin.gen++
		s.pin.probe = true
	}
	if in.releases&s.pin.held != 0 {
		s.pin.probe = true
	}
}

// pinLocked pins the client to a's server for the reasons in h, counting
// and logging the reasons it did not have yet. s.mu must be held.
func (s *session) pinLocked(a *attachment, h sqllex.Held, kind string) {
	added := h &^ s.pin.held
	if added == 0 {
		return
	}
	if s.pin.held == 0 {
		s.p.m.pinned.Inc()
	}
	s.pin.held |= added
	s.pinned = true
	names := pinNames(added)
	for _, n := range names {
		s.p.m.pins.WithLabelValues(n).Inc()
	}
	s.log.Info("client pinned to its server connection", "statement", kind,
		"reason", strings.Join(names, ","), "server_pid", a.conn.PID)
}

// unpinLocked drops the reasons in h (never the identity or FunctionCall
// pin); the client is free to use any server connection once none is left.
// s.mu must be held.
func (s *session) unpinLocked(a *attachment, h sqllex.Held) {
	h &= s.pin.held &^ (pinRole | pinOpaque)
	if h == 0 {
		return
	}
	s.pin.held &^= h
	if s.pin.held == 0 {
		s.pinned = false
		s.p.m.pinned.Dec()
		s.log.Info("client unpinned: its server connection holds no session state any more",
			"released", strings.Join(pinNames(h), ","), "server_pid", a.conn.PID)
	}
}

// endPins forgets the session's pins when it ends.
func (s *session) endPins() {
	s.mu.Lock()
	if s.pin.held != 0 {
		s.p.m.pinned.Dec()
		s.pin.held = 0
		s.pinned = false
	}
	s.mu.Unlock()
}

// probeSQL asks the server which unmovable state the session holds, one
// boolean per sqllex.Held kind in bit order; appendProbe adds whether the
// identity moved away from the login role. Operators are qualified, so a
// client's objects cannot stand in for them.
const probeSQL = "SELECT" +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_class WHERE relnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())" +
	" OR EXISTS (SELECT 1 FROM pg_catalog.pg_proc WHERE pronamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())" +
	" OR EXISTS (SELECT 1 FROM pg_catalog.pg_type WHERE typnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()), " +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_listening_channels()), " +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory'" +
	" AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()), " +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_cursors WHERE is_holdable), " +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_prepared_statements WHERE from_sql)"

// probeColumns is the number of columns of the probe's row.
const probeColumns = 6

// appendProbe appends the probe's Query frame for a connection that logged
// in as login ("" when unknown). Its last column is true when current_user
// or session_user differs from the login role: DO, CALL, a function or a
// FunctionCall message may have run SET ROLE or SET SESSION AUTHORIZATION,
// which the server reports (through is_superuser) only when superuser
// status changes. CURRENT_USER and SESSION_USER are keywords, which no
// client's object can stand in for.
func appendProbe(b []byte, login string) []byte {
	id := "NOT (current_user OPERATOR(pg_catalog.=) session_user"
	if login != "" {
		id += " AND session_user OPERATOR(pg_catalog.=) " + params.QuoteLiteral(login) + "::pg_catalog.name"
	}
	return appendQuery(b, probeSQL+", "+id+")")
}

// probeLocked returns the probe's Query frame, and queues its quiet reply,
// when one is wanted, no transaction block will be open on a's server
// once the request just staged has run, as far as the pooler knows (ends:
// that request ends the block the last ReadyForQuery reported), and no
// COPY was sent (a Query reaching a server that waits for copy data breaks
// the COPY); otherwise nil, and the probe waits for the next safe point. A
// wrong guess costs only a probe whose answer is not used. s.mu must be
// held.
func (s *session) probeLocked(a *attachment, ends bool) []byte {
	if !s.pin.probe || s.p.cfg.Mode != ModeTransaction || a.begun || ((a.status == 'T' || a.status == 'E') && !ends) || a.copy {
		return nil
	}
	s.pin.probe = false
	s.push(a, entry{kind: eQuery, quiet: true, probe: true, gen: s.pin.gen})
	return appendProbe(nil, a.conn.ServerDefaults["session_authorization"])
}

// writeServerProbing stages frame, a request with the statements info,
// for a's server followed, when one is due, by the probe. s.mu must be
// held.
func (s *session) writeServerProbing(a *attachment, frame []byte, info sqlInfo) error {
	if err := s.writeServer(a, frame); err != nil {
		return err
	}
	if p := s.probeLocked(a, info.ends && !info.begins); p != nil {
		return s.writeServer(a, p)
	}
	return nil
}

// syncProbingLocked stages the client's Sync for a's server followed, when
// one is due, by the probe. s.mu must be held.
func (s *session) syncProbingLocked(a *attachment) error {
	if !s.pin.probe || s.msgLen != 5 {
		return s.writeServer(a, nil)
	}
	if err := s.cr.Skip(); err != nil {
		return err
	}
	return s.writeServerProbing(a, []byte{'S', 0, 0, 0, 4}, sqlInfo{})
}

// probeRowLocked reads the probe's DataRow. s.mu must be held.
func (s *session) probeRowLocked(body []byte) {
	if len(body) < 2 {
		return
	}
	n := int(binary.BigEndian.Uint16(body))
	body = body[2:]
	var found sqllex.Held
	role := false
	for i := range n {
		if len(body) < 4 {
			return
		}
		l := int(int32(binary.BigEndian.Uint32(body)))
		body = body[4:]
		if l < 0 || l > len(body) {
			return
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
	s.pin.found, s.pin.foundRole, s.pin.foundOK = found&sqllex.HeldAll, role, n == probeColumns
}

// probeDoneLocked applies the probe's answer at its ReadyForQuery: the
// client stays pinned for what the server still holds and is pinned for
// what it holds unannounced. If the probe ran inside a transaction block
// it is asked again at the next safe point; if it failed the client stays
// pinned. s.mu must be held.
func (s *session) probeDoneLocked(a *attachment, e *entry) {
	found, role, ok := s.pin.found, s.pin.foundRole, s.pin.foundOK
	s.pin.found, s.pin.foundRole, s.pin.foundOK = 0, false, false
	switch {
	case a.status != 'I':
		s.pin.probe = true
	case !ok:
		// No answer: the identity may have changed unseen, so the
		// connection must be reset before anyone else borrows it.
		s.pinLocked(a, pinRole, "DO, CALL or a function (the probe failed)")
	default:
		if role {
			// The client keeps the identity it chose, on this
			// connection, which is reset when the client leaves.
			s.pinLocked(a, pinRole, "an identity change by DO, CALL or a function")
		}
		s.pinLocked(a, found, "DO, CALL or a function")
		if e.gen == s.pin.gen {
			// Nothing that may create state ran since the probe was sent.
			s.unpinLocked(a, sqllex.HeldAll&^found)
		}
	}
}

// appendStateReset appends, for a client leaving while pinned by session
// state or a FunctionCall, a DISCARD ALL to the teardown queries q unless resetQuery is one
// already, so the state never reaches the next borrower whatever reset
// query is configured. s.mu must be held.
func (s *session) appendStateReset(a *attachment, q []byte, resetQuery string) []byte {
	if s.pin.held&(sqllex.HeldAll|pinOpaque) == 0 || strings.EqualFold(strings.TrimSpace(resetQuery), "DISCARD ALL") {
		return q
	}
	s.push(a, entry{kind: eQuery, quiet: true, reset: true})
	return appendQuery(q, "DISCARD ALL")
}

// relayNotificationsLocked starts the relay goroutine for a client pinned
// by LISTEN whose server owes nothing, so notifications reach it while it
// is idle: otherwise nobody reads the server until the client's next
// request. The relay runs until the connection is released (after UNLISTEN
// or DISCARD ALL) or the session ends. Only the owner calls it, between
// reads of the client, so it never reads the server at the same time.
// s.mu must be held.
func (s *session) relayNotificationsLocked(a *attachment) {
	if a != nil && s.pin.held&sqllex.HeldListen != 0 && !a.released && !a.relaying {
		s.startRelayLocked(a)
	}
}
