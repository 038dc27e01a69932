// Package pooler is pgquic's pooling state machine, shared by every front end.
//
// A front end (TCP, QUIC, anything that yields an io.ReadWriteCloser) hands
// each client session to Pooler.Serve. The session starts with a PostgreSQL
// startup packet; the pooler authenticates the client itself, then lends it a
// server connection from package backend: for the length of one transaction
// in transaction mode (the default), or for the whole session in session mode.
// Messages are peeked and forwarded as raw frames; only what the state machine
// needs (ReadyForQuery, ErrorResponse, statement names in Parse, Bind,
// Describe and Close...) is decoded.
//
// The package deliberately knows nothing about QUIC, TCP or listeners.
package pooler

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/pooler/lanes"
	"github.com/pgquic/pgquic/pooler/startup"
)

// Pooler runs client sessions against pooled server connections. Create it
// with New; it is safe for concurrent use by any number of front ends.
type Pooler struct {
	cfg   Config
	pools PoolSource
	log   *slog.Logger
	// catalogs holds the catalog watch of each database (catalog.go), by
	// backend.Pool.Server.
	catalogs sync.Map
	bg       background // reads of the catalog (catalog.go), stopped by Shutdown
	m        *metrics

	mu        sync.Mutex
	sessions  map[uint32]*session // by the BackendKeyData process ID we gave the client
	draining  bool
	probed    int           // sessions whose peer has a Probe (see watch.go)
	watchStop chan struct{} // closes the watcher; nil while none runs

	// epoch counts the watcher's ticks; a session waiting on the server
	// records it in session.stuck (see watch.go).
	epoch atomic.Uint32

	active atomic.Int64 // sessions past the startup packet, for MaxClients
	open   atomic.Int64 // sessions between register and unregister
	nextID atomic.Uint64
	wg     sync.WaitGroup

	starting startup.Limiter              // sessions not yet authenticated (startup.go)
	cancelWG sync.WaitGroup               // cancels sent for requests of sessions cut off (cancelOnServer)
	tmo      liveTimeouts                 // the timeouts of cfg, replaceable (SetTimeouts)
	ended    map[string]*DatabaseCounters // counts of ended sessions per database (guarded by mu)
	// live holds every registered session and endedBytes the protocol
	// bytes of those that ended, per transport, for the byte counters read
	// at scrape time (obs.go). Both guarded by mu.
	live       map[*session]struct{}
	endedBytes map[string]*[2]uint64
	canon      startup.CanonTable // the server's spelling of clients' startup values (greeting.go)
	stale      staleGens          // statements whose result type changed (stale.go)
	lat        lanes.Latency      // how fast each kind of query is answered (pipeline.go)

	// kills holds one AfterFunc per context sessions run on, by its Done
	// channel (ctxkill.go). Guarded by mu.
	kills map[<-chan struct{}]*ctxKill

	consoleRef atomic.Pointer[consoleHolder] // the admin console, nil without one (console.go)
	gate       pauseGate                     // databases held by PAUSE or KILL (pause.go)
}

// New builds a Pooler. pools resolves a client's database and user to a
// server pool. A nil logger discards logs; a nil registerer registers no
// metrics.
func New(cfg Config, pools PoolSource, logger *slog.Logger, reg prometheus.Registerer) (*Pooler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pools == nil {
		return nil, errors.New("pooler: nil PoolSource")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	p := &Pooler{
		cfg:      cfg,
		pools:    pools,
		log:      logger,
		m:        m,
		sessions: make(map[uint32]*session),
	}
	p.epoch.Store(1) // a session's stuck mark of 0 means "not waiting"
	p.bg.ctx, p.bg.cancel = context.WithCancel(context.Background())
	_ = p.SetTimeouts(Timeouts{Acquire: cfg.AcquireTimeout, IdleTransaction: cfg.IdleTransactionTimeout,
		ClientIdle: cfg.ClientIdleTimeout, Query: cfg.QueryTimeout}) // validated above
	if reg != nil {
		if err := registerStates(reg, p); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Serve runs one client session to completion and closes rwc. It returns nil
// when the client ended the session normally and the reason otherwise; the
// client has already been told, so callers usually only log it.
//
// An idle session's goroutine waits for its client below this frame, and
// the runtime halves a goroutine's stack at a GC only while less than a
// quarter of it is in use; so Serve keeps its own frame small (begin and
// end do the rest) and thousands of idle sessions sit on small stacks.
func (p *Pooler) Serve(ctx context.Context, rwc io.ReadWriteCloser, peer Peer) error {
	s := p.begin(ctx, rwc, &peer)
	if s == nil {
		return ErrShuttingDown
	}
	err := s.run(ctx)
	p.end(s, err)
	return err
}

// begin creates and registers the session of Serve; nil means the pooler
// is draining (rwc is then closed).
func (p *Pooler) begin(ctx context.Context, rwc io.ReadWriteCloser, peer *Peer) *session {
	s := newSession(p, rwc, *peer)
	if !p.register(s, ctx) {
		// Draining: say why if the client gets as far as a startup packet.
		_ = rwc.Close()
		return nil
	}
	return s
}

// end tears down the session of Serve once it ran.
func (p *Pooler) end(s *session, err error) {
	s.stopTimers()
	s.close()
	p.noteEnded(s)
	s.logEnd(time.Since(s.started), err)
	p.unregister(s)
}

// Shutdown drains the pooler: it takes no new sessions, closes idle ones at
// once and lets sessions inside a transaction finish it. It returns when
// every session has ended, or when ctx expires, in which case the remaining
// sessions are cut off (their server connections are destroyed, never
// returned to the pool dirty) and ctx's error is returned.
func (p *Pooler) Shutdown(ctx context.Context) error {
	p.gate.close() // sessions held by PAUSE go on, and find the pooler draining
	p.mu.Lock()
	p.draining = true
	all := make([]*session, 0, len(p.sessions))
	for _, s := range p.sessions {
		all = append(all, s)
	}
	p.mu.Unlock()
	for _, s := range all {
		s.drain()
	}
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		p.bg.stop()
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		for _, s := range p.sessions {
			s.kill()
		}
		p.mu.Unlock()
		<-done
		p.bg.stop()
		p.cancelWG.Wait() // each bounded by cancelTimeout
		return ctx.Err()
	}
}

// background is work the pooler starts that belongs to no session (reads
// of the catalog): Shutdown cancels its context and waits for it.
type background struct {
	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// add counts one more piece of work about to start; false once stopped.
func (b *background) add() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.wg.Add(1)
	return true
}

func (b *background) done() { b.wg.Done() }

// stop cancels the work running and waits for it; none starts after.
func (b *background) stop() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
}

// Sessions reports the number of client sessions currently open, including
// those still cleaning up their server connection.
func (p *Pooler) Sessions() int {
	return int(p.open.Load())
}

// register gives s its BackendKeyData and lists it; it is killed when ctx
// is done (see watchCtxLocked). It returns false when the pooler is
// draining.
func (p *Pooler) register(s *session, ctx context.Context) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.draining {
		return false
	}
	for {
		var b [8]byte
		_, _ = rand.Read(b[:])
		pid := binary.BigEndian.Uint32(b[:4]) &^ (1 << 31) // positive, like a real PID
		if pid == 0 || p.sessions[pid] != nil {
			continue
		}
		s.pid = pid
		copy(s.secret[:], b[4:])
		p.sessions[pid] = s
		if p.live == nil {
			p.live = map[*session]struct{}{}
			p.endedBytes = map[string]*[2]uint64{}
		}
		p.live[s] = struct{}{}
		p.wg.Add(1)
		p.open.Add(1)
		if s.peer.Probe != nil {
			p.startWatchLocked()
		}
		p.watchCtxLocked(s, ctx)
		return true
	}
}

// rekey gives s its server's process ID, unless another session already
// uses that ID (sessions on different servers). The secret key stays the
// session's own random one, so a CancelRequest from an earlier client of the
// same server can never cancel this session's queries.
func (p *Pooler) rekey(s *session, pid uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pid == 0 || p.sessions[pid] != nil {
		return
	}
	delete(p.sessions, s.pid)
	s.pid = pid
	p.sessions[pid] = s
}

// dropKey removes s's BackendKeyData from the cancel map, if still its own.
func (p *Pooler) dropKey(s *session) {
	p.mu.Lock()
	if p.sessions[s.pid] == s {
		delete(p.sessions, s.pid)
	}
	p.mu.Unlock()
}

func (p *Pooler) unregister(s *session) {
	p.mu.Lock()
	delete(p.live, s)
	b := p.endedBytes[s.peer.Transport]
	if b == nil {
		b = new([2]uint64)
		p.endedBytes[s.peer.Transport] = b
	}
	b[0] += s.ctr.Received.Load()
	b[1] += s.ctr.Sent.Load()
	if p.sessions[s.pid] == s {
		delete(p.sessions, s.pid)
	}
	if s.peer.Probe != nil {
		p.stopWatchLocked()
	}
	p.unwatchCtxLocked(s)
	p.mu.Unlock()
	p.open.Add(-1)
	p.wg.Done()
}

// cancel routes a CancelRequest to the server connection currently serving
// the session it names. A request for an unknown session, with a wrong key, or
// for a session with nothing running is ignored, as PostgreSQL does; a
// request still waiting for a server connection stops waiting instead.
//
// The cancel is registered on the session's attachment before the lock is
// dropped, so the connection cannot go back to the pool, and be lent to
// another client whose query the signal would then hit, until the server has
// processed the cancel (see cancel.go).
func (p *Pooler) cancel(ctx context.Context, pid uint32, key []byte) {
	p.m.cancels.Inc()
	p.mu.Lock()
	s := p.sessions[pid]
	p.mu.Unlock()
	if s == nil || len(key) != len(s.secret) || subtle.ConstantTimeCompare(key, s.secret[:]) != 1 {
		p.log.Debug("cancel request for unknown session", "pid", pid)
		return
	}
	s.mu.Lock()
	conn, g := s.beginCancelLocked()
	s.mu.Unlock()
	if conn == nil {
		// Nothing runs on a server yet; if the request is still waiting
		// for a server connection, cancel the wait instead.
		s.cancelWait()
		return
	}
	s.forwardCancel(ctx, conn, g)
}
