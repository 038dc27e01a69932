// Package backend keeps warm, authenticated PostgreSQL server connections in
// pools, one pool per (database, user), and hands them to the pooler.
//
// Connections are opened with pgconn (TLS, trust/cleartext/md5/SCRAM
// authentication, startup parameters) and then hijacked: the pooler speaks
// the protocol over the raw socket through Conn.R and Conn.W. A puddle pool
// bounds the number of connections; a background loop per pool keeps MinPool
// connections open and retires old or surplus idle ones. Acquire never hands
// out a connection the server has already closed or written to: it peeks at
// the socket without blocking and runs a round-trip check on connections that
// sat idle for a while.
package backend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// ErrNoRoute reports that no route serves the requested database and user.
var ErrNoRoute = errors.New("backend: no route for database and user")

// ErrPoolClosed reports an Acquire on a pool (or manager) that has been
// closed, typically during shutdown.
var ErrPoolClosed = errors.New("backend: pool closed")

// maintainEvery is how often the background loop checks a pool.
const maintainEvery = time.Second

// maxRetryBackoff caps the wait between failed attempts to reach MinPool.
const maxRetryBackoff = 30 * time.Second

// Pool is a bounded set of server connections to one database as one user.
// All methods are safe for concurrent use.
type Pool struct {
	cfg      PoolConfig
	pgcfg    *pgconn.Config
	database string
	user     string
	logger   *slog.Logger
	metrics  *poolMetrics
	pp       *puddle.Pool[*Conn]
	waiting  atomic.Int64
	// lent counts the connections lent to holders now (from acquire to
	// Release or Destroy), for Spare: one atomic add each way, where
	// puddle's Stat takes its lock and allocates.
	lent atomic.Int32

	// ctx is cancelled by Close; it aborts background connection attempts.
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the background loop has exited

	startOnce sync.Once
	closeOnce sync.Once

	// targets maps a server PID to where its connection was dialed, for
	// Cancel. Only the constructor and destructor write it.
	targetsMu sync.Mutex
	targets   map[uint32]cancelTarget
	live      map[*Conn]struct{} // open connections, for Servers (admin.go); under targetsMu

	// paused stops fillMin while the admin console holds the pool (admin.go).
	paused atomic.Bool

	// sweeping counts the idle connections sweepIdle has taken out of the
	// pool to check. puddle counts them as acquired, but no client holds
	// them: Stat reports them as idle. Under sweepMu, which Stat holds while
	// it reads puddle's counts so that both are from the same moment.
	sweepMu  sync.Mutex
	sweeping int

	// shared is what the pooler keeps with the pool (see Shared).
	sharedOnce sync.Once
	shared     atomic.Pointer[any]

	// failures counts consecutive failed attempts to reach MinPool; only the
	// background loop touches it and retryAt.
	failures int
	retryAt  time.Time

	// mgr and key are set for pools of wildcard routes, which their
	// Manager may retire; nil for every other pool.
	mgr *Manager
	key serverKey
	// connected is set by the first successful connection. Until then a
	// login the server refuses retires a wildcard pool.
	connected atomic.Bool
	// retired is set when the Manager has forgotten the pool: Acquire calls
	// that find it closed go to the route's current pool instead. rejection,
	// stored before retired, holds the server's refusal of the pool's first
	// login when that was the reason.
	retired   atomic.Bool
	rejection atomic.Pointer[error]
	// unusedAcquires and unusedSince are the Manager's reaper's notes on
	// when the pool was last seen in use; only the reaper touches them.
	unusedAcquires int64
	unusedSince    time.Time

	// newest is the most recently opened connection still in the pool;
	// ServerParams reports its ServerDefaults. The destructor clears it.
	newest atomic.Pointer[Conn]

	// template is set when the pool's database is a template database
	// (template.go); templateKnown once a connection has read it.
	template, templateKnown atomic.Bool
}

// Stats is a snapshot of a pool's connections.
type Stats struct {
	// Database and User are the server-side database and user.
	Database, User string
	// Total counts every connection: idle, in use and being opened.
	Total int
	// Idle connections are ready to hand out.
	Idle int
	// InUse connections are held by clients.
	InUse int
	// Constructing connections are being dialed and authenticated.
	Constructing int
	// Max is the pool size.
	Max int
	// Waiting counts Acquire calls in progress: callers waiting for a
	// connection or for one to be opened.
	Waiting int
}

// NewPool parses cfg, opens MinPool connections and starts the background
// loop that keeps them open. An unparsable ConnString or invalid settings
// return an error; a server that cannot be reached does not: the failure is
// logged and the loop keeps retrying, so the service comes up before its
// database does. A nil logger discards logs; a nil m records no metrics.
func NewPool(ctx context.Context, cfg PoolConfig, logger *slog.Logger, m *Metrics) (*Pool, error) {
	cfg, err := cfg.populate()
	if err != nil {
		return nil, err
	}
	pgcfg, err := parseConnString(cfg.ConnString)
	if err != nil {
		return nil, err
	}
	p, err := newPool(cfg, pgcfg, logger, m)
	if err != nil {
		return nil, err
	}
	p.warm(ctx)
	p.start()
	return p, nil
}

// parseConnString parses a postgres URL or keyword/value string.
func parseConnString(s string) (*pgconn.Config, error) {
	if s == "" {
		return nil, fmt.Errorf("%w: ConnString is empty", ErrInvalidConfig)
	}
	pgcfg, err := pgconn.ParseConfig(s)
	if err != nil {
		// pgconn redacts the password in its error text.
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return pgcfg, nil
}

// newPool builds a pool around an already parsed server configuration
// without opening connections or starting the background loop. cfg must have
// its defaults populated.
func newPool(cfg PoolConfig, pgcfg *pgconn.Config, logger *slog.Logger, m *Metrics) (*Pool, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{
		cfg:      cfg,
		pgcfg:    pgcfg,
		database: pgcfg.Database,
		user:     pgcfg.User,
		ctx:      ctx,
		cancel:   cancel,
		done:     make(chan struct{}),
		targets:  make(map[uint32]cancelTarget),
	}
	p.logger = logger.With("database", p.database, "user", p.user)
	pp, err := puddle.NewPool(&puddle.Config[*Conn]{
		Constructor: p.construct,
		Destructor:  p.destruct,
		MaxSize:     int32(cfg.PoolSize),
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	p.pp = pp
	p.metrics = m.forPool(p)
	return p, nil
}

// Shared returns the value the layer above keeps with this pool (the
// pooler's record of which connections several clients share), creating it
// with init the first time. The backend package never reads it; it lives
// and goes with the pool, so it needs no registry of its own.
//
// When that value implements ReleaseNotifier, it hears of every connection
// that goes back to the pool or is destroyed. init is given the pool, so
// that a caller can pass a function value that captures nothing and costs
// no allocation per call.
func (p *Pool) Shared(init func(*Pool) any) any {
	if v := p.shared.Load(); v != nil {
		return *v // the common case, without the closure below
	}
	p.sharedOnce.Do(func() {
		v := init(p)
		p.shared.Store(&v)
	})
	return *p.shared.Load()
}

// ReleaseNotifier is implemented by a Shared value that wants to hear when
// a connection of the pool comes free (or is destroyed, so another may be
// opened): the pooler keeps its own queue of clients that wait for either a
// connection or a place on a shared one.
type ReleaseNotifier interface {
	// ConnReleased is called after the connection went back to the pool
	// or was destroyed. It must not block.
	ConnReleased()
}

// notifyReleased tells the Shared value, if it listens, that a connection
// came free.
func (p *Pool) notifyReleased() {
	if v := p.shared.Load(); v != nil {
		if n, ok := (*v).(ReleaseNotifier); ok {
			n.ConnReleased()
		}
	}
}

// Closing reports whether Close has been called: the pool lends no more
// connections, and a holder should return its connection rather than hand
// it on to another client.
func (p *Pool) Closing() bool { return p.ctx.Err() != nil }

// Full reports whether every connection the pool may have is open and none
// is being opened, so a free connection can only come from a release.
func (p *Pool) Full() bool {
	s := p.pp.Stat()
	return s.TotalResources() >= s.MaxResources() && s.ConstructingResources() == 0
}

// Spare returns how many more connections the pool could lend now
// without a release: its size less the connections lent (idle ones and
// those it may still open). A holder that has just borrowed one reads it
// to know whether the pool is close to full. It is a moment's count: by
// the time it is read another holder may have borrowed or released.
func (p *Pool) Spare() int { return p.cfg.PoolSize - int(p.lent.Load()) }

// Size returns the most connections the pool may have open at once.
func (p *Pool) Size() int { return p.cfg.PoolSize }

// Database returns the server-side database name of the pool.
func (p *Pool) Database() string { return p.database }

// Server names the database the pool's connections reach, as host:port
// and database name, the same for every pool of that database whatever
// its user: the layer above keeps what it learns of a database's catalog
// by it.
func (p *Pool) Server() string {
	return fmt.Sprintf("%s:%d/%s", p.pgcfg.Host, p.pgcfg.Port, p.pgcfg.Database)
}

// User returns the server-side user name of the pool.
func (p *Pool) User() string { return p.user }

// ServerParams returns the ParameterStatus values the pool's newest
// connection got from the server at login, or nil when that connection has
// been closed (or none was opened yet). A client's greeting reports them, so
// they must not outlive the connection they came from: after ALTER DATABASE
// ... SET and the old connections' replacement, new clients see the new
// defaults, as they would connecting directly. The map must not be
// modified.
func (p *Pool) ServerParams() map[string]string {
	if c := p.newest.Load(); c != nil {
		return c.ServerDefaults
	}
	return nil
}

// Stat returns a snapshot of the pool's connection counts. Idle connections
// the background loop is checking at that moment count as idle, not in use.
func (p *Pool) Stat() Stats {
	p.sweepMu.Lock()
	s := p.pp.Stat()
	sweeping := p.sweeping
	p.sweepMu.Unlock()
	return Stats{
		Database:     p.database,
		User:         p.user,
		Total:        int(s.TotalResources()),
		Idle:         int(s.IdleResources()) + sweeping,
		InUse:        int(s.AcquiredResources()) - sweeping,
		Constructing: int(s.ConstructingResources()),
		Max:          int(s.MaxResources()),
		Waiting:      int(p.waiting.Load()),
	}
}

// Acquire returns an idle server connection, opening one if the pool has room,
// or waits for one to be released. It fails when ctx ends (the error wraps
// ctx.Err()), when a new connection cannot be opened, or with ErrPoolClosed.
//
// A connection the server has closed or written to while it was idle (after
// pg_terminate_backend or a server restart) is destroyed and another one is
// tried, so the caller never gets a dead connection from the pool; one idle
// longer than HealthCheckAfter is checked with a round trip first.
func (p *Pool) Acquire(ctx context.Context) (*Conn, error) {
	return p.acquire(ctx, false)
}

// TryAcquire is Acquire without waiting: it returns ErrNotAvailable at once
// when no connection is idle and the pool is full. It lets a caller skip
// setting up a deadline on the common, uncontended path.
func (p *Pool) TryAcquire(ctx context.Context) (*Conn, error) {
	return p.acquire(ctx, true)
}

// ErrNotAvailable is returned by TryAcquire when it would have to wait.
var ErrNotAvailable = errors.New("backend: no idle server connection")

func (p *Pool) acquire(ctx context.Context, try bool) (*Conn, error) {
	var start time.Time
	if !try {
		start = time.Now()
		p.waiting.Add(1)
		defer p.waiting.Add(-1)
	}
	for {
		var res *puddle.Resource[*Conn]
		var err error
		if try {
			res, err = p.pp.TryAcquire(ctx)
			if errors.Is(err, puddle.ErrNotAvailable) {
				return nil, ErrNotAvailable
			}
		} else {
			res, err = p.pp.Acquire(ctx)
		}
		if err != nil {
			if p.retired.Load() && ctx.Err() == nil &&
				(errors.Is(err, puddle.ErrClosedPool) || errors.Is(err, context.Canceled)) {
				return p.acquireRetired(ctx, try)
			}
			return nil, p.acquireError(ctx, err)
		}
		c := res.Value()
		if err := c.alive(); err != nil {
			p.logger.Debug("backend: discarding dead connection", "pid", c.PID, "err", err)
			p.destroyRes(res, reasonDead)
			continue
		}
		if res.IdleDuration() > p.cfg.HealthCheckAfter {
			if err := c.ping(ctx, p.cfg.ConnectTimeout); err != nil {
				p.logger.Debug("backend: health check failed", "pid", c.PID, "err", err)
				p.destroyRes(res, reasonDead)
				if ctx.Err() != nil {
					return nil, p.acquireError(ctx, ctx.Err())
				}
				continue
			}
		}
		c.res.Store(res)
		p.lent.Add(1)
		p.metrics.acquired(start)
		return c, nil
	}
}

// acquireRetired serves an Acquire that found the pool retired: closed, or
// closing while it waited or connected. When the server refused the pool's
// login, the caller gets that refusal; otherwise (the pool went unused and
// a session kept it) the route's current pool serves it.
func (p *Pool) acquireRetired(ctx context.Context, try bool) (*Conn, error) {
	if err := p.rejection.Load(); err != nil {
		return nil, *err
	}
	q, err := p.mgr.successor(p)
	if err != nil {
		return nil, err
	}
	return q.acquire(ctx, try)
}

// acquireError turns a puddle error into this package's errors.
func (p *Pool) acquireError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, puddle.ErrClosedPool):
		return fmt.Errorf("backend: acquire %s/%s: %w", p.database, p.user, ErrPoolClosed)
	case ctx.Err() != nil:
		return fmt.Errorf("backend: acquire %s/%s: %w", p.database, p.user, ctx.Err())
	default:
		return err // already wrapped by dial
	}
}

// destroyRes closes a checked-out connection and counts why.
func (p *Pool) destroyRes(res *puddle.Resource[*Conn], reason string) {
	p.metrics.destroyedFor(reason)
	res.Destroy()
}

// construct is the puddle constructor. ctx is the Acquire caller's context
// detached from its cancellation (puddle keeps constructing for the next
// caller), or the pool's own context; dial bounds it by ConnectTimeout.
func (p *Pool) construct(ctx context.Context) (*Conn, error) {
	c, err := p.dial(ctx)
	if err != nil {
		p.metrics.connectFailed()
		if p.mgr != nil && !p.connected.Load() && loginRejected(err) {
			// A client named a database or user the server does not
			// know: keep nothing for it.
			p.rejection.CompareAndSwap(nil, &err)
			p.mgr.retire(p, retireRejected)
		}
		return nil, err
	}
	p.metrics.connected()
	if p.mgr != nil && !p.connected.Load() {
		p.connected.Store(true)
		p.start() // a wildcard pool's loop starts with its first connection
	}
	p.targetsMu.Lock()
	p.targets[c.PID] = cancelTarget{network: c.network, address: c.address, tlsConfig: c.tlsConfig}
	p.targetsMu.Unlock()
	p.newest.Store(c)
	p.track(c)
	p.logger.Debug("backend: connected", "pid", c.PID, "address", c.address, "tls", c.tlsConfig != nil)
	return c, nil
}

// terminateMsg is the Terminate message: 'X' and length 4.
var terminateMsg = []byte{'X', 0, 0, 0, 4}

// destruct is the puddle destructor: a polite Terminate (best effort, with a
// short deadline so a stuck socket cannot hold it up), then close. Over TLS
// the socket is closed directly, skipping the close_notify alert whose write
// could block for seconds on a dead peer.
func (p *Pool) destruct(c *Conn) {
	p.newest.CompareAndSwap(c, nil)
	p.targetsMu.Lock()
	if t, ok := p.targets[c.PID]; ok && t.address == c.address {
		delete(p.targets, c.PID)
	}
	p.targetsMu.Unlock()
	p.untrack(c)

	nc := c.netConn
	_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = nc.Write(terminateMsg)
	if tc, ok := nc.(*tls.Conn); ok {
		_ = tc.NetConn().Close()
	}
	_ = nc.Close()
}

// warm opens connections until the pool holds MinPool, in parallel, and logs
// a failure instead of returning it: the background loop retries.
func (p *Pool) warm(ctx context.Context) {
	need := p.cfg.MinPool - int(p.pp.Stat().TotalResources())
	if need <= 0 {
		return
	}
	errs := make(chan error, need)
	for range need {
		go func() { errs <- p.pp.CreateResource(ctx) }()
	}
	var first error
	for range need {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil && !errors.Is(first, puddle.ErrClosedPool) {
		p.noteFailure(first)
	}
}

// unusedFor returns how long the pool has gone without a connection lent
// out, an Acquire in progress or a new Acquire, as seen by successive calls
// (the first call starts the clock). Only the Manager's reaper calls it.
func (p *Pool) unusedFor(now time.Time) time.Duration {
	s := p.pp.Stat()
	n := s.AcquireCount()
	if s.AcquiredResources() > 0 || s.ConstructingResources() > 0 || p.waiting.Load() > 0 ||
		n != p.unusedAcquires || p.unusedSince.IsZero() {
		p.unusedAcquires, p.unusedSince = n, now
		return 0
	}
	return now.Sub(p.unusedSince)
}

// start launches the background loop once.
func (p *Pool) start() {
	p.startOnce.Do(func() { go p.run() })
}

// run is the background loop: every maintainEvery it retires old and surplus
// idle connections, drops dead idle ones, and tops the pool up to MinPool.
// It exits when Close cancels p.ctx.
func (p *Pool) run() {
	defer close(p.done)
	t := time.NewTicker(maintainEvery)
	defer t.Stop()
	for {
		p.maintain()
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// maintain is one round of the background loop, in the spirit of pgxpool's
// backgroundHealthCheck and checkMinConns.
func (p *Pool) maintain() {
	p.sweepIdle()
	p.fillMin()
}

// sweepIdle takes every idle connection out for a moment and destroys it
// when it is dead, past ServerLifetime, idle past ServerIdleTimeout while
// the pool holds more than MinPool, or of a template database (such as the
// connections warm opened before the first one found that out); the rest
// go back unchanged.
//
// While a connection is out for its check, Stat counts it as idle (see
// sweeping); the count and puddle's change together under sweepMu. Each
// connection put back or destroyed is announced like a client's Release.
func (p *Pool) sweepIdle() {
	p.sweepMu.Lock()
	idle := p.pp.AcquireAllIdle()
	p.sweeping += len(idle)
	p.sweepMu.Unlock()
	if len(idle) == 0 {
		return
	}
	total := int(p.pp.Stat().TotalResources())
	for _, res := range idle {
		c := res.Value()
		reason := ""
		switch {
		case c.alive() != nil:
			reason = reasonDead
		case time.Since(res.CreationTime()) > p.cfg.ServerLifetime:
			reason = reasonLifetime
		case total > p.cfg.MinPool && res.IdleDuration() > p.cfg.ServerIdleTimeout:
			reason = reasonIdle
		case p.template.Load():
			reason = reasonTemplate
		case p.paused.Load():
			// Pause (PAUSE, KILL) closed the idle connections while
			// this one was out for its check: close it too, or it
			// would come back idle and stay so until RESUME.
			reason = reasonAdmin
		}
		p.sweepMu.Lock()
		p.sweeping--
		if reason == "" {
			res.ReleaseUnused()
		} else {
			p.destroyRes(res, reason)
			total--
		}
		p.sweepMu.Unlock()
		// A session of the pooler may have found no idle connection
		// while this one was out and be waiting to hear of one.
		p.notifyReleased()
	}
}

// fillMin opens connections until the pool holds MinPool, none for a
// template database and none while paused, not even one whose opening
// began before Pause. After a failure it
// backs off exponentially (1s, 2s, 4s... up to 30s) and logs only the first
// failure of a streak and the recovery.
func (p *Pool) fillMin() {
	if p.cfg.MinPool == 0 || p.paused.Load() || p.template.Load() || time.Now().Before(p.retryAt) {
		return
	}
	for int(p.pp.Stat().TotalResources()) < p.cfg.MinPool && !p.paused.Load() {
		err := p.pp.CreateResource(p.ctx)
		if p.paused.Load() {
			// Pause ran while the connection was being opened, after
			// it had closed the idle ones or before this one was idle:
			// close it, as Pause would have.
			p.CloseIdle()
			return
		}
		if err != nil {
			if errors.Is(err, puddle.ErrClosedPool) || errors.Is(err, puddle.ErrNotAvailable) || p.ctx.Err() != nil {
				return
			}
			p.noteFailure(err)
			return
		}
		if p.failures > 0 {
			p.logger.Info("backend: server reachable again", "failed_attempts", p.failures)
			p.failures = 0
			p.retryAt = time.Time{}
		}
	}
}

// noteFailure records a failed attempt to reach MinPool.
func (p *Pool) noteFailure(err error) {
	p.failures++
	backoff := maxRetryBackoff
	if p.failures < 6 {
		backoff = time.Second << (p.failures - 1)
	}
	p.retryAt = time.Now().Add(backoff)
	if p.failures == 1 {
		p.logger.Warn("backend: cannot open server connection; retrying in the background", "err", err)
	}
}

// Close stops the background loop, aborts connection attempts in progress,
// rejects further Acquire calls with ErrPoolClosed and closes every
// connection. Like puddle's Close it waits until connections held by clients
// have been released or destroyed, so callers end their sessions first.
func (p *Pool) Close() {
	p.closeOnce.Do(func() {
		p.cancel()
		p.startOnce.Do(func() { close(p.done) }) // never started: nothing to wait for
		<-p.done
		p.pp.Close()
		p.metrics.detach()
	})
}
