package pooler

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/wire"
)

// entryKind is a client (or pooler) request whose reply the relay expects.
type entryKind uint8

const (
	eParse     entryKind = iota // ends with ParseComplete or ErrorResponse
	eBind                       // BindComplete
	eDescribe                   // RowDescription or NoData (after an optional ParameterDescription)
	eExecute                    // CommandComplete, EmptyQueryResponse or PortalSuspended
	eClose                      // CloseComplete
	eSync                       // ReadyForQuery
	eQuery                      // everything up to ReadyForQuery
	eFunc                       // FunctionCallResponse then ReadyForQuery
	eSynthetic                  // a reply the pooler writes itself when its turn comes
)

// entry is one expected reply, in the order the server will send them.
type entry struct {
	kind      entryKind
	injected  bool      // sent by the pooler: swallow the success reply
	quiet     bool      // pooler query: swallow every reply, ReadyForQuery included
	reset     bool      // the session-mode reset query: forget the server's statements
	probe     bool      // the pooler's session-state probe (pin.go)
	gen       uint64    // probe: the session's pin generation when it was sent
	stmt      string    // server statement name of a Parse, dropped from the cache on error
	unnamed   bool      // a Parse of the unnamed statement
	synthetic []byte    // eSynthetic: bytes to write
	rfq       bool      // eSynthetic: follow with ReadyForQuery(current status)
	start     time.Time // eSync, eQuery, eFunc: when the request they end began (see noteRequest)

	// A client's Parse of a named statement: the name to drop again if the
	// server rejects or skips the Parse, as PostgreSQL would not create it.
	clientName string
	cst        *stmt

	// A quiet query of the pooler's own about run-time parameters (see
	// params.go); nil for every other entry.
	params *paramQuery

	replayHead bool // the first recorded message of a pipeline that may be retried (stale.go)
}

// attachment is a server connection lent to a session. Its fields are
// guarded by the session's mu, except clientGone.
type attachment struct {
	conn   *backend.Conn
	st     *serverState
	gen    uint64 // the session's count of attachments when this one began (a deferred cancel's check)
	queue  []entry
	head   int
	status byte // last ReadyForQuery status

	batchStart time.Time // first message of the client's request not yet closed by Sync (see noteRequest)
	txStart    time.Time // first request of the transaction in progress

	released   bool // the relay gave the connection back (or lost it)
	skipping   bool // the server reported an error and skips messages until Sync
	relaying   bool // a relay goroutine runs for this attachment
	syncPoint  bool // the client's last forwarded message was Sync, Query, FunctionCall, CopyDone or CopyFail
	closing    bool // the client left; return the connection once idle
	begun      bool // a BEGIN was sent and no ReadyForQuery has said since whether a block is open
	copy       bool // a COPY was sent since the last ReadyForQuery: nothing may follow its synchronisation message
	identity   bool // an identity change may outlive the transaction: reset before release
	destroy    bool // close the connection instead of returning it
	fatalSent  bool // the server's own FATAL error was forwarded to the client: add none of ours
	clientGone atomic.Bool
	quiet      atomic.Int32 // quiet entries queued: the relay's fast path must not forward their rows
	done       chan struct{}

	cancels *cancelGroup // cancels forwarded to this connection (see cancel.go)
	rider   *rider       // the request shares the connection with other clients' (pipeline.go); owner-only

	replay      *replayLog // the current pipeline as recorded for a retry, or nil (stale.go)
	heldT       []byte     // ParameterDescription of a Describe that may yet be retried (stale.go)
	replayFirst bool       // the next entry pushed is the first recorded one
}

// push records the reply e's message will produce. While the server is
// skipping messages after an error (until Sync), it produces none: the entry
// is discarded at once. s.mu must be held.
func (s *session) push(a *attachment, e entry) {
	s.noteRequest(a, &e)
	if e.kind == eParse {
		s.ctr.ServerParses.Add(1) // a Parse written to the server, the client's or the pooler's
	}
	if a.skipping {
		if e.kind != eSync {
			s.discard(a, &e)
			return
		}
		a.skipping = false
	}
	if e.quiet {
		a.quiet.Add(1)
	}
	if a.replay != nil {
		s.recordPush(a, &e)
	}
	a.queue = append(a.queue, e)
}

// discard undoes what a message the server skipped would have done: a
// replayed Parse did not prepare anything, a client's Parse did not create
// its name. s.mu must be held.
func (s *session) discard(a *attachment, e *entry) {
	switch e.kind {
	case eParse:
		a.st.forget(e, s.id)
	case eClose:
		if e.injected && e.stmt != "" {
			// An eviction the server skipped: the statement stays there.
			a.st.maybe[e.stmt] = struct{}{}
		}
	}
	if e.clientName != "" && s.stmts[e.clientName] == e.cst {
		s.dropClientStmt(e.clientName)
	}
}

func (a *attachment) pending() int { return len(a.queue) - a.head }

func (a *attachment) front() *entry {
	if a.head < len(a.queue) {
		return &a.queue[a.head]
	}
	return nil
}

func (a *attachment) pop() {
	if a.queue[a.head].quiet {
		a.quiet.Add(-1)
	}
	a.queue[a.head] = entry{}
	a.head++
	if a.head == len(a.queue) {
		a.queue, a.head = a.queue[:0], 0
	}
}

// relayResult says what handling one server message led to.
type relayResult uint8

const (
	relayMore     relayResult = iota // keep reading the server
	relayWaiting                     // the server waits for the client (COPY IN, or nothing pending)
	relayReleased                    // the connection went back to the pool
	relayLost                        // the connection broke and was destroyed
)

// relay forwards the server's replies to the client from its own goroutine
// until the connection goes back to the pool or breaks. The owner starts it
// when it must read the client while replies are still due (after a Flush,
// in a pipeline not yet closed by Sync, during COPY IN).
func (s *session) relay(a *attachment) {
	defer close(a.done)
	for {
		switch s.relayOne(a) {
		case relayReleased, relayLost:
			return
		}
	}
}

// relayInline lets the owner read the replies itself when the client's last
// message was a synchronisation point (Sync, Query, CopyDone...) and nothing
// more from the client is buffered: the common request/response case costs
// no goroutine hand-off. It returns when the connection went back, the
// server waits for the client, or nothing is pending any more.
func (s *session) relayInline(a *attachment) relayResult {
	if s.peer.Probe != nil {
		s.markStuck()
		defer s.stuck.Store(0)
	}
	for {
		switch r := s.relayOne(a); r {
		case relayReleased, relayLost, relayWaiting:
			return r
		}
	}
}

// relayOne reads and handles one server message. It is called by exactly
// one goroutine at a time for a given attachment: the owner inline, or the
// relay goroutine.
func (s *session) relayOne(a *attachment) relayResult {
	rd := a.rider
	if rd != nil && !rd.myTurn {
		// Other clients' replies come first on a shared connection.
		if err := s.awaitTurn(a, rd); err != nil {
			s.serverLost(a, err)
			return relayLost
		}
	}
	r := a.conn.R
	if r.Buffered() == 0 {
		s.relayFlush(a)
	}
	typ, _, err := r.Next()
	if err != nil {
		if s.relayStopped(a, err) {
			return relayReleased
		}
		s.serverLost(a, err)
		return relayLost
	}
	// Fast path: rows and notices change no state, unless they answer a
	// quiet query of the pooler's own (the slow path swallows them).
	// Notifications take the slow path (see case 'A' below).
	switch typ {
	case 'D', 'd', 'N':
		if a.quiet.Load() > 0 {
			break
		}
		if a.clientGone.Load() {
			_ = r.Skip()
			return relayMore
		}
		// cwMu is held only while writing: PostgreSQL may flush half a
		// frame and then wait for more of a pipeline, which the owner can
		// send only if it is not waiting for cwMu.
		if err = r.ForwardLocked(&s.cwMu, s.cwFn); err != nil {
			var we *wire.WriteError
			if !errors.As(err, &we) {
				s.serverLost(a, err)
				return relayLost
			}
			s.relayWriteFailed(a, err)
		}
		return relayMore
	}

	// Read the whole message before taking s.mu, for the same reason.
	body, err := r.Body()
	if err != nil {
		s.serverLost(a, err)
		return relayLost
	}
	if rd != nil {
		// The connection's statement cache and parameters are shared
		// with the rider writing behind us.
		rd.l.stMu.Lock()
	}
	s.mu.Lock()
	head := a.front()
	quiet := head != nil && head.quiet
	forward := !quiet
	pop := false
	result := relayMore
	switch typ {
	case '1': // ParseComplete
		if head != nil && head.kind == eParse {
			forward = forward && !head.injected
			pop = true
			a.st.confirm(head, s.id)
		}
	case '2': // BindComplete
		if head != nil && head.kind == eBind {
			forward = forward && !head.injected
			pop = true
		}
	case '3': // CloseComplete
		if head != nil && head.kind == eClose {
			forward = forward && !head.injected
			pop = true
		}
	case 'T': // RowDescription ends a Describe
		pop = head != nil && head.kind == eDescribe
		if head != nil && head.params != nil {
			head.params.results++
		}
	case 'n': // NoData
		pop = head != nil && head.kind == eDescribe
	case 'C', 'I', 's': // CommandComplete, EmptyQueryResponse, PortalSuspended
		pop = head != nil && head.kind == eExecute
		if typ == 'C' && len(body) > 0 && body[0] == 'D' {
			s.serverDropped(a, body, quiet)
		}
	case 'G', 'W': // CopyInResponse, CopyBothResponse: the server waits for data
		result = relayWaiting
	case 't': // ParameterDescription
		if forward && head != nil && head.replayHead && head.kind == eDescribe {
			// Held back until the Describe succeeds: if its statement
			// turns out stale, the retry sends it again.
			a.heldT = bytes.Clone(body)
			forward = false
		}
	case 'S': // ParameterStatus
		switch {
		case head != nil && head.params != nil && head.params.sync:
			s.syncedParameter(a, body)
		case head != nil && head.params != nil && head.params.follow:
			// Caused by the client's own statement (a RESET put back to
			// its startup value): it is the client's to see.
			forward = true
			s.noteParameter(a, body, false)
		default:
			s.noteParameter(a, body, quiet)
		}
	case 'D': // DataRow: only a quiet query's comes here
		switch {
		case head != nil && head.probe:
			s.probeRowLocked(body)
		case head != nil && head.params != nil:
			head.params.row(body)
		}
	case 'A': // NotificationResponse: the client's, whatever query runs
		forward = true
		if s.p.cfg.Mode == ModeTransaction && len(body) >= 4 && binary.BigEndian.Uint32(body) == a.conn.PID {
			// Sent by the client's own NOTIFY: PostgreSQL gives the
			// notifying process's PID, which for the client is the one
			// BackendKeyData gave it (psycopg compares them), not the
			// server connection's.
			binary.BigEndian.PutUint32(body, s.pid)
		}
	case 'E':
		if head != nil && head.params != nil {
			head.params.failed = true
		}
		if rd != nil && !quiet && errorCode(body) == pgproto.CodeQueryCanceled &&
			string(errorField(body, 'M')) == "canceling statement due to user request" && rd.l.lp.hitByOthers(rd) {
			body = errOthersCancel.encode(nil)[wire.HeaderLen:]
		}
		if !quiet {
			s.p.m.serverErrors.WithLabelValues(sqlstateClass(body)).Inc()
		}
		if forward && isFatal(body) {
			// PostgreSQL closes the connection after a FATAL error (57P01
			// after pg_terminate_backend, for instance): the client hears
			// why from the server and nothing more from the pooler.
			a.fatalSent = true
		}
		if head != nil && !quiet && s.retryStale(a, head, body) {
			forward = false
			break
		}
		if head != nil && head.stmt != "" {
			s.statementError(a, head, body)
		}
		if head != nil {
			switch head.kind {
			case eParse, eBind, eDescribe, eExecute, eClose:
				// The server now skips everything up to Sync, including
				// messages the client has not sent yet (see push).
				for e := a.front(); e != nil && e.kind != eSync && e.kind != eQuery && e.kind != eFunc; e = a.front() {
					s.discard(a, e)
					a.pop()
				}
				if a.front() == nil {
					a.skipping = true
				}
			}
		}
	case 'Z':
		if len(body) == 1 {
			a.status = body[0]
		}
		// ReadyForQuery ends a Sync, Query or FunctionCall. Anything queued
		// before it got no reply of its own: drop it, so a tracking mistake
		// can never leave the session waiting for a reply that will not come.
		for e := a.front(); e != nil && e.kind != eSync && e.kind != eQuery && e.kind != eFunc; e = a.front() {
			s.discard(a, e)
			a.pop()
		}
		a.skipping = false
		if a.pending() <= 1 {
			a.begun = false // the status is current: it says whether a block is open
			a.copy = false
		}
		if head = a.front(); head != nil {
			s.noteReady(a, head, a.status)
			forward = !head.quiet
			if head.reset {
				a.st.reset()
			}
			if head.probe {
				s.probeDoneLocked(a, head)
			}
			if head.params != nil {
				s.paramQueryDone(a, head.params)
			}
			pop = true
		}
	}
	if forward && !a.clientGone.Load() {
		s.cwMu.Lock()
		if a.heldT != nil {
			_ = writeFrame(s, 't', a.heldT)
			a.heldT = nil
		}
		err = writeFrame(s, typ, body)
		s.cwMu.Unlock()
		if err != nil {
			s.relayWriteFailed(a, err)
		}
	}
	if pop {
		a.pop()
		if typ == 'Z' {
			s.queryAnsweredLocked(a)
		}
	}
	s.emitSynthetic(a)
	if typ == 'Z' && a.pending() == 0 {
		if rd != nil && a.status != 'I' {
			s.mu.Unlock()
			rd.l.stMu.Unlock()
			return s.riderLeftOpen(a, rd)
		}
		if s.releasable(a) {
			a.released = true
			s.mu.Unlock()
			if rd != nil {
				rd.l.stMu.Unlock()
			}
			s.finishRelease(a)
			return relayReleased
		}
		result = relayWaiting
	}
	s.mu.Unlock()
	if rd != nil {
		rd.l.stMu.Unlock()
	}
	return result
}

// riderLeftOpen handles a request on a shared connection that left a
// transaction block open, which the lexer should have ruled out: alone on
// the connection, the session keeps it as any open transaction would;
// with others behind it, whose requests would run inside this
// transaction, the connection is closed (rolling everything back) and
// every client on it is told.
func (s *session) riderLeftOpen(a *attachment, rd *rider) relayResult {
	if rd.l.lp.detach(rd) {
		s.mu.Lock()
		a.rider = nil
		s.mu.Unlock()
		return relayWaiting
	}
	s.log.Error("a pipelined request left a transaction open; closing the shared server connection")
	rd.l.lp.fail(rd, errLeftOpen)
	s.serverLost(a, errLeftOpen)
	return relayLost
}

// statementError brings the statement cache back in line when the server
// contradicts it about a statement the pooler named: 42P05 for a Parse means
// the name exists after all (it is closed before the next Parse), 26000 for
// a Bind or Describe means it does not (the next use prepares it again). The
// request at hand still fails; the next one does not. s.mu must be held.
func (s *session) statementError(a *attachment, e *entry, body []byte) {
	switch code := errorCode(body); {
	case code == pgproto.CodeDuplicatePStatement && e.kind == eParse:
		a.st.remove(e.stmt)
		a.st.maybe[e.stmt] = struct{}{}
		e.stmt = "" // already handled: discard must not forget it again
	case code == pgproto.CodeUndefinedPStatement && (e.kind == eBind || e.kind == eDescribe):
		a.st.remove(e.stmt)
	}
}

// errorCode returns the SQLSTATE field of an ErrorResponse body.
func errorCode(body []byte) string {
	return string(errorField(body, 'C'))
}

// isFatal reports whether an ErrorResponse body says FATAL or PANIC, after
// which PostgreSQL closes the connection. The non-localised severity (V,
// sent since PostgreSQL 9.6) is preferred over the localised one (S).
func isFatal(body []byte) bool {
	sev := errorField(body, 'V')
	if sev == nil {
		sev = errorField(body, 'S')
	}
	return string(sev) == "FATAL" || string(sev) == "PANIC"
}

// errorField returns field f of an ErrorResponse or NoticeResponse body, or
// nil when it is absent.
func errorField(body []byte, f byte) []byte {
	for len(body) > 1 {
		i := bytes.IndexByte(body[1:], 0)
		if i < 0 {
			return nil
		}
		if body[0] == f {
			return body[1 : 1+i]
		}
		body = body[2+i:]
	}
	return nil
}

// releasable reports whether a connection at rest (ReadyForQuery seen,
// nothing pending) goes back to the pool. s.mu must be held.
func (s *session) releasable(a *attachment) bool {
	if a.status != 'I' {
		return false // inside a transaction, or a failed one awaiting ROLLBACK
	}
	return a.closing || (s.p.cfg.Mode == ModeTransaction && !s.pinned)
}

// emitSynthetic writes the pooler's own replies that have reached the head
// of the queue. s.mu must be held.
func (s *session) emitSynthetic(a *attachment) {
	for e := a.front(); e != nil && e.kind == eSynthetic; e = a.front() {
		if !a.clientGone.Load() {
			msg := e.synthetic
			if e.rfq {
				msg = append(msg, readyForQuery(a.status)...)
			}
			if err := s.writeClient(msg); err != nil {
				s.relayWriteFailed(a, err)
			}
		}
		a.pop()
	}
}

// finishRelease returns a's connection to its pool once the owner has no
// half-written message in its buffer, after flushing the client. A cancel
// still in flight for the connection is waited for first (bounded by
// cancelSettleTimeout), so it cannot reach whoever borrows the connection
// next; if it does not complete, the connection is destroyed instead.
func (s *session) finishRelease(a *attachment) {
	s.wmu.Lock()
	s.wmu.Unlock() //nolint:staticcheck // waits for the owner's in-flight flush
	s.busy.Store(false)
	if !a.clientGone.Load() {
		if err := s.flushClient(); err != nil {
			a.clientGone.Store(true)
		}
	}
	s.mu.Lock()
	destroy := a.destroy
	draining := s.draining
	resetID := a.identity
	cancels := a.cancels
	s.mu.Unlock()
	// Cancels first: one still in flight could hit the identity reset.
	if cancels != nil && !destroy && !s.cancelsSettled(cancels) {
		destroy = true
	}
	if !destroy && resetID {
		if err := resetIdentity(a.conn); err != nil {
			s.log.Warn("resetting the identity of a server connection failed; closing it", "err", err)
			destroy = true
		}
	}
	switch {
	case a.rider != nil:
		s.p.leave(a.rider, destroy) // the next client's replies, or back to the pool
	case destroy:
		a.conn.Destroy()
	default:
		a.conn.Release()
	}
	s.p.m.assignments.Inc()
	if draining {
		s.closeClient()
	}
}

// relayStopped handles the read deadline the owner sets to stop an idle
// relay at session end; it returns true when the connection was returned.
func (s *session) relayStopped(a *attachment, err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	s.mu.Lock()
	ok := a.closing && !a.destroy && a.pending() == 0 && a.status == 'I'
	if ok {
		a.released = true
	}
	s.mu.Unlock()
	if !ok {
		return false
	}
	_ = a.conn.NetConn().SetReadDeadline(time.Time{})
	s.finishRelease(a)
	return true
}

// serverLost handles a broken server connection: the client is told with
// FATAL 08006 (unless the server already sent it a FATAL error of its own,
// after which PostgreSQL sends nothing more) and its stream closed, and the
// connection is destroyed.
func (s *session) serverLost(a *attachment, err error) {
	s.mu.Lock()
	a.released = true
	a.destroy = true
	gone := a.clientGone.Load() || a.closing
	told := a.fatalSent
	s.busy.Store(false)
	s.mu.Unlock()
	switch {
	case gone:
	case told:
		_ = s.flushClient()
		s.log.Info("server connection closed after a FATAL error", "err", err)
	default:
		pe := fatal(pgproto.CodeConnectionFailure, "server connection lost", errors.Join(ErrServerLost, err))
		s.p.m.errors.WithLabelValues(pe.Code).Inc()
		_ = s.writeClient(pe.encode(nil))
		_ = s.flushClient()
		s.log.Warn("server connection lost", "err", err)
	}
	s.wmu.Lock()
	s.wmu.Unlock() //nolint:staticcheck // waits for the owner's in-flight flush
	if rd := a.rider; rd != nil {
		rd.l.lp.fail(rd, errors.Join(ErrServerLost, err)) // every client on the connection
	}
	a.conn.Destroy()
	s.closeClient()
}

// relayFlush pushes buffered replies to the client.
func (s *session) relayFlush(a *attachment) {
	if a.clientGone.Load() {
		return
	}
	if err := s.flushClient(); err != nil {
		s.relayWriteFailed(a, err)
	}
}

// relayWriteFailed records that the client cannot be written to; the relay
// keeps reading the server so the connection reaches a safe point.
func (s *session) relayWriteFailed(a *attachment, err error) {
	if !a.clientGone.Swap(true) {
		s.log.Debug("writing to client failed", "err", err)
		s.closeClient()
	}
}

// noteParameter tracks a ParameterStatus: the server's value, and, when the
// client caused it with SET, the value the client now expects. s.mu held.
func (s *session) noteParameter(a *attachment, body []byte, quiet bool) {
	var ps pgproto3.ParameterStatus
	if ps.Decode(body) != nil {
		return
	}
	if a.conn.Params[ps.Name] != ps.Value {
		a.conn.SetParam(ps.Name, ps.Value)
		a.st.syncedKey = ""
	}
	if !quiet && (ps.Name == "session_authorization" || ps.Name == "is_superuser") {
		// However the client changed its identity (a DO block, a
		// function), the server reports this. Inside a transaction block
		// it is undone before release; outside one it has already taken
		// effect, so the client stays on this connection, or its next
		// statement would run under an identity it did not choose.
		s.identityReported(a)
	}
	if !quiet && trackedReported[ps.Name] && s.desired[ps.Name] != ps.Value {
		s.desired[ps.Name] = ps.Value
		s.paramKey = ""
	}
}

// writeFrame writes a decoded message back out; cwMu must be held.
func writeFrame(s *session, typ byte, body []byte) error {
	n := uint32(len(body) + 4)
	w := s.clientWriter()
	_ = w.WriteByte(typ)
	_ = w.WriteByte(byte(n >> 24))
	_ = w.WriteByte(byte(n >> 16))
	_ = w.WriteByte(byte(n >> 8))
	if err := w.WriteByte(byte(n)); err != nil {
		return err
	}
	_, err := w.Write(body)
	return err
}
