package pooler

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/wire"
)

// Buffer sizes. The client reader stays small because an idle session keeps
// it; the client writer is only busy while a server connection is attached.
const (
	clientReadBuf  = 4 << 10
	clientWriteBuf = 8 << 10
)

// session is one client session. Its owner goroutine (the one in Serve) reads
// the client and makes every decision; while a server connection is attached
// a relay goroutine forwards the server's replies and decides, at
// ReadyForQuery, whether the connection goes back to the pool.
//
// Locks, always taken in this order: mu (attachment state and the ordering
// of everything written to the client while attached), then cwMu (the client
// writer). wmu is held by the owner from its first unflushed write to a
// server connection until the flush, so the relay cannot hand that
// connection back to the pool with half a message in its buffer.
type session struct {
	p    *Pooler
	log  *slog.Logger
	peer Peer

	pid    uint32
	secret [4]byte
	id     uint64 // unique for the pooler's lifetime, unlike pid

	// Owner-only state.
	rwc      io.ReadWriteCloser // written with mu and cwMu held (setStream); read under either, or by the owner
	cr       *wire.Reader
	secure   bool
	counted  bool
	loggedIn bool
	user     string
	database string
	pool     *backend.Pool
	desired  map[string]string // parameter values the client believes are in effect
	paramKey string            // desired, serialised; "" when it must be recomputed
	reapply  []byte            // Query frame setting the unreported desired parameters (see reapplyParams)
	unnamed  *stmt             // the client's unnamed statement, for replay
	skipping bool              // dropping messages until Sync after an error the pooler raised
	lastSync bool              // the last client message was Sync, Query, FunctionCall, CopyDone or CopyFail
	wlocked  bool              // owner holds wmu
	wconn    *backend.Conn     // connection whose writer the owner must flush
	scratch  []byte
	authMax  int         // bound on the client's next authentication message, set by Send
	out      []byte      // frames for the server staged while s.mu was held (see sendOut)
	outAtt   *attachment // where they go
	outFwd   bool        // then forward the current client message raw
	msgLen   int         // length of the current client message, header included

	cwMu sync.Mutex
	cw   *bufio.Writer        // nil while idle (see flushClient)
	cwFn func() *bufio.Writer // s.clientWriter, bound once so forwarding a row allocates nothing
	busy atomic.Bool          // a server connection is attached: keep cw

	stuck atomic.Uint32 // watcher epoch when the owner began waiting on the server; 0 when not (watch.go)

	wmu sync.Mutex

	mu         sync.Mutex
	waitCancel context.CancelCauseFunc // set while waiting for a server connection
	stmts      map[string]*stmt        // the client's named prepared statements (transaction mode)
	stmtBytes  int                     // their size, for ClientStatementBytes
	att        *attachment
	draining   bool
	pinned     bool // transaction mode: an identity change keeps the server connection until the session ends
	killed     bool
	closing    bool // rwc closed by us

	abandoned *attachment // the watcher cancelled its request: the client is gone (watch.go)
	abandonAt time.Time   // when
}

func newSession(p *Pooler, rwc io.ReadWriteCloser, peer Peer) *session {
	if peer.Transport == "" {
		peer.Transport = "unknown"
	}
	s := &session{
		p:    p,
		id:   p.nextID.Add(1),
		peer: peer,
		rwc:  rwc,
		// Until the client has authenticated it may send nothing larger
		// than an authentication message; login raises the limit to
		// MaxMessageLen.
		cr: wire.NewReader(rwc, clientReadBuf, min(maxPasswordPacketLen-4, p.cfg.MaxMessageLen)),
	}
	s.cwFn = s.clientWriter
	s.log = p.log.With("transport", peer.Transport)
	if peer.Addr != nil {
		s.log = s.log.With("client", peer.Addr.String())
	}
	return s
}

// setStream swaps the client stream after a TLS upgrade. The startup timer
// may close the stream from its own goroutine at any moment (closeClient), so
// rwc changes only under s.mu; if the session was closed meanwhile, the new
// stream is closed too.
func (s *session) setStream(rwc io.ReadWriteCloser) {
	s.mu.Lock()
	s.cwMu.Lock()
	s.rwc = rwc
	if s.cw != nil {
		s.cw.Reset(rwc)
	}
	s.cwMu.Unlock()
	closed := s.closing
	s.mu.Unlock()
	s.cr.Reset(rwc)
	if closed {
		_ = rwc.Close()
	}
}

// run executes the session: startup with its timeout, then the message loop.
func (s *session) run(ctx context.Context) error {
	timedOut := atomic.Bool{}
	t := time.AfterFunc(s.p.cfg.StartupTimeout, func() {
		timedOut.Store(true)
		s.closeClient()
	})
	err := s.startup(ctx)
	stopped := t.Stop()
	if errors.Is(err, errCancelHandled) {
		return nil
	}
	if !stopped && timedOut.Load() {
		return fmt.Errorf("startup timeout after %s", s.p.cfg.StartupTimeout)
	}
	if err != nil {
		return err
	}
	return s.loop(ctx)
}

// loop reads client messages until the session ends.
func (s *session) loop(ctx context.Context) error {
	for {
		if s.cr.Buffered() == 0 {
			if err := s.flushAll(); err != nil {
				return err
			}
			if s.serveReplies() {
				continue
			}
		}
		typ, n, err := s.cr.Next()
		s.msgLen = wire.HeaderLen + n
		if err != nil {
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
			err = s.sendOut()
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
		case 'S', 'Q', 'F', 'c', 'f':
			s.lastSync = true
		default:
			s.lastSync = false
		}
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
	if a == nil || a.released || a.relaying || a.pending() == 0 {
		s.mu.Unlock()
		return false
	}
	if !s.lastSync {
		s.startRelay(a)
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

// clientGone classifies a failed client read: EOF is a client leaving
// without Terminate, anything else is reported.
func (s *session) clientGone(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil
	}
	return fmt.Errorf("reading from client: %w", err)
}

// handle processes one client message whose header has just been read.
func (s *session) handle(ctx context.Context, typ byte) error {
	if s.skipping && typ != 'S' {
		return s.cr.Skip()
	}
	switch typ {
	case 'Q':
		return s.handleQuery(ctx)
	case 'P':
		return s.handleParse(ctx)
	case 'B':
		return s.handleBind(ctx)
	case 'D':
		return s.handleDescribe(ctx)
	case 'C':
		return s.handleClose(ctx)
	case 'E':
		return s.forward(ctx, eExecute)
	case 'F':
		return s.forward(ctx, eFunc)
	case 'S':
		return s.handleSync(ctx)
	case 'H', 'd', 'c', 'f':
		// Flush and COPY data only mean something to a server that is
		// already attached; PostgreSQL ignores stray COPY messages too.
		a := s.current()
		if a == nil {
			return s.cr.Skip()
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
	a := s.current()
	if a == nil {
		if err := s.cr.Skip(); err != nil {
			return err
		}
		return s.writeClientLocal(readyForQuery('I'))
	}
	s.push(a, entry{kind: eSync})
	err := s.writeServer(a, nil)
	s.mu.Unlock()
	return err
}

// forward sends the current message to the attached server (attaching one if
// needed) and records the reply it expects.
func (s *session) forward(ctx context.Context, k entryKind) error {
	a, err := s.attach(ctx)
	if err != nil {
		return s.raise(err, k == eQuery)
	}
	s.push(a, entry{kind: k})
	err = s.writeServer(a, nil)
	s.mu.Unlock()
	return err
}

// current returns the live attachment with s.mu held, or nil (mu released).
func (s *session) current() *attachment {
	s.mu.Lock()
	if a := s.att; a != nil && !a.released {
		return a
	}
	s.mu.Unlock()
	return nil
}

// attach returns the live attachment with s.mu held, acquiring a server
// connection first when none is attached.
func (s *session) attach(ctx context.Context) (*attachment, error) {
	if a := s.current(); a != nil {
		return a, nil
	}
	if s.isDraining() {
		return nil, fatal(pgproto.CodeAdminShutdown, "the pooler is shutting down", ErrShuttingDown)
	}
	if err := s.flushClient(); err != nil { // a previous relay may still hold bytes
		return nil, err
	}
	conn, err := s.acquireConn(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.syncParams(ctx, conn); err != nil {
		var pe *PGError
		if errors.As(err, &pe) && pe.Severity != "FATAL" {
			conn.Release() // the SET failed cleanly; the server is idle again
		} else {
			conn.Destroy()
		}
		return nil, err
	}
	s.mu.Lock()
	a := s.startAttachment(conn)
	if err := s.reapplyParams(a); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	return a, nil
}

// startRelay starts the relay goroutine for a. s.mu must be held.
func (s *session) startRelay(a *attachment) {
	a.relaying = true
	a.done = make(chan struct{})
	go s.relay(a)
}

// acquireConn borrows a server connection, bounded by AcquireTimeout.
func (s *session) acquireConn(ctx context.Context) (*backend.Conn, error) {
	if conn, err := s.pool.TryAcquire(ctx); err == nil {
		s.p.m.waitSeconds.Observe(0)
		return conn, nil
	}
	start := time.Now()
	tctx, cancel := context.WithTimeout(ctx, s.p.cfg.AcquireTimeout)
	defer cancel()
	actx, cancelWait := context.WithCancelCause(tctx)
	s.mu.Lock()
	s.waitCancel = cancelWait
	s.mu.Unlock()
	if s.peer.Probe != nil {
		s.markStuck()
	}
	conn, err := s.pool.Acquire(actx)
	s.stuck.Store(0)
	s.mu.Lock()
	s.waitCancel = nil
	s.mu.Unlock()
	cancelWait(nil)
	s.p.m.waitSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		if errors.Is(context.Cause(actx), errCanceledByClient) {
			return nil, pgerr(pgproto.CodeQueryCanceled, "canceling statement due to user request", err)
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			st := s.pool.Stat()
			return nil, pgerr(pgproto.CodeTooManyConnections,
				fmt.Sprintf("no server connection became free within %s (pool of %d for database %q, user %q is busy)",
					s.p.cfg.AcquireTimeout, st.Total, s.database, s.user), err)
		}
		if ctx.Err() != nil {
			return nil, fatal(pgproto.CodeAdminShutdown, "the pooler is shutting down", err)
		}
		var se *pgconn.PgError
		if errors.As(err, &se) {
			// The server refused the login (unknown role, database, too
			// many connections...): pass its own error on.
			return nil, &PGError{Severity: "ERROR", Code: se.Code, Message: se.Message, Detail: se.Detail, Hint: se.Hint, Err: err}
		}
		if errors.Is(err, backend.ErrTooManyPools) {
			// The session's pool was retired while it idled and no new
			// one may be opened now.
			return nil, pgerr(pgproto.CodeTooManyConnections, fmt.Sprintf("sorry, too many pools already: no pool for database %q user %q (max_pools)", s.database, s.user), err)
		}
		return nil, pgerr(pgproto.CodeConnectionFailure, "could not connect to the server", err)
	}
	return conn, nil
}

// startAttachment makes conn the session's server connection and starts its
// relay. s.mu must be held.
func (s *session) startAttachment(conn *backend.Conn) *attachment {
	st, _ := conn.State.(*serverState)
	if st == nil {
		st = newServerState()
		conn.State = st
	}
	a := s.att
	if a != nil && a.released && !a.relaying {
		// Reuse the previous transaction's attachment (and its queue's
		// memory): only the owner ever referenced it.
		*a = attachment{queue: a.queue[:0]}
	} else {
		a = &attachment{}
	}
	a.conn, a.st, a.status = conn, st, 'I'
	s.att = a
	if s.p.cfg.Mode == ModeSession {
		// The server may speak at any time (NOTIFY, a FATAL on shutdown):
		// in session mode a relay goroutine always listens.
		s.startRelay(a)
	}
	s.busy.Store(true)
	return a
}

// raise reports an error the pooler generated while handling a client
// message. In the extended protocol the rest of the pipeline is dropped
// until Sync, as PostgreSQL does after an error; for a simple Query the
// error is followed by ReadyForQuery.
func (s *session) raise(err error, simple bool) error {
	var pe *PGError
	if !errors.As(err, &pe) {
		return err
	}
	if pe.Severity == "FATAL" {
		return pe
	}
	s.p.m.errors.WithLabelValues(pe.Code).Inc()
	if err := s.cr.Skip(); err != nil {
		return err
	}
	if !simple {
		s.skipping = true
	}
	if a := s.current(); a != nil {
		// A server is attached, maybe inside a transaction block: let the
		// server raise the error, so the transaction is aborted and the
		// rest of the pipeline skipped exactly as PostgreSQL would.
		defer s.mu.Unlock()
		return s.serverRaise(a, pe)
	}
	out := pe.encode(nil)
	if simple {
		out = append(out, readyForQuery('I')...)
	}
	return s.writeClientLocal(out)
}

// serverRaise makes the attached server raise pe, through an anonymous DO
// block whose Parse and Bind replies are swallowed; the client sees the
// ErrorResponse of the Execute. s.mu must be held.
func (s *session) serverRaise(a *attachment, pe *PGError) error {
	msg := strings.ReplaceAll(pe.Message, "$pgquic$", "")
	sql := "DO $pgquic$BEGIN RAISE EXCEPTION USING ERRCODE = " + quoteLiteral(pe.Code) +
		", MESSAGE = " + quoteLiteral(msg) + "; END$pgquic$"
	f := wire.AppendHeader(nil, 'P', 1+len(sql)+1+2)
	f = append(f, 0)
	f = append(f, sql...)
	f = append(f, 0, 0, 0)
	f = wire.AppendHeader(f, 'B', 1+1+2+2+2)
	f = append(f, 0, 0, 0, 0, 0, 0, 0, 0)
	f = wire.AppendHeader(f, 'E', 1+4)
	f = append(f, 0, 0, 0, 0, 0)
	s.push(a, entry{kind: eParse, injected: true, unnamed: true})
	s.push(a, entry{kind: eBind, injected: true})
	s.push(a, entry{kind: eExecute})
	a.st.unnamedOK = false
	return s.writeServer(a, f)
}

// respond writes a reply the pooler produced itself, in order with whatever
// the server still owes the client: directly when nothing is pending,
// otherwise queued behind the pending replies. With rfq a ReadyForQuery
// carrying the current transaction status follows.
func (s *session) respond(msg []byte, rfq bool) error {
	if a := s.current(); a != nil {
		if a.pending() > 0 || a.skipping {
			s.push(a, entry{kind: eSynthetic, synthetic: msg, rfq: rfq})
			s.mu.Unlock()
			return nil
		}
		if rfq {
			msg = append(msg, readyForQuery(a.status)...)
		}
		err := s.writeClient(msg)
		s.mu.Unlock()
		return err
	}
	if rfq {
		msg = append(msg, readyForQuery('I')...)
	}
	return s.writeClientLocal(msg)
}

// writeServer stages frame (or, when frame is nil, the current client
// message itself) for a's server. Nothing is written while s.mu is held:
// sendOut does the writing once the lock is released.
func (s *session) writeServer(a *attachment, frame []byte) error {
	s.outAtt = a
	if frame == nil {
		s.outFwd = true
		return nil
	}
	s.out = append(s.out, frame...)
	return nil
}

// sendOut writes what handling the last client message staged. It runs
// without s.mu because a write to the server may block until the server
// reads, and a server busy sending replies reads only once they are drained
// by the relay, which needs s.mu: holding it here could deadlock a large
// pipeline. For the same reason a write that reaches the socket while
// replies are due first makes sure a relay goroutine is reading them.
func (s *session) sendOut() error {
	s.trimScratch()
	a := s.outAtt
	if a == nil {
		return nil
	}
	s.outAtt = nil
	conn := a.conn
	n := len(s.out)
	if s.outFwd {
		n += s.msgLen
	}
	if n > conn.W.Available() {
		s.mu.Lock()
		if !a.released && !a.relaying && a.pending() > 0 {
			s.startRelay(a)
		}
		s.mu.Unlock()
	}
	if s.wlocked && s.wconn != conn {
		if err := s.wconn.W.Flush(); err != nil {
			s.serverWriteFailed(err)
		}
		s.wlocked, s.wconn = false, nil
		s.wmu.Unlock()
	}
	if !s.wlocked {
		s.wmu.Lock()
		s.wlocked, s.wconn = true, conn
	}
	var err error
	if len(s.out) > 0 {
		if _, werr := conn.W.Write(s.out); werr != nil {
			err = &wire.WriteError{Err: werr}
		}
		if cap(s.out) > maxKeptBuf {
			s.out = nil // do not pin a large buffer after a big message
		} else {
			s.out = s.out[:0]
		}
	}
	fwd := s.outFwd
	s.outFwd = false
	if err == nil && fwd {
		err = s.cr.Forward(conn.W)
	}
	return err
}

// dropOut forgets staged output after a failed message.
func (s *session) dropOut() {
	s.outAtt, s.outFwd = nil, false
	s.out = s.out[:0]
	s.trimScratch()
}

// maxKeptBuf bounds the staging buffers (out, scratch) a session keeps
// between messages: one grown for a single large message is dropped rather
// than held for the rest of the session.
const maxKeptBuf = 64 << 10

// trimScratch drops the scratch buffer if a large message grew it. Frames
// built in it have been copied to s.out by then (writeServer).
func (s *session) trimScratch() {
	if cap(s.scratch) > maxKeptBuf {
		s.scratch = nil
	}
}

// serverWriteFailed handles a failed write to the attached server: the
// connection is closed, so the reply reader fails too and tells the client
// (FATAL 08006) instead of waiting for replies that will never come.
func (s *session) serverWriteFailed(err error) {
	s.log.Warn("writing to server failed", "err", err)
	s.mu.Lock()
	if a := s.att; a != nil && !a.released {
		a.destroy = true
		_ = a.conn.NetConn().Close()
	}
	s.mu.Unlock()
}

// flushAll pushes buffered bytes to the server and to the client.
func (s *session) flushAll() error {
	if s.wlocked {
		err := s.wconn.W.Flush()
		s.wlocked = false
		s.wconn = nil
		s.wmu.Unlock()
		if err != nil {
			s.serverWriteFailed(err)
		}
	}
	return s.flushClient()
}

// flushClient flushes the client writer. An idle session's writer goes back
// to a shared pool, so thousands of idle sessions hold no write buffers.
func (s *session) flushClient() error {
	s.cwMu.Lock()
	defer s.cwMu.Unlock()
	if s.cw == nil {
		return nil
	}
	if err := s.cw.Flush(); err != nil {
		return err
	}
	if !s.busy.Load() {
		s.cw.Reset(nil)
		writerPool.Put(s.cw)
		s.cw = nil
	}
	return nil
}

// writerPool holds client write buffers between transactions.
var writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, clientWriteBuf) }}

// clientWriter returns the client writer, taking one from the pool when the
// session has none. cwMu must be held.
func (s *session) clientWriter() *bufio.Writer {
	if s.cw == nil {
		s.cw = writerPool.Get().(*bufio.Writer)
		s.cw.Reset(s.rwc)
	}
	return s.cw
}

// writeClient writes to the client buffer; callers hold s.mu when attached.
func (s *session) writeClient(b []byte) error {
	s.cwMu.Lock()
	defer s.cwMu.Unlock()
	_, err := s.clientWriter().Write(b)
	return err
}

// writeClientLocal writes a reply while no server is attached.
func (s *session) writeClientLocal(b []byte) error {
	return s.writeClient(b)
}

// writeRaw writes and flushes bytes during startup.
func (s *session) writeRaw(b []byte) error {
	if err := s.writeClient(b); err != nil {
		return err
	}
	return s.flushClient()
}

// send encodes, writes and flushes messages; used during startup and
// authentication, when no relay runs.
func (s *session) send(msgs ...pgproto3.BackendMessage) error {
	buf := s.scratch[:0]
	for _, m := range msgs {
		var err error
		if buf, err = m.Encode(buf); err != nil {
			return fmt.Errorf("encoding %T: %w", m, err)
		}
	}
	s.scratch = buf[:0]
	err := s.writeRaw(buf)
	s.trimScratch()
	return err
}

// Send implements AuthExchange. It notes which kind of message the request
// asks for, so ReceivePassword applies PostgreSQL's bound for that kind.
func (s *session) Send(msgs ...pgproto3.BackendMessage) error {
	for _, m := range msgs {
		switch m.(type) {
		case *pgproto3.AuthenticationSASL, *pgproto3.AuthenticationSASLContinue:
			s.authMax = maxSASLMessageLen
		case *pgproto3.AuthenticationCleartextPassword, *pgproto3.AuthenticationMD5Password:
			s.authMax = maxPasswordPacketLen
		}
	}
	return s.send(msgs...)
}

// ReceivePassword implements AuthExchange. The message is bounded as
// PostgreSQL bounds it (see maxSASLMessageLen): a longer one ends the
// session with 08P01 before any of its body is read.
func (s *session) ReceivePassword(ctx context.Context) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit := s.authMax
	if limit == 0 {
		limit = maxPasswordPacketLen
	}
	old := s.cr.SetMaxLen(min(limit-4, s.p.cfg.MaxMessageLen)) // PostgreSQL's limits count the length word
	typ, _, err := s.cr.Next()
	s.cr.SetMaxLen(old)
	if err != nil {
		if errors.Is(err, wire.ErrBadLength) || errors.Is(err, wire.ErrMessageTooLarge) {
			return nil, fatal(pgproto.CodeProtocolViolation, "invalid message length", err)
		}
		return nil, err
	}
	if typ != 'p' {
		_ = s.cr.Skip()
		return nil, fatal(pgproto.CodeProtocolViolation, fmt.Sprintf("expected password response, got message type %d", typ), nil)
	}
	return s.cr.Body()
}

// fail tells the client about a fatal error, best effort, and returns it.
func (s *session) fail(pe *PGError) error {
	s.p.m.errors.WithLabelValues(pe.Code).Inc()
	_ = s.writeRaw(pe.encode(nil))
	return pe
}

func readyForQuery(status byte) []byte {
	return []byte{'Z', 0, 0, 0, 5, status}
}

// errCanceledByClient is the cause of a wait cancelled by a CancelRequest.
var errCanceledByClient = errors.New("canceled by client request")

// cancelWait aborts a wait for a server connection (a CancelRequest that
// arrived while the request was still queued).
func (s *session) cancelWait() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waitCancel != nil {
		s.waitCancel(errCanceledByClient)
	}
}

// cancelOnServer asks the server to cancel what conn runs; used when a
// connection is dropped mid-request, since closing it does not stop the
// query on the server.
func cancelOnServer(conn *backend.Conn) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Pool().Cancel(ctx, conn.PID, conn.SecretKey)
	}()
}

func (s *session) isDraining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

func (s *session) isKilled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killed
}

// drain asks the session to end at its next safe point: now if idle,
// after the current transaction otherwise.
func (s *session) drain() {
	s.mu.Lock()
	s.draining = true
	idle := (s.att == nil || s.att.released) && !s.closing
	s.mu.Unlock()
	if idle {
		// What PostgreSQL says to idle sessions at a fast shutdown.
		pe := fatal(pgproto.CodeAdminShutdown, "terminating connection because the pooler is shutting down", ErrShuttingDown)
		_ = s.writeRaw(pe.encode(nil))
		s.closeClient()
	}
}

// kill ends the session at once. A server connection in use is closed, so it
// is destroyed rather than returned to the pool in an unknown state.
func (s *session) kill() {
	s.mu.Lock()
	s.killed = true
	a := s.att
	if a != nil && !a.released {
		if a.pending() > 0 {
			cancelOnServer(a.conn)
		}
		_ = a.conn.NetConn().Close()
	}
	s.mu.Unlock()
	s.closeClient()
}

// closeClient closes the client stream once. It may run on any goroutine
// (the startup timer, a shutdown), hence rwc is read under s.mu.
func (s *session) closeClient() {
	s.mu.Lock()
	already := s.closing
	s.closing = true
	rwc := s.rwc
	s.mu.Unlock()
	if !already {
		_ = rwc.Close()
	}
}

// close ends the session after the owner loop returned: any attached server
// connection is cleaned up (rolled back, or destroyed when that is not
// possible), the relay is waited for and the client stream is closed.
func (s *session) close() {
	// From here on the session cancels nothing; in session mode its server's
	// process ID may be handed to the next client of that server at once.
	s.p.dropKey(s)
	if s.wlocked {
		_ = s.wconn.W.Flush()
		s.wlocked = false
		s.wconn = nil
		s.wmu.Unlock()
	}
	s.mu.Lock()
	a := s.att
	if a != nil && a.released && !a.relaying {
		a = nil // returned inline; no goroutine to wait for
	}
	if a != nil && !a.released {
		a.clientGone.Store(true)
		a.closing = true
		if !a.relaying {
			s.startRelay(a)
		}
		sessionLike := s.p.cfg.Mode == ModeSession || s.pinned
		if s.pinned {
			a.identity = true
		}
		switch {
		case a.pending() > 0 || s.killed || (sessionLike && a.status != 'I'):
			// A request is still running: cancel it and drop the connection.
			// A session-mode client that left inside a transaction loses
			// its server connection too (as with PgBouncer): whatever it
			// built up is not worth untangling on an abnormal exit.
			conn := a.conn
			if a.pending() > 0 {
				cancelOnServer(conn)
			}
			a.destroy = true
			_ = conn.NetConn().Close()
		default:
			// Idle, in a transaction, or in session mode: roll back (and
			// reset) quietly; the relay returns the connection once the
			// server says it is idle.
			a.st.unnamedOK = false // simple queries destroy the unnamed statement
			var q []byte
			if a.skipping {
				// The server ignores everything but Sync after an error
				// in a pipeline: end that state first.
				q = append(q, 'S', 0, 0, 0, 4)
				s.push(a, entry{kind: eSync, quiet: true})
			}
			if a.status != 'I' {
				q = appendQuery(q, "ROLLBACK")
				s.push(a, entry{kind: eQuery, quiet: true})
			}
			if sessionLike {
				q = appendQuery(q, s.p.cfg.ResetQuery)
				s.push(a, entry{kind: eQuery, quiet: true, reset: true})
			}
			if len(q) == 0 {
				// Nothing to undo: wake the relay so it returns the connection.
				_ = a.conn.NetConn().SetReadDeadline(time.Now())
			} else {
				_ = a.conn.NetConn().SetWriteDeadline(time.Now().Add(5 * time.Second))
				_, err := a.conn.W.Write(q)
				if err == nil {
					err = a.conn.W.Flush()
				}
				_ = a.conn.NetConn().SetWriteDeadline(time.Time{}) // the next borrower must not inherit it
				if err != nil {
					a.destroy = true
					_ = a.conn.NetConn().Close()
				}
			}
		}
	}
	s.mu.Unlock()
	if a != nil {
		select {
		case <-a.done:
		case <-time.After(10 * time.Second):
			s.mu.Lock()
			a.destroy = true
			s.mu.Unlock()
			_ = a.conn.NetConn().Close()
			<-a.done
		}
	}
	s.closeClient()
	if s.counted {
		s.p.active.Add(-1)
		s.p.m.clients.Dec()
	}
}

func appendQuery(dst []byte, sql string) []byte {
	dst = wire.AppendHeader(dst, 'Q', len(sql)+1)
	dst = append(dst, sql...)
	return append(dst, 0)
}

func putUint32(b []byte, v uint32) { binary.BigEndian.PutUint32(b, v) }
