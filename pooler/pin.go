package pooler

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/sqllex"
	"github.com/pgquic/pgquic/pooler/pinning"
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
// comes. An identity pin, the pin of a FunctionCall message (whose
// effects no probe can list) and the pin of a call whose effect stays
// with the server process (setseed, pg_backup_start, a temporary
// replication slot: sqllex.ProcessState, which no probe sees and no reset
// undoes) last until the client disconnects; after the last, the
// connection is closed rather than reset.

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

// checkState refuses, under SessionStateError, a statement that would pin
// the client outside a transaction block, before any server connection is
// taken for it. Inside a block the statement runs and pins the client, as
// the state it creates outlives the block.
func (s *session) checkState(info sqlInfo) error {
	if info.load && s.p.cfg.Mode == ModeTransaction {
		// What a library does when loaded (its placeholders, its hooks)
		// stays with the server process, and no reset undoes it.
		return &PGError{
			Severity: "ERROR",
			Code:     pgproto.CodeFeatureNotSupported,
			Message:  "LOAD is not supported in transaction pooling mode",
			Hint:     "Connect in session mode, or have the server load the library for every session (session_preload_libraries).",
		}
	}
	in := info.pins
	if in.Holds == 0 || !in.Outside || s.p.cfg.SessionState != SessionStateError || s.p.cfg.Mode != ModeTransaction {
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
		Message:  fmt.Sprintf("%s is not supported outside a transaction block in transaction pooling mode (the pooler's session_state setting is \"error\")", in.Kind),
		Hint:     "Connect in session mode, or set session_state to \"pin\" to keep such clients on one server connection until they run DISCARD ALL or disconnect.",
	}
}

// handleFunctionCall forwards a FunctionCall message. The function is
// named by OID and the pooler does not look it up: it may be set_config,
// or anything else that changes the session, and no probe can tell what
// changed. In transaction mode the client is therefore pinned to its
// server connection (reason "opaque") until it leaves, when the connection
// is closed, in session mode too (the function may have left state in the
// server process that no reset ends); with SessionStateError the message
// is refused outside a transaction block instead. A FunctionCall never shares a server
// connection with other clients' requests (pipeline.go does not take it).
func (s *session) handleFunctionCall(ctx context.Context) error {
	if s.p.cfg.Mode != ModeTransaction {
		s.mu.Lock()
		s.processBound = true // the function may be setseed: see below
		s.mu.Unlock()
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
	s.pipeSeq = true // the function may call lastval
	a, err := s.attachLocked(ctx)
	if err != nil {
		s.mu.Unlock()
		return s.raise(err, true)
	}
	s.pinLocked(a, pinning.Opaque, "FunctionCall")
	// The OID may be setseed's, pg_backup_start's or another whose effect
	// stays with the server process (sqllex.ProcessState), which DISCARD
	// ALL does not end: the connection is closed when the client leaves.
	s.processBound = true
	s.push(a, entry{kind: eFunc})
	err = s.writeServer(a, nil)
	s.mu.Unlock()
	return err
}

// noteState records, once a's server is about to run a statement, the
// state it may create or drop. s.mu must be held.
func (s *session) noteState(a *attachment, in pinning.Info) {
	if in.Holds&pinning.Process != 0 {
		// In either mode the server process keeps what the call did
		// after DISCARD ALL: the connection is closed when the client
		// leaves (abandonLocked).
		s.processBound = true
	}
	if s.p.cfg.Mode != ModeTransaction {
		return
	}
	if in.Holds != 0 {
		// Pin at once; the probe then lifts the pin if the statement
		// failed, was rolled back, or made a table ON COMMIT DROP.
		s.pin.gen++
		s.pinLocked(a, in.Holds, in.Kind)
		s.pin.probe = true
	}
	if in.Opaque {
		s.pin.gen++
		s.pin.probe = true
	}
	if in.Releases&s.pin.held != 0 {
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
	if a.rider != nil {
		// The request that pinned it is on a lane: no other client's may
		// be written behind it from now on (riderLeftOpen takes the
		// connection off the lane once it is answered).
		a.rider.Solo()
	}
	names := pinning.Names(added)
	for _, n := range names {
		s.p.m.pins.WithLabelValues(n).Inc()
	}
	s.log.Info("client pinned to its server connection", "statement", kind,
		"reason", strings.Join(names, ","), "server_pid", a.conn.PID)
}

// unpinLocked drops the reasons in h (never the identity, FunctionCall
// or process pin: pinning.Sticky); the client is free to use any server
// connection once none is left. s.mu must be held.
func (s *session) unpinLocked(a *attachment, h sqllex.Held) {
	h &= s.pin.held &^ pinning.Sticky
	if h == 0 {
		return
	}
	s.pin.held &^= h
	if s.pin.held == 0 {
		s.pinned = false
		s.p.m.pinned.Dec()
		s.log.Info("client unpinned: its server connection holds no session state any more",
			"released", strings.Join(pinning.Names(h), ","), "server_pid", a.conn.PID)
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

// appendProbe appends the probe's Query frame (pinning.ProbeQuery) for a
// connection that logged in as login ("" when unknown).
func appendProbe(b []byte, login string) []byte {
	return appendQuery(b, pinning.ProbeQuery(login))
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
	if !s.pin.probe || s.p.cfg.Mode != ModeTransaction || a.begun || ((a.status == 'T' || a.status == 'E') && !ends) {
		return nil
	}
	if a.copy {
		// Nothing may follow a COPY that may be reading the client's
		// data: if the connection is released first, it is closed
		// (finishRelease), for what it holds is unknown.
		a.probeOwed = true
		return nil
	}
	s.pin.probe, a.probeOwed = false, false
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

// probeRowLocked reads the probe's DataRow (pinning.ReadProbeRow). s.mu
// must be held.
func (s *session) probeRowLocked(body []byte) {
	if p, ok := pinning.ReadProbeRow(body); ok {
		s.pin.found, s.pin.foundRole, s.pin.foundOK = p.Found, p.Role, p.Complete
	}
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
		s.pinLocked(a, pinning.Role, "DO, CALL or a function (the probe failed)")
	default:
		if role {
			// The client keeps the identity it chose, on this
			// connection, which is reset when the client leaves.
			s.pinLocked(a, pinning.Role, "an identity change by DO, CALL or a function")
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
	if s.pin.held&(sqllex.HeldAll|pinning.Opaque) == 0 || strings.EqualFold(strings.TrimSpace(resetQuery), "DISCARD ALL") {
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
