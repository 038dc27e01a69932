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
	"github.com/pgquic/pgquic/pooler/lanes"
	"github.com/pgquic/pgquic/pooler/params"
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
	inCopy    bool      // eSync: sent while copyOpen; dropped once the server is in COPY FROM STDIN (dropCopySyncs)

	// A client's Parse of a named statement: the name to drop again if the
	// server rejects or skips the Parse, as PostgreSQL would not create it.
	clientName string
	cst        *stmt

	// A quiet query of the pooler's own about run-time parameters (see
	// params.go); nil for every other entry.
	params *paramQuery

	replayHead bool // the first recorded message of a pipeline that may be retried (stale.go)

	early bool // a 0-RTT request run read-only: its replies are held (zerortt.go)
}

// attachment is a server connection lent to a session. Its fields are
// guarded by the session's mu, except clientGone.
type attachment struct {
	conn   *backend.Conn
	ddl    bool // the server ran DDL whose transaction has not ended (catalog.go)
	ranDDL bool // ... and ran DDL at all, ended or not
	// probeOwed says the probe was due but held back behind a COPY
	// (probeLocked).
	probeOwed bool
	// followOwed says the parameter query due after the client's request
	// was held back behind a COPY (followLocked): the connection is not
	// released before it has run.
	followOwed bool
	// owedRest, made when a parameter query becomes owed, is closed by
	// whoever reads the ReadyForQuery that leaves the connection at rest
	// with it still owed (atRestLocked): an owner waiting on it
	// (awaitOwedRest) then sends the query instead of waiting for a
	// client that may say nothing for a long time.
	owedRest chan struct{}
	// catalogAt is the catalog its first request was read by
	// (overlapsDDLLocked, sameCodeAfter).
	catalogAt catalogMark
	st        *serverState
	gen       uint64 // the session's count of attachments when this one began (a deferred cancel's check)
	queue     []entry
	head      int
	status    byte // last ReadyForQuery status

	batchStart time.Time // first message of the client's request not yet closed by Sync (see noteRequest)
	txStart    time.Time // first request of the transaction in progress
	readyAt    time.Time // when noteReady last read the clock, for finishRelease

	stampAttach bool // the first request on this attachment stamps s.lastRequest (noteRequest)

	released   bool // the relay gave the connection back (or lost it)
	skipping   bool // the server reported an error and skips messages until Sync
	relaying   bool // a relay goroutine runs for this attachment
	syncPoint  bool // the client's last message the server got was Sync, Query or FunctionCall (or none yet): no extended-protocol request is open (push)
	closing    bool // the client left; return the connection once idle
	begun      bool // a BEGIN was sent and no ReadyForQuery has said since whether a block is open
	copy       bool // a COPY was sent since the last ReadyForQuery: nothing may follow its synchronisation message
	copyOpen   bool // a COPY was sent and the client has not ended its data (CopyDone, CopyFail) since
	copyIn     bool // while copyOpen: the server said it waits for COPY data (CopyInResponse), and ignores Sync and Flush
	identity   bool // an identity change may outlive the transaction: reset before release
	destroy    bool // close the connection instead of returning it
	fatalSent  bool // the server's own FATAL error was forwarded to the client: add none of ours
	clientGone atomic.Bool
	quiet      atomic.Int32 // quiet entries queued: the relay's fast path must not forward their rows
	done       chan struct{}

	cancels *cancelGroup // cancels forwarded to this connection (see cancel.go)
	rider   *lanes.Rider // the request shares the connection with other clients' (pipeline.go); owner-only

	replay      *replayLog // the current pipeline as recorded for a retry, or nil (stale.go)
	heldT       []byte     // ParameterDescription of a Describe that may yet be retried (stale.go)
	replayFirst bool       // the next entry pushed is the first recorded one
}

// push records the reply e's message will produce. While the server is
// skipping messages after an error (until Sync), it produces none: the entry
// is discarded at once. s.mu must be held.
func (s *session) push(a *attachment, e entry) {
	if !e.quiet && !e.injected && e.kind != eSynthetic {
		// A client's message that reaches the server: after anything but
		// a Sync, a Query or a FunctionCall the server is inside the
		// client's extended-protocol request (its implicit transaction,
		// its unnamed portal) until a Sync, whatever the last
		// ReadyForQuery said.
		a.syncPoint = (e.kind == eSync && !e.inCopy) || e.kind == eQuery || e.kind == eFunc
	}
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
	if e.quiet || e.early {
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
		a.st.stmts.Forget(e.stmt, e.unnamed, s.id)
	case eClose:
		if e.injected && e.stmt != "" {
			// An eviction the server skipped: the statement stays there.
			a.st.stmts.MarkMaybe(e.stmt)
		}
	}
	if e.clientName != "" && s.stmts[e.clientName] == e.cst {
		s.dropClientStmt(e.clientName)
	}
}

func (a *attachment) pending() int { return len(a.queue) - a.head }

// clientPending counts the client's own entries still owed a reply: the
// pooler's quiet queries (the probe, a parameter read-back) left out.
func (a *attachment) clientPending() int {
	n := 0
	for i := a.head; i < len(a.queue); i++ {
		if !a.queue[i].quiet {
			n++
		}
	}
	return n
}

func (a *attachment) front() *entry {
	if a.head < len(a.queue) {
		return &a.queue[a.head]
	}
	return nil
}

func (a *attachment) pop() {
	if e := &a.queue[a.head]; e.quiet || e.early {
		a.quiet.Add(-1)
	}
	a.queue[a.head] = entry{}
	a.head++
	if a.head == len(a.queue) {
		a.queue, a.head = a.queue[:0], 0
	}
}

const (
	relayMore     relayResult = iota // keep reading the server
	relayWaiting                     // the server waits for the client (COPY IN, or nothing pending)
	relayReleased                    // the connection went back to the pool
	relayLost                        // the connection broke and was destroyed
)

const (
	restNone     restAction = iota // keep the connection (or nothing is at rest)
	restRelease                    // give it back to the pool (finishRelease)
	restLeftOpen                   // a shared connection left inside a transaction (riderLeftOpen)
)

// parameterStatusLocked follows a ParameterStatus: the reply to the
// pooler's own parameter sync, a value the client's own statement put back
// (the client's to see), or a change to note. s.mu must be held.
func (s *session) parameterStatusLocked(a *attachment, m *reply) {
	head := m.head
	switch {
	case head != nil && head.params != nil && head.params.sync:
		s.syncedParameter(a, m.body)
	case head != nil && head.params != nil && head.params.follow:
		// Caused by the client's own statement (a RESET put back to
		// its startup value): it is the client's to see.
		m.forward = true
		s.noteParameter(a, m.body, false)
	default:
		s.noteParameter(a, m.body, m.quiet)
	}
}

// notificationLocked passes a NotificationResponse on: it is the
// client's, whatever query runs. s.mu must be held.
func (s *session) notificationLocked(a *attachment, m *reply) {
	m.forward = true
	if s.p.cfg.Mode == ModeTransaction && len(m.body) >= 4 && binary.BigEndian.Uint32(m.body) == a.conn.PID {
		// Sent by the client's own NOTIFY: PostgreSQL gives the
		// notifying process's PID, which for the client is the one
		// BackendKeyData gave it (psycopg compares them), not the
		// server connection's.
		binary.BigEndian.PutUint32(m.body, s.pid)
	}
}

// serverErrorLocked handles an ErrorResponse: it is counted, a stale
// statement's error may be swallowed for a retry (stale.go), the statement
// cache is corrected, and the entries the server will now skip until Sync
// are dropped. s.mu must be held.
func (s *session) serverErrorLocked(a *attachment, rd *lanes.Rider, m *reply) {
	head, quiet := m.head, m.quiet
	if head != nil && head.params != nil {
		head.params.failed = true
	}
	if rd != nil && !quiet && errorCode(m.body) == pgproto.CodeQueryCanceled &&
		string(errorField(m.body, 'M')) == "canceling statement due to user request" && rd.HitByOthers() {
		m.body = errOthersCancel.encode(nil)[wire.HeaderLen:]
	}
	if !quiet {
		s.p.m.serverErrors.WithLabelValues(sqlstateClass(m.body)).Inc()
	}
	if m.forward && isFatal(m.body) {
		// PostgreSQL closes the connection after a FATAL error (57P01
		// after pg_terminate_backend, for instance): the client hears
		// why from the server and nothing more from the pooler.
		a.fatalSent = true
	}
	if head != nil && !quiet && s.retryStale(a, head, m.body) {
		m.forward = false
		return
	}
	if head != nil && head.stmt != "" {
		s.statementError(a, head, m.body)
	}
	if head != nil {
		switch head.kind {
		case eParse, eBind, eDescribe, eExecute, eClose:
			// The server now skips everything up to Sync, including
			// messages the client has not sent yet (see push), and a
			// Query or FunctionCall among them: PostgreSQL answers
			// nothing before the Sync (SocketBackend ends the skipping
			// only there).
			s.discardSkipped(a)
			if a.front() == nil {
				a.skipping = true
			}
		}
	}
}

// readyLocked handles a ReadyForQuery, which ends a Sync, Query or
// FunctionCall and says the transaction status. s.mu must be held.
func (s *session) readyLocked(a *attachment, m *reply) {
	if len(m.body) == 1 {
		a.status = m.body[0]
	}
	// Anything queued before it got no reply of its own: drop it, so a
	// tracking mistake can never leave the session waiting for a reply
	// that will not come.
	s.discardToSync(a)
	a.skipping = false
	if a.ddl && a.status == 'I' {
		switch head := a.front(); {
		case head != nil && head.quiet:
			// The pooler's own query, written ahead of the client's
			// (a parameter sync, DISCARD SEQUENCES): the client's DDL
			// has not run yet, let alone ended. Ending it here let a
			// catalog read during the DDL's transaction block, which
			// cannot see what it adds, stand for the catalog after it
			// (TestDDLBlockBehindSync).
		case a.clientPending() <= 1:
			// Everything the client sent was answered, outside any
			// block; what follows is the pooler's own (the probe).
			s.endDDLLocked(a)
		default:
			s.p.catalogOf(a.conn.Pool()).invalidate()
		}
	}
	if a.pending() <= 1 {
		a.begun = false // the status is current: it says whether a block is open
		a.copy, a.copyOpen, a.copyIn = false, false, false
		// Everything the client sent has been answered: no
		// extended-protocol request is open (a Sync marked inCopy, for
		// a COPY TO or one that failed to start, was answered after all).
		a.syncPoint = true
	}
	if head := a.front(); head != nil {
		m.head = head
		s.noteReady(a, head, a.status)
		m.forward = !head.quiet
		if head.reset {
			a.st.reset()
		}
		if head.probe {
			s.probeDoneLocked(a, head)
		}
		if head.params != nil {
			s.paramQueryDone(a, head.params)
		}
		m.pop = true
	}
}

// dropCopySyncs forgets the Syncs the client sent after a COPY and before
// ending its data, once the server says it waits for the data
// (CopyInResponse, the reply to the queue's head): in COPY FROM STDIN
// PostgreSQL ignores Sync (and Flush), so no ReadyForQuery answers them.
// s.mu must be held.
func (a *attachment) dropCopySyncs() {
	j := a.head + 1 // the head is the COPY's own Query or Execute
	for i := a.head + 1; i < len(a.queue); i++ {
		if e := a.queue[i]; e.kind == eSync && e.inCopy {
			continue
		}
		a.queue[j] = a.queue[i]
		j++
	}
	clear(a.queue[j:])
	a.queue = a.queue[:j]
}

// discardSkipped drops the entries before the next Sync, which the
// server skips after an error in an extended-protocol request, whatever
// they are. s.mu must be held.
func (s *session) discardSkipped(a *attachment) {
	for e := a.front(); e != nil && e.kind != eSync; e = a.front() {
		s.discard(a, e)
		a.pop()
	}
}

// discardToSync drops the entries before the next Sync, Query or
// FunctionCall: the server skips their messages (after an error) or has
// answered past them (at ReadyForQuery). s.mu must be held.
func (s *session) discardToSync(a *attachment) {
	for e := a.front(); e != nil && e.kind != eSync && e.kind != eQuery && e.kind != eFunc; e = a.front() {
		s.discard(a, e)
		a.pop()
	}
}

// riderLeftOpen handles a request on a shared connection that left a
// transaction block open, or pinned its client to the connection (its
// identity changed, as the server reported), either of which the lexer
// should have ruled out: alone on the connection, the session keeps it as
// any open transaction or pinned client would, and it is reset when the
// client leaves; with others behind it, whose requests would run inside
// this transaction or under this identity, the connection is closed
// (rolling everything back) and every client on it is told.
func (s *session) riderLeftOpen(a *attachment, rd *lanes.Rider) relayResult {
	if rd.Detach() {
		s.mu.Lock()
		a.rider = nil
		s.mu.Unlock()
		return relayWaiting
	}
	s.mu.Lock()
	why := errLeftOpen
	if a.status == 'I' {
		why = errPinnedOnLane
	}
	s.mu.Unlock()
	s.log.Error("closing a shared server connection", "reason", why)
	rd.Fail(why)
	s.serverLost(a, why)
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
		a.st.stmts.Remove(e.stmt)
		a.st.stmts.MarkMaybe(e.stmt)
		e.stmt = "" // already handled: discard must not forget it again
	case code == pgproto.CodeUndefinedPStatement && (e.kind == eBind || e.kind == eDescribe):
		a.st.stmts.Remove(e.stmt)
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
	s.endDDLLocked(a)
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
		rd.Fail(errors.Join(ErrServerLost, err)) // every client on the connection
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
	if !quiet && params.Reported(ps.Name) && s.desired[ps.Name] != ps.Value {
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
