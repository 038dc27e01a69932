package pooler

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/sqllex"
	"github.com/pgquic/pgquic/internal/wire"
	"github.com/pgquic/pgquic/pooler/lanes"
)

// The per-request path, top to bottom. The owner goroutine runs it for
// every client message once the session has started (startup.go):
//
//  1. Request in: loop reads a frame header and handle dispatches on its
//     type; Parse, Bind, Describe, Close and Query go through the
//     statement and state handlers (stmt.go, pin.go), which end in
//     forward or its kin.
//  2. Route and pin decision: attachLocked reuses the attached server
//     connection, or considers the request for a shared lane
//     (pipelineCheckLocked, pipeline.go) and borrows one (connect,
//     acquireConn in attach.go), bringing its parameters in line
//     (params.go). A session pinned by its state (pin.go) keeps its
//     connection, so no decision is made for it.
//  3. Forward: the message is staged raw with the reply it will produce
//     recorded (push), and written when the session's lock is released
//     (sendOut, serverwrite.go).
//  4. Reply scan: once nothing more from the client is buffered,
//     serveReplies reads the replies inline, or starts the relay
//     goroutine; relayOne forwards rows untouched (relayRow), a run of
//     the common replies already buffered in one pass (relayRun), and
//     matches every other message with the queue (interpretLocked, with
//     the per-message work in relay.go), then delivers it (deliverLocked).
//  5. Release: at a ReadyForQuery that leaves nothing pending,
//     atRestLocked decides, and finishRelease returns the connection to
//     its pool (or the next rider of its lane).

// loop reads client messages until the session ends.
func (s *session) loop(ctx context.Context) error {
	for {
		if s.cr.Buffered() == 0 {
			if err := s.flushAll(true); err != nil {
				return err
			}
			if s.serveReplies() {
				continue
			}
			if sent, err := s.followAtRest(ctx); err != nil {
				return err
			} else if sent || (s.followDue && s.awaitOwedRest(ctx)) {
				continue
			}
		}
		if s.early != nil { // a 0-RTT request answered, or to run now (zerortt.go)
			if err := s.earlyDone(ctx); err != nil {
				return err
			}
		}
		idle := s.cr.Buffered() == 0
		if idle {
			s.armIdle()
			s.waitClient()
		}
		typ, n, err := s.cr.Next()
		if idle {
			s.disarmIdle()
		}
		s.msgLen = wire.HeaderLen + n
		s.curTyp, s.catalogRead = typ, false
		if err != nil {
			if pe := s.fired.Load(); pe != nil {
				return pe // an idle timeout ended the session and told the client
			}
			if errors.Is(err, wire.ErrBadLength) || errors.Is(err, wire.ErrMessageTooLarge) {
				return s.fail(fatal(pgproto.CodeProtocolViolation, "invalid message length", err))
			}
			if s.isKilled() {
				return ErrShuttingDown
			}
			return s.clientGone(err)
		}
		if typ == 'X' {
			return nil
		}
		err = s.handle(ctx, typ)
		if err == nil {
			err = s.sendOut(ctx)
		} else {
			s.dropOut()
		}
		if err != nil {
			var pe *PGError
			var we *wire.WriteError
			switch {
			case errors.As(err, &pe) && pe.Severity == "FATAL":
				return s.fail(pe)
			case errors.As(err, &we):
				s.serverWriteFailed(err)
			default:
				return err
			}
		}
		switch typ {
		case 'S', 'Q', 'F':
			s.lastSync, s.segOpen = true, false
		case 'c', 'f':
			s.lastSync = true // a COPY's segment ends where it began it
		case 'P', 'B', 'D', 'E', 'C':
			s.lastSync, s.segOpen = false, true
		default:
			s.lastSync = false
		}
	}
}

// handle processes one client message whose header has just been read.
func (s *session) handle(ctx context.Context, typ byte) error {
	if s.peer.HandshakeConfirmed != nil { // 0-RTT data: run read-only or hold (zerortt.go)
		if handled, err := s.gateEarly(ctx, typ); handled || err != nil {
			return err
		}
	}
	if s.skipping && typ != 'S' {
		return s.cr.Skip()
	}
	switch typ {
	case 'Q':
		return s.handleQuery(ctx)
	case 'P':
		s.ctr.ClientParses.Add(1)
		return s.handleParse(ctx)
	case 'B':
		s.ctr.Binds.Add(1)
		return s.handleBind(ctx)
	case 'D':
		return s.handleDescribe(ctx)
	case 'C':
		return s.handleClose(ctx)
	case 'E':
		return s.forward(ctx, eExecute)
	case 'F':
		return s.handleFunctionCall(ctx)
	case 'S':
		return s.handleSync(ctx)
	case 'H', 'd', 'c', 'f':
		// Flush and COPY data only mean something to a server that is
		// already attached; PostgreSQL ignores stray COPY messages too.
		s.mu.Lock()
		a := s.currentLocked()
		if a == nil {
			s.mu.Unlock()
			return s.cr.Skip()
		}
		if typ == 'c' || typ == 'f' {
			a.copyOpen = false // the data ends: Syncs are answered again
		}
		err := s.writeServer(a, nil)
		s.mu.Unlock()
		return err
	case 'p':
		return fatal(pgproto.CodeProtocolViolation, "unexpected password message", nil)
	default:
		return fatal(pgproto.CodeProtocolViolation, fmt.Sprintf("invalid frontend message type %d", typ), nil)
	}
}

// handleSync answers Sync locally when no server is attached (nothing is
// pending), otherwise forwards it.
func (s *session) handleSync(ctx context.Context) error {
	s.skipping = false
	s.mu.Lock()
	a := s.currentLocked()
	if a == nil {
		s.mu.Unlock()
		if err := s.cr.Skip(); err != nil {
			return err
		}
		return s.writeClientLocal(readyForQuery('I'))
	}
	if a.copyOpen && a.copyIn {
		// The server is in COPY FROM STDIN, which ignores a Sync until
		// the client ends its data: nothing answers this one.
		err := s.writeServer(a, nil)
		s.mu.Unlock()
		return err
	}
	s.push(a, entry{kind: eSync, inCopy: a.copyOpen})
	var err error
	if len(s.restore) == 0 && !s.snapshot {
		err = s.syncProbingLocked(a)
	} else if err = s.cr.Skip(); err == nil {
		// The pooler's queries go right behind the Sync: the probe
		// (pin.go), then the parameters' (see followLocked).
		if err = s.writeServerProbing(a, syncMsg, sqlInfo{}); err == nil {
			err = s.followLocked(a)
		}
	}
	s.mu.Unlock()
	return err
}

// syncMsg is a Sync message.
var syncMsg = []byte{'S', 0, 0, 0, 4}

// forward sends the current message to the attached server (attaching one if
// needed) and records the reply it expects.
func (s *session) forward(ctx context.Context, k entryKind) error {
	s.mu.Lock()
	a, err := s.attachLocked(ctx)
	if err != nil {
		s.mu.Unlock()
		return s.raise(err, k == eQuery)
	}
	s.push(a, entry{kind: k})
	err = s.writeServer(a, nil)
	s.mu.Unlock()
	return err
}

// attachLocked returns the live attachment, acquiring a server connection
// first when none is attached. s.mu must be held. Acquiring waits on the
// pool and on the server (parameter sync), so attachLocked releases s.mu
// for that while and takes it again before it returns, on success and on
// error alike: the caller unlocks, as it locked.
//
// The handler of a message that may begin a request sets s.pipeTyp and
// s.pipeBody first, so the request can be considered for pipelining.
func (s *session) attachLocked(ctx context.Context) (*attachment, error) {
	typ, body, seq := s.pipeTyp, s.pipeBody, s.pipeSeq
	s.pipeTyp, s.pipeBody, s.pipeSeq = 0, nil, false
	if a := s.currentLocked(); a != nil {
		if s.p.cfg.Mode == ModeTransaction && !s.segOpen && !(a.copyOpen && a.copyIn) {
			// A new sync segment on a connection the session still
			// holds (a pipeline, a block, a pin): checked as a borrow is.
			// Behind a COPY too, unless the server has said it waits
			// for COPY data: a COPY TO, or one that fails to start,
			// leaves the server ready for the request behind it, which
			// must not read another client's sequence state. Once it
			// waits for data, a request message ends the session
			// (PostgreSQL: 08P01 "protocol synchronization was lost"),
			// so nothing of the request runs; before the pooler has
			// read that answer a DISCARD SEQUENCES ahead of the request
			// does no harm either way.
			if err := s.checkSequencesLocked(a, seq, body); err != nil {
				return nil, err
			}
		}
		return a, nil
	}
	if s.draining {
		return nil, fatal(pgproto.CodeAdminShutdown, "the pooler is shutting down", ErrShuttingDown)
	}
	b := s.pipelineCheckLocked(typ, body) // may fill s.pipeText for the handler
	s.mu.Unlock()
	conn, rd, sync, err := s.connect(ctx, b)
	s.mu.Lock()
	if err != nil {
		return nil, err
	}
	a := s.startAttachmentLocked(conn, rd)
	if rd != nil && rd.Joined() {
		s.p.m.pipelined.Inc()
	} else {
		// Nobody else's request is on the connection: no reply is owed.
		a.st.settle()
	}
	if s.p.cfg.Mode == ModeTransaction {
		if err := s.checkSequencesLocked(a, seq, body); err != nil {
			return nil, err
		}
	}
	if sync != "" {
		// The client's parameters, pipelined ahead of its message.
		s.push(a, entry{kind: eQuery, quiet: true, params: &paramQuery{sync: true}})
		a.st.syncPend++ // riders behind rely on them only once answered (riderSynced)
		return a, s.writeServer(a, appendQuery(nil, sync))
	}
	if err := s.reapplyParams(a); err != nil {
		return nil, err
	}
	return a, nil
}

// connect borrows a server connection and brings its parameters in line
// with the client's, or returns the query that does so for the caller to
// pipeline (see syncParams). It blocks on the pool and on the server, so
// s.mu must not be held.
//
// A request that may share a server connection (b.ok, see pipeline.go) is
// returned with its rider, which holds the connection's state lock until
// the request is written.
func (s *session) connect(ctx context.Context, b pipeBatch) (*backend.Conn, *lanes.Rider, string, error) {
	if err := s.flushClient(); err != nil { // a previous relay may still hold bytes
		return nil, nil, "", err
	}
	retried := false
	for {
		conn, rd, err := s.acquireConn(ctx, b)
		if err != nil {
			return nil, nil, "", err
		}
		if s.p.cfg.Mode == ModeTransaction {
			s.p.refreshCatalog(conn.Pool()) // in the background, never on conn
		}
		if rd != nil && rd.Joined() && !s.riderSynced(rd) {
			// The connection's parameters are not the client's after
			// all: step back and wait for a connection of its own.
			s.releaseConn(conn, rd, false)
			b.ok = false
			continue
		}
		sync, err := s.syncParams(ctx, conn)
		if err != nil {
			var pe *PGError
			if errors.As(err, &pe) && pe.Severity != "FATAL" && !retried {
				// The values were accepted at login, by this pool's
				// server, yet this process refuses one: its own past
				// decides (temp_buffers once it used temporary tables,
				// a placeholder prefix it reserved). Another process,
				// a new one if need be, is tried once, so what an
				// earlier client did there does not fail this one.
				retried = true
				s.releaseConn(conn, rd, true)
				continue
			}
			if errors.As(err, &pe) && pe.Severity != "FATAL" {
				s.releaseConn(conn, rd, false) // the SET failed cleanly; the server is idle again
			} else {
				s.releaseConn(conn, rd, true)
			}
			return nil, nil, "", err
		}
		if rd != nil && !rd.Joined() {
			rd.Lane().SetKey(s.desiredKey()) // in the server's spelling now
		}
		return conn, rd, sync, nil
	}
}

// serveReplies is called when the owner has flushed everything and is about
// to wait for the client. If the server still owes replies, it either reads
// them inline (the client's last message was a synchronisation point, so the
// server can finish without hearing from the client) and returns true, or
// starts the relay goroutine so replies flow while the owner waits.
func (s *session) serveReplies() bool {
	s.mu.Lock()
	a := s.att
	inline := s.readsInlineLocked(a)
	s.relayNotificationsLocked(a)
	if a == nil || a.released || a.relaying || a.pending() == 0 {
		s.mu.Unlock()
		return false
	}
	if !inline {
		s.startRelayLocked(a)
		s.mu.Unlock()
		return false
	}
	s.mu.Unlock()
	if s.relayInline(a) == relayWaiting {
		s.mu.Lock()
		if !a.released && a.pending() > 0 {
			s.lastSync = false // COPY IN: the server waits for the client's data
		}
		s.mu.Unlock()
	}
	return true
}

// readsInlineLocked reports whether serveReplies reads a's replies on the
// owner (relayInline): replies are due, no relay goroutine runs or is to
// run for a held LISTEN (relayNotificationsLocked), and the client's last
// message was a synchronisation point. flushOnRead relies on it. s.mu must
// be held.
func (s *session) readsInlineLocked(a *attachment) bool {
	return a != nil && !a.released && !a.relaying && a.pending() > 0 &&
		s.lastSync && s.pin.held&sqllex.HeldListen == 0
}

// relayResult says what handling one server message led to.
type relayResult uint8

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

// relayOne reads and handles one server message. It is called by exactly
// one goroutine at a time for a given attachment: the owner inline, or the
// relay goroutine. A message is handled in three steps, each its own
// function below: interpretLocked says what the message means for the
// queue of expected replies (and the state it confirms), deliverLocked
// writes what the client is to see, and atRestLocked decides, at a
// ReadyForQuery that leaves nothing pending, whether the connection goes
// back to the pool.
func (s *session) relayOne(a *attachment) relayResult {
	rd := a.rider
	if rd != nil && !rd.MyTurn() {
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
	// Fast paths: rows and notices change no state, unless they answer a
	// quiet query of the pooler's own (the slow path swallows them), and
	// the common replies of a request need only the queue's bookkeeping.
	// Notifications take the slow path (see notificationLocked).
	switch typ {
	case 'D', 'd', 'N':
		if a.quiet.Load() == 0 {
			return s.relayRow(a)
		}
	case '1', '2', '3', 'T', 'n', 'C', 'I', 's':
		if res, ok := s.relayRun(a, rd); ok {
			return res
		}
	}
	// Read the whole message before taking s.mu, for the same reason as
	// in relayRow.
	body, err := r.Body()
	if err != nil {
		s.serverLost(a, err)
		return relayLost
	}
	return s.relayMessage(a, rd, typ, body)
}

// relayRow forwards the DataRow, CopyData or NoticeResponse whose header
// relayOne has just read, without decoding or copying it (the bytes go
// from the server's read buffer to the client's write buffer), or skips it
// when the client is gone.
func (s *session) relayRow(a *attachment) relayResult {
	r := a.conn.R
	if a.clientGone.Load() {
		_ = r.Skip()
		return relayMore
	}
	// cwMu is held only while writing: PostgreSQL may flush half a
	// frame and then wait for more of a pipeline, which the owner can
	// send only if it is not waiting for cwMu.
	if err := r.ForwardLocked(&s.cwMu, s.cwFn); err != nil {
		var we *wire.WriteError
		if !errors.As(err, &we) {
			s.serverLost(a, err)
			return relayLost
		}
		s.relayWriteFailed(a, err)
	}
	return relayMore
}

// reply is what relayMessage makes of one server message: the message,
// the queue entry it answers, and what follows from it.
type reply struct {
	typ     byte
	body    []byte
	head    *entry // the entry at the head of the queue, or nil
	quiet   bool   // head is a quiet query of the pooler's own
	forward bool   // the client sees the message
	pop     bool   // the message ends head
	result  relayResult
}

// restAction is what atRestLocked decided for a connection at rest.
type restAction uint8

// relayMessage handles a server message that may change state, with its
// body read. On a shared connection the connection's statement cache and
// parameters are shared with the rider writing behind us, so its state
// lock is taken around s.mu.
func (s *session) relayMessage(a *attachment, rd *lanes.Rider, typ byte, body []byte) relayResult {
	s.lockState(rd)
	m := s.interpretLocked(a, rd, typ, body)
	s.deliverLocked(a, &m)
	rest := s.atRestLocked(a, rd, &m)
	s.unlockState(rd)
	return s.rested(a, rd, rest, m.result)
}

// lockState takes the locks a reply's handling needs: the shared
// connection's state lock (when rd is not nil), then s.mu.
func (s *session) lockState(rd *lanes.Rider) {
	if rd != nil {
		rd.Lane().LockState()
	}
	s.mu.Lock()
}

// unlockState releases what lockState took.
func (s *session) unlockState(rd *lanes.Rider) {
	s.mu.Unlock()
	if rd != nil {
		rd.Lane().UnlockState()
	}
}

// rested carries out, with the locks released, what atRestLocked decided,
// and returns what relayOne reports.
func (s *session) rested(a *attachment, rd *lanes.Rider, rest restAction, res relayResult) relayResult {
	switch rest {
	case restLeftOpen:
		return s.riderLeftOpen(a, rd)
	case restRelease:
		s.finishRelease(a)
		return relayReleased
	}
	return res
}

// relayRun handles in one pass the run of whole messages at the front of
// the server's read buffer that mean nothing to the pooler beyond the
// queue's bookkeeping (the common reply: ParseComplete, BindComplete,
// RowDescription, DataRow, CommandComplete), and the ReadyForQuery that
// ends the run: the locks are taken once, and the run's bytes go to the
// client as one copy. It reports false, having done nothing, when the
// first message is not of that kind or not wholly buffered; relayOne then
// handles it alone.
func (s *session) relayRun(a *attachment, rd *lanes.Rider) (relayResult, bool) {
	r := a.conn.R
	buf := r.Frames()
	s.lockState(rd)
	n, z := s.runLocked(a, buf)
	if n == 0 {
		s.unlockState(rd)
		return relayMore, false
	}
	res, rest := relayMore, restNone
	if z > 0 { // the ReadyForQuery that ends the run: its usual handling
		m := s.interpretLocked(a, rd, 'Z', buf[n+wire.HeaderLen:n+z])
		s.deliverLocked(a, &m)
		rest = s.atRestLocked(a, rd, &m)
		res = m.result
		n += z
	}
	s.unlockState(rd)
	r.Consume(n)
	return s.rested(a, rd, rest, res), true
}

// runLocked does the bookkeeping of relayRun's run and writes its
// messages to the client. It returns the bytes of buf it handled and,
// when a whole ReadyForQuery follows them, that message's length (else
// 0). A run takes no more than the client writer has room for, so no
// write under the locks waits for the client's socket. s.mu (and a shared
// connection's state lock) must be held.
func (s *session) runLocked(a *attachment, buf []byte) (n, z int) {
	gone := a.clientGone.Load()
	s.cwMu.Lock()
	room := s.roomLocked(gone)
	seg := 0 // start of the bytes not yet written
	for len(buf)-n >= wire.HeaderLen {
		typ, size := buf[n], 1+int(binary.BigEndian.Uint32(buf[n+1:]))
		if size < wire.HeaderLen || size > len(buf)-n {
			break // not wholly buffered (or malformed: the slow path reports it)
		}
		if typ == 'Z' {
			z = size
			break
		}
		if !gone && n+size-seg > room || !s.takeLocked(a, typ, buf[n+wire.HeaderLen:n+size]) {
			break
		}
		n += size
		if e := a.front(); e != nil && e.kind == eSynthetic {
			// The pooler's own reply comes next, after what the
			// server sent before it.
			s.writeRunLocked(gone, buf[seg:n])
			s.cwMu.Unlock()
			s.emitSynthetic(a)
			s.cwMu.Lock()
			seg, room = n, s.roomLocked(gone)
		}
	}
	s.writeRunLocked(gone, buf[seg:n])
	s.cwMu.Unlock()
	if n == 0 {
		z = 0 // nothing was taken: relayOne handles the ReadyForQuery alone
	}
	return n, z
}

// roomLocked returns how many bytes the client writer takes without a
// flush; a client that is gone is written nothing, so it takes no writer
// from the pool. s.cwMu must be held.
func (s *session) roomLocked(gone bool) int {
	if gone {
		return 0
	}
	return s.clientWriter().Available()
}

// writeRunLocked copies b, whole messages, to the client writer, where
// runLocked made room for it. s.cwMu must be held.
func (s *session) writeRunLocked(gone bool, b []byte) {
	if gone || len(b) == 0 {
		return
	}
	_, _ = s.clientWriter().Write(b) // fits: no flush, so no error
}

// takeLocked does for one message of a run what interpretLocked would, and
// reports false, doing nothing, for a message the run must leave to it: one
// that answers the pooler's own or a held request, meets a held
// ParameterDescription, or confirms state beyond a prepared statement (a
// CommandComplete of DEALLOCATE, DISCARD or DROP). s.mu must be held.
func (s *session) takeLocked(a *attachment, typ byte, body []byte) bool {
	head := a.front()
	if head == nil || head.quiet || head.early || a.heldT != nil {
		return false
	}
	pop := false
	switch typ {
	case '1':
		if head.kind != eParse || head.injected {
			return false
		}
		a.st.stmts.Confirm(head.stmt, head.unnamed, s.id)
		pop = true
	case '2':
		if head.kind != eBind || head.injected {
			return false
		}
		pop = true
	case '3':
		if head.kind != eClose || head.injected {
			return false
		}
		pop = true
	case 'T', 'n':
		if head.params != nil {
			return false
		}
		pop = head.kind == eDescribe
	case 'C', 'I', 's':
		if typ == 'C' && len(body) > 0 && body[0] == 'D' {
			return false
		}
		pop = head.kind == eExecute
	case 'D':
	default:
		return false
	}
	if pop {
		a.pop()
	}
	return true
}

// interpretLocked matches a server message with the entry at the head of
// the queue: whether it ends that entry, whether the client sees it, and
// what it confirms (a prepared statement, a parameter, the transaction
// status). s.mu must be held.
func (s *session) interpretLocked(a *attachment, rd *lanes.Rider, typ byte, body []byte) reply {
	head := a.front()
	quiet := head != nil && head.quiet
	m := reply{typ: typ, body: body, head: head, quiet: quiet, forward: !quiet, result: relayMore}
	switch typ {
	case '1': // ParseComplete
		if head != nil && head.kind == eParse {
			m.forward = m.forward && !head.injected
			m.pop = true
			a.st.stmts.Confirm(head.stmt, head.unnamed, s.id)
		}
	case '2': // BindComplete
		if head != nil && head.kind == eBind {
			m.forward = m.forward && !head.injected
			m.pop = true
		}
	case '3': // CloseComplete
		if head != nil && head.kind == eClose {
			m.forward = m.forward && !head.injected
			m.pop = true
		}
	case 'T': // RowDescription ends a Describe
		m.pop = head != nil && head.kind == eDescribe
		if head != nil && head.params != nil {
			head.params.results++
		}
	case 'n': // NoData
		m.pop = head != nil && head.kind == eDescribe
	case 'C', 'I', 's': // CommandComplete, EmptyQueryResponse, PortalSuspended
		m.pop = head != nil && head.kind == eExecute
		if typ == 'C' && len(body) > 0 && body[0] == 'D' {
			s.serverDropped(a, body, quiet)
		}
	case 'G', 'W': // CopyInResponse, CopyBothResponse: the server waits for data
		m.result = relayWaiting
		if typ == 'G' && head != nil {
			if a.followOwed && !a.copyOpen {
				// Another COPY of the same Query waits for data (the
				// first one's CopyDone cleared copyOpen): the client's
				// data is due again, so an owner waiting for the
				// ReadyForQuery (awaitOwedRest) must read its client.
				a.copyOpen = true
				if a.owedRest != nil {
					close(a.owedRest)
					a.owedRest = make(chan struct{})
				}
			}
			// The Syncs sent since the COPY and before its data ended
			// get no answer (the client may have ended the data already).
			a.copyIn = a.copyOpen
			a.dropCopySyncs()
		}
	case 't': // ParameterDescription
		if m.forward && head != nil && head.replayHead && head.kind == eDescribe {
			// Held back until the Describe succeeds: if its statement
			// turns out stale, the retry sends it again.
			a.heldT = bytes.Clone(body)
			m.forward = false
		}
	case 'S':
		s.parameterStatusLocked(a, &m)
	case 'D': // DataRow: only a quiet query's comes here
		switch {
		case head != nil && head.probe:
			s.probeRowLocked(body)
		case head != nil && head.params != nil:
			head.params.row(body)
		}
	case 'A':
		s.notificationLocked(a, &m)
	case 'E':
		s.serverErrorLocked(a, rd, &m)
	case 'Z':
		s.readyLocked(a, &m)
	}
	return m
}

// deliverLocked writes the message to the client when it is to see it
// (behind a ParameterDescription held back for a retry), pops the entry
// it ended, and writes the pooler's own replies that reached the head of
// the queue. s.mu must be held.
func (s *session) deliverLocked(a *attachment, m *reply) {
	if m.head != nil && m.head.early {
		s.holdEarlyLocked(a, m)
	}
	if m.forward && !a.clientGone.Load() {
		s.cwMu.Lock()
		if a.heldT != nil {
			_ = writeFrame(s, 't', a.heldT)
			a.heldT = nil
		}
		err := writeFrame(s, m.typ, m.body)
		s.cwMu.Unlock()
		if err != nil {
			s.relayWriteFailed(a, err)
		}
	}
	if m.pop {
		a.pop()
		if m.typ == 'Z' {
			s.queryAnsweredLocked(a)
		}
	}
	s.emitSynthetic(a)
}

// atRestLocked decides what becomes of a connection at rest (a
// ReadyForQuery with nothing pending): a shared connection left inside a
// transaction is handled by riderLeftOpen, a releasable one is marked
// released for finishRelease, and any other waits for the client. s.mu
// must be held.
func (s *session) atRestLocked(a *attachment, rd *lanes.Rider, m *reply) restAction {
	if m.typ != 'Z' || a.pending() != 0 {
		return restNone
	}
	if rd != nil && (a.status != 'I' || (s.pinned && !a.closing)) {
		// A request on a lane that left a transaction open, or pinned
		// its client (an identity change the server reported, which the
		// lexer could not see): the connection is the session's now.
		return restLeftOpen
	}
	if s.releasable(a) {
		a.released = true
		return restRelease
	}
	if a.followOwed && a.owedRest != nil {
		close(a.owedRest) // the owner may send the owed query now (awaitOwedRest)
		a.owedRest = nil
	}
	m.result = relayWaiting
	return restNone
}

// releasable reports whether a connection at rest (ReadyForQuery seen,
// nothing pending) goes back to the pool. s.mu must be held.
func (s *session) releasable(a *attachment) bool {
	if a.status != 'I' {
		return false // inside a transaction, or a failed one awaiting ROLLBACK
	}
	return a.closing || (s.p.cfg.Mode == ModeTransaction && !s.pinned && !a.followOwed)
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
	s.endDDLLocked(a)
	destroy := a.destroy
	stale := !destroy && s.overlapsDDLLocked(a)
	if a.probeOwed && s.pin.probe && !s.pinned && !destroy {
		// The probe after an opaque statement never ran (a COPY was open
		// when it was due): what the server holds is unknown, so the
		// connection goes rather than to another client.
		destroy = true
		a.destroy = true
		s.log.Info("closing a server connection whose session state is unknown after COPY", "server_pid", a.conn.PID)
	}
	draining := s.draining
	resetID := a.identity
	cancels := a.cancels
	s.mu.Unlock()
	// Cancels first: one still in flight could hit the identity reset.
	if cancels != nil && !destroy && !s.cancelsSettled(cancels) {
		destroy = true
	}
	if stale && !destroy && !s.p.sameCodeAfter(a.conn.Pool(), a.catalogAt) {
		// A request read by the catalog from before the DDL may have run
		// code the DDL added: what the server holds is unknown. On a lane
		// the requests behind it fail too (Leave with destroy): they ran
		// after it, on whatever the added code left in the session (a
		// trigger's set_config), so their answers must not reach their
		// clients (TestHostileDDLLaneRiderBehindStaleRequest). Until
		// sameCodeAfter has answered, nobody reads them.
		destroy = true
		s.mu.Lock()
		a.destroy = true
		s.mu.Unlock()
		s.log.Info("closing a server connection whose requests ran while DDL changed the catalog, which may have added code behind names", "server_pid", a.conn.PID)
	}
	if !destroy && resetID {
		if err := resetIdentity(a.conn); err != nil {
			s.log.Warn("resetting the identity of a server connection failed; closing it", "err", err)
			destroy = true
		}
	}
	// The ReadyForQuery's clock read, a moment ago, stands for the release
	// time, unless time passed since (a cancel or an identity reset).
	now := a.readyAt
	if now.IsZero() || cancels != nil || resetID {
		now = time.Now()
	}
	switch {
	case a.rider != nil:
		a.rider.LeaveAt(now, destroy, s.p.laneLimits()) // the next client's replies, or back to the pool
	case destroy:
		a.conn.Destroy()
	default:
		a.conn.ReleaseAt(now)
	}
	s.p.m.assignments.Inc()
	if draining {
		s.closeClient()
	}
}
