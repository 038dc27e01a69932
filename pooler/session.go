package pooler

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/wire"
	"github.com/pgquic/pgquic/pooler/lanes"
	"github.com/pgquic/pgquic/pooler/params"
)

// session is one client session. Its owner goroutine (the one in Serve) reads
// the client and makes every decision; while a server connection is attached
// a relay goroutine forwards the server's replies and decides, at
// ReadyForQuery, whether the connection goes back to the pool.
//
// Locks, always taken in this order: mu (attachment state and the ordering
// of everything written to the client while attached), then cwMu (the client
// writer). A method named ...Locked is called with mu held and returns with
// it held, so mu is taken and released where its callers can be read.
// wmu is held by the owner from its first unflushed write to a server
// connection until the flush (sendOut takes it, flushAll or close releases
// it; wlocked records that the owner holds it), so the relay cannot hand
// that connection back to the pool with half a message in its buffer.
type session struct {
	p    *Pooler
	log  *slog.Logger
	peer Peer

	pid    uint32
	secret [4]byte
	id     uint64 // unique for the pooler's lifetime, unlike pid
	attGen uint64 // attachments begun, under mu (attachment.gen)

	// Owner-only state.
	rwc           io.ReadWriteCloser // written with mu and cwMu held (setStream); read under either, or by the owner
	cr            *wire.Reader
	waiter        front.ReadWaiter // the client stream, when it can wait for input without reading (see waitClient)
	secure        bool
	counted       bool
	loggedIn      bool
	user          string
	database      string
	pool          *backend.Pool
	desired       map[string]string // parameter values the client believes are in effect
	paramKey      string            // desired, serialised; "" when it must be recomputed
	reapply       []byte            // Query frame setting the unreported desired parameters (see reapplyParams)
	startupParams map[string]string // the client's startup parameters, which RESET returns to (see params.go)
	proven        bool              // desired has been set on a server once: later syncs are pipelined
	lastConn      *serverState      // the server connection this session borrowed last (see lastBorrower)
	unnamed       *stmt             // the client's unnamed statement, for replay
	plainQuery    plainQuery        // the client's last plain simple-Query text (inspectQuery); owner only
	skipping      bool              // dropping messages until Sync after an error the pooler raised
	lastSync      bool              // the last client message was Sync, Query, FunctionCall, CopyDone or CopyFail
	segOpen       bool              // an extended-protocol message came after the last Sync, Query or FunctionCall: the server is inside the client's sync segment
	followDue     bool              // owner-only: an attachment's parameter query is owed (a.followOwed), so followAtRest takes s.mu to look
	wlocked       bool              // owner holds wmu
	wconn         *backend.Conn     // connection whose writer the owner must flush
	flushRider    *lanes.Rider      // the rider whose writing a deferred flush ends (flushOnRead); owner only
	slowReplies   bool              // the last request took over flushOnReadAfter to answer (noteReady); s.mu
	doneWritingFn func()            // s.doneWriting, bound once so a deferred flush allocates nothing
	scratch       []byte
	authMax       int         // bound on the client's next authentication message, set by Send
	out           []byte      // frames for the server staged while s.mu was held (see sendOut)
	outAtt        *attachment // where they go
	outFwd        bool        // then forward the current client message raw
	msgLen        int         // length of the current client message, header included
	curTyp        byte        // type of the current client message
	pipeTyp       byte        // the message a server connection is wanted for, for pipelineCheckLocked; 0 when none
	pipeSeq       bool        // that message may read sequence state (sequences.go)
	pipeBody      []byte      // its body
	pipeText      lexedText   // what the lexer found in that message's statement text, when someone looked already
	rider         lanes.Rider // memory for the session's request on a shared server connection (pipeline.go)
	catalogAt     catalogMark // the catalog the last request was read by (catalog.go); owner only
	catalogRead   bool        // the message at hand was read by the catalog, at catalogAt; owner only

	cwMu sync.Mutex
	cw   *bufio.Writer        // nil while idle (see flushClient)
	cwFn func() *bufio.Writer // s.clientWriter, bound once so forwarding a row allocates nothing
	busy atomic.Bool          // a server connection is attached: keep cw

	authed  atomic.Bool  // logged in (for the clients_by_state gauge)
	waiting atomic.Bool  // waiting for a server connection (same)
	txns    atomic.Int64 // transactions completed, for the session-end log line

	timeouts // idle and query timers (timeouts.go)

	ctr DatabaseCounters // this session's counts for SHOW STATS (obs.go)

	stuck atomic.Uint32 // watcher epoch when the owner began waiting on the server; 0 when not (watch.go)

	cancelsOut atomic.Int32 // cancels forwarded for this session's requests and not yet processed (awaitCancels)

	wmu sync.Mutex

	mu         sync.Mutex
	waitCancel context.CancelCauseFunc // set while waiting for a server connection
	stmts      map[string]*stmt        // the client's named prepared statements (transaction mode)
	stmtBytes  int                     // their size, for ClientStatementBytes
	att        *attachment
	draining   bool
	pinned     bool      // transaction mode: the client keeps its server connection (pin.held != 0)
	early      *earlyRun // a 0-RTT request run read-only, or to run once confirmed (zerortt.go); owner only
	pin        pinState  // why (pin.go)
	// processBound: a call whose effect stays with the server process ran
	// on the attached connection (sqllex.ProcessState), in either mode;
	// the connection is closed when the client leaves (abandonLocked).
	processBound bool
	restore      map[string]string  // startup values a client's RESET took away, to set again (see followLocked)
	snapshot     bool               // the client changed parameters: read them back (see followLocked)
	custom       map[string]bool    // custom (dotted) parameters the client set, read back by name
	resetStmts   map[string]sqlInfo // session mode: the client's statements that RESET parameters, by name
	killed       bool
	closing      bool // rwc closed by us

	abandoned *attachment // the watcher cancelled its request: the client is gone (watch.go)
	abandonAt time.Time   // when

	ctxKill *ctxKill // what kills the session when Serve's context is done (ctxkill.go); guarded by p.mu

	// Read by the admin console's snapshots (clients.go): the owner sets
	// the first two before listed, the last two under mu.
	started     time.Time   // when the session began
	appName     string      // startup application_name
	console     Console     // non-nil for an admin console session (console.go)
	listed      atomic.Bool // logged in: user, database, pool and the above are final
	waitSince   time.Time   // when the current wait for a server connection began
	lastRequest time.Time   // when the first request on the last attached server connection began (noteRequest)
}

func newSession(p *Pooler, rwc io.ReadWriteCloser, peer Peer) *session {
	if peer.Transport == "" {
		peer.Transport = "unknown"
	}
	s := &session{
		p:       p,
		id:      p.nextID.Add(1),
		peer:    peer,
		started: time.Now(),
		// Until the client has authenticated it may send nothing larger
		// than an authentication message; login raises the limit to
		// MaxMessageLen.
	}
	s.waiter, _ = rwc.(front.ReadWaiter)
	s.rwc = s.countBytes(rwc)
	s.cr = wire.NewReader(s.rwc, clientReadBuf, min(maxPasswordPacketLen-4, p.cfg.MaxMessageLen))
	s.cwFn = s.clientWriter
	s.doneWritingFn = s.doneWriting
	s.log = s.logger(false)
	return s
}

// logger returns the session's logger: the pooler's, with the session's
// transport and client address and, when named, its user and database. It
// costs the session one small handler (see sessionHandler), not a copy of
// the pooler's.
func (s *session) logger(named bool) *slog.Logger {
	return newSessionLogger(s.p.log, s.peer.Transport, s.peer.Addr, named, s.user, s.database)
}

// setStream swaps the client stream after a TLS upgrade. The startup timer
// may close the stream from its own goroutine at any moment (closeClient), so
// rwc changes only under s.mu; if the session was closed meanwhile, the new
// stream is closed too.
func (s *session) setStream(rwc io.ReadWriteCloser) {
	s.waiter, _ = rwc.(front.ReadWaiter)
	rwc = s.countBytes(rwc)
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
// Its frame stays under an idle session's wait for its client, so the
// startup is done in a function that has returned by then (see
// Pooler.Serve).
func (s *session) run(ctx context.Context) error {
	if ok, err := s.timedStartup(ctx); !ok {
		return err
	}
	s.scratch = nil // it held the greeting; an idle session need not keep it
	if s.console != nil {
		if s.peer.HandshakeConfirmed != nil { // no admin command on replayable data
			if err := s.awaitConfirmed(ctx); err != nil {
				return err
			}
		}
		return s.serveConsole(ctx)
	}
	return s.loop(ctx)
}

// timedStartup runs the startup phase bounded by StartupTimeout. ok reports
// that the session goes on; otherwise err is what it ends with (nil after a
// CancelRequest was served).
func (s *session) timedStartup(ctx context.Context) (ok bool, err error) {
	timedOut := atomic.Bool{}
	t := time.AfterFunc(s.p.cfg.StartupTimeout, func() {
		timedOut.Store(true)
		s.closeClient()
	})
	err = s.startup(ctx)
	stopped := t.Stop()
	if errors.Is(err, errCancelHandled) {
		return false, nil
	}
	if !stopped && timedOut.Load() {
		return false, fmt.Errorf("startup timeout after %s", s.p.cfg.StartupTimeout)
	}
	return err == nil, err
}

// waitClient waits for the client's next message without a read buffer
// when the client stream can wait for input without reading it
// (front.ReadWaiter): the buffer goes back to a shared pool meanwhile, so
// an idle session holds none. A failed wait is left to the read that
// follows to report.
func (s *session) waitClient() {
	if s.waiter != nil && s.cr.Release() {
		_ = s.waiter.WaitRead()
	}
}

// clientGone classifies a failed client read: EOF is a client leaving
// without Terminate, anything else is reported.
func (s *session) clientGone(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil
	}
	return fmt.Errorf("reading from client: %w", err)
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
	s.mu.Lock()
	if a := s.currentLocked(); a != nil {
		// A server is attached, maybe inside a transaction block: let the
		// server raise the error, so the transaction is aborted and the
		// rest of the pipeline skipped exactly as PostgreSQL would.
		defer s.mu.Unlock()
		return s.serverRaiseLocked(a, pe, simple)
	}
	s.mu.Unlock()
	out := pe.encode(nil)
	if simple {
		out = append(out, readyForQuery('I')...)
	}
	return s.writeClientLocal(out)
}

// serverRaiseLocked makes the attached server raise pe, through an anonymous DO
// block whose Parse and Bind replies are swallowed; the client sees the
// ErrorResponse of the Execute. With simple (the refused message was a
// simple Query, which ends with ReadyForQuery) a Sync follows, whose
// ReadyForQuery the client gets: without it the server would wait for a
// Sync that never comes, skipping the client's next Query, and leave the
// client waiting for ReadyForQuery. s.mu must be held.
func (s *session) serverRaiseLocked(a *attachment, pe *PGError, simple bool) error {
	clean := func(s string) string { return strings.ReplaceAll(s, "$pgquic$", "") }
	sql := "DO $pgquic$BEGIN RAISE EXCEPTION USING ERRCODE = " + params.QuoteLiteral(pe.Code) +
		", MESSAGE = " + params.QuoteLiteral(clean(pe.Message))
	if pe.Detail != "" {
		sql += ", DETAIL = " + params.QuoteLiteral(clean(pe.Detail))
	}
	if pe.Hint != "" {
		// The same hint as when the pooler answers itself.
		sql += ", HINT = " + params.QuoteLiteral(clean(pe.Hint))
	}
	sql += "; END$pgquic$"
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
	if simple {
		f = append(f, syncMsg...)
		s.push(a, entry{kind: eSync})
	}
	a.st.stmts.DropUnnamed()
	return s.writeServer(a, f)
}

// respond writes a reply the pooler produced itself, in order with whatever
// the server still owes the client: directly when nothing is pending,
// otherwise queued behind the pending replies. With rfq a ReadyForQuery
// carrying the current transaction status follows.
func (s *session) respond(msg []byte, rfq bool) error {
	s.mu.Lock()
	if a := s.currentLocked(); a != nil {
		defer s.mu.Unlock()
		if a.pending() > 0 || a.skipping {
			s.push(a, entry{kind: eSynthetic, synthetic: msg, rfq: rfq})
			return nil
		}
		if rfq {
			msg = append(msg, readyForQuery(a.status)...)
		}
		return s.writeClient(msg)
	}
	s.mu.Unlock()
	if rfq {
		msg = append(msg, readyForQuery('I')...)
	}
	return s.writeClientLocal(msg)
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
