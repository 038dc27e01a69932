package backend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/defaults"
	"github.com/pgquic/pgquic/internal/pgproto"
)

// Wildcard matches any database in Route.Database and any user in Route.User
// (where the empty string means the same).
const Wildcard = "*"

// Route maps the database and user a client asks for to a server. Matching
// order for a client's (database, user): a route naming both, then a route
// naming the database with any user, then a wildcard-database route naming
// the user, then a wildcard-database route for any user.
//
// A route with a named database connects as the database and user of its
// ConnString, whatever the client's user. A wildcard-database route connects
// to the client's database as the client's user, taking host, password, TLS
// and everything else from ConnString. Its pools ignore MinPool: they start
// empty, and every connection idle for ServerIdleTimeout is closed, so no
// connection lingers in a database a client touched once.
type Route struct {
	// Database is the database name clients ask for; "*" matches any.
	Database string
	// User is the client user; "" or "*" matches any.
	User string
	// PoolConfig says how to reach the server; zero fields take
	// ManagerConfig.Defaults, then the package defaults.
	PoolConfig
}

// Defaults of ManagerConfig, applied when a field is left at zero.
const (
	// DefaultMaxPools bounds the pools wildcard routes create on demand.
	// Every such pool costs a background goroutine once connected, about
	// 27 metric series and its own server connections, and clients
	// choose the names that create them; 100 covers a server with many
	// small databases while keeping all of that bounded.
	DefaultMaxPools = defaults.MaxPools
	// DefaultPoolIdleTimeout is how long a wildcard pool may go unused (no
	// connection lent out, no Acquire) before it is closed and forgotten.
	// It matches DefaultServerIdleTimeout: by then a quiet pool has shrunk
	// to MinPool anyway, and those warm connections cost the server more
	// than reopening them costs a rare client.
	DefaultPoolIdleTimeout = defaults.PoolIdleTimeout
)

// ManagerConfig lists the routes of a Manager.
type ManagerConfig struct {
	// Routes are matched as described on Route. At least one is required.
	Routes []Route
	// Defaults supplies PoolSize, MinPool, timeouts (and ConnString, when a
	// route has none) to routes that leave them zero.
	Defaults PoolConfig

	// MaxPools bounds the pools that wildcard routes hold at once (pools of
	// routes with a named database are not counted: the configuration
	// bounds them). Pool refuses a client whose pool would exceed it with
	// an error wrapping ErrTooManyPools. Default 100.
	MaxPools int

	// PoolIdleTimeout closes a wildcard route's pool after this long
	// without a connection lent out and without an Acquire, and removes
	// its metric series; a later client gets a fresh pool. Pools of routes
	// with a named database are kept. Default 10m.
	PoolIdleTimeout time.Duration

	// Metrics, when set, are used instead of a set of the Manager's own,
	// and the registerer passed to NewManager is ignored: a program that
	// replaces its Manager on a configuration reload keeps one set of
	// series across both while the old one finishes its transactions.
	// The caller registers them (NewMetrics).
	Metrics *Metrics
}

// ErrTooManyPools reports that a wildcard route would need a new pool while
// ManagerConfig.MaxPools pools are open. The pooler tells the client
// SQLSTATE 53300.
var ErrTooManyPools = errors.New("backend: too many pools")

// serverKey names one pool: the route it came from and, for wildcard routes,
// the server database and user (empty for routes with a named database).
type serverKey struct {
	route          int
	database, user string
}

// route is a validated Route with its parsed server configuration.
type route struct {
	Route
	pgcfg *pgconn.Config
}

// Manager owns one pool per server (database, user) and finds the pool for a
// client's (database, user) by its routes. Pools of routes with a named
// database are opened at start so their MinPool connections are warm, and
// kept until Close.
//
// Pools of wildcard routes exist for names clients choose, so the Manager
// bounds them: one is created on first use (at most MaxPools at once), its
// background loop starts with its first server connection, and it is
// retired (closed, forgotten and its metric series deleted) when the
// server refuses its first login as naming an unknown database or user
// (SQLSTATE 3D000, 28000, 28P01, 42501) or when it has been unused for
// PoolIdleTimeout. A session still holding a retired pool is not broken:
// the retired pool hands its Acquire calls to the route's current pool. All
// methods are safe for concurrent use.
type Manager struct {
	routes      []route
	logger      *slog.Logger
	metrics     *Metrics
	reg         prometheus.Registerer
	maxPools    int
	idleTimeout time.Duration

	mu      sync.RWMutex
	closed  bool
	pools   map[serverKey]*Pool
	dynamic int // pools of wildcard routes in pools

	// retiring counts pools being closed after retirement; Close waits
	// for them. Add is called under mu while closed is false.
	retiring sync.WaitGroup

	stopReaper context.CancelFunc // nil without wildcard routes
	reaperDone chan struct{}
}

// NewManager validates the routes, registers metrics with reg (nil: not
// registered), opens the pools of routes with a named database and warms
// them in parallel, and starts the goroutine that retires idle wildcard
// pools when there is a wildcard route. Unreachable servers are logged and
// retried in the background; only invalid configuration is an error. A nil
// logger discards logs.
func NewManager(ctx context.Context, cfg ManagerConfig, logger *slog.Logger, reg prometheus.Registerer) (*Manager, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Routes) == 0 {
		return nil, fmt.Errorf("%w: no routes", ErrInvalidConfig)
	}
	switch {
	case cfg.MaxPools < 0:
		return nil, fmt.Errorf("%w: MaxPools %d is negative", ErrInvalidConfig, cfg.MaxPools)
	case cfg.PoolIdleTimeout < 0:
		return nil, fmt.Errorf("%w: PoolIdleTimeout %v is negative", ErrInvalidConfig, cfg.PoolIdleTimeout)
	}
	m := &Manager{
		logger:      logger,
		pools:       make(map[serverKey]*Pool),
		maxPools:    cmp.Or(cfg.MaxPools, DefaultMaxPools),
		idleTimeout: cmp.Or(cfg.PoolIdleTimeout, DefaultPoolIdleTimeout),
	}
	wildcard := false
	for i, r := range cfg.Routes {
		if r.Database == "" {
			return nil, fmt.Errorf("%w: route %d has no database (use %q for any)", ErrInvalidConfig, i, Wildcard)
		}
		if r.User == "" {
			r.User = Wildcard
		}
		pc, err := r.PoolConfig.withDefaults(cfg.Defaults)
		if err != nil {
			return nil, fmt.Errorf("route %d (%s/%s): %w", i, r.Database, r.User, err)
		}
		r.PoolConfig = pc
		pgcfg, err := parseConnString(pc.ConnString)
		if err != nil {
			return nil, fmt.Errorf("route %d (%s/%s): %w", i, r.Database, r.User, err)
		}
		m.routes = append(m.routes, route{Route: r, pgcfg: pgcfg})
		wildcard = wildcard || r.Database == Wildcard
	}
	switch {
	case cfg.Metrics != nil:
		m.metrics = cfg.Metrics
	default:
		m.metrics = newMetrics()
		if reg != nil {
			if err := reg.Register(m.metrics); err != nil {
				return nil, fmt.Errorf("backend: register metrics: %w", err)
			}
			m.reg = reg
		}
	}

	var fixed []*Pool
	for i, r := range m.routes {
		if r.Database == Wildcard {
			continue
		}
		p, err := m.poolFor(serverKey{route: i})
		if err != nil {
			m.Close()
			return nil, err
		}
		fixed = append(fixed, p)
	}
	var wg sync.WaitGroup
	for _, p := range fixed {
		wg.Go(func() { p.warm(ctx) })
	}
	wg.Wait()
	for _, p := range fixed {
		p.start()
	}
	if wildcard {
		rctx, stop := context.WithCancel(context.Background())
		m.stopReaper, m.reaperDone = stop, make(chan struct{})
		go m.reap(rctx)
	}
	return m, nil
}

// Pool returns the pool serving a client's database and user, creating it
// on first use for wildcard routes. The error wraps ErrNoRoute when no route
// matches, ErrTooManyPools when a wildcard route already holds MaxPools
// pools, or ErrPoolClosed after Close. Creating a pool does not wait for
// connections.
func (m *Manager) Pool(ctx context.Context, database, user string) (*Pool, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("backend: pool for %s/%s: %w", database, user, err)
	}
	i := m.match(database, user)
	if i < 0 {
		return nil, fmt.Errorf("backend: database %q user %q: %w", database, user, ErrNoRoute)
	}
	sk := serverKey{route: i}
	if m.routes[i].Database == Wildcard {
		sk.database, sk.user = database, user
	}
	return m.poolFor(sk)
}

// match returns the index of the route serving (database, user), or -1.
func (m *Manager) match(database, user string) int {
	best, bestRank := -1, 5
	for i, r := range m.routes {
		rank := 5
		switch {
		case r.Database == database && r.User == user:
			rank = 1
		case r.Database == database && r.User == Wildcard:
			rank = 2
		case r.Database == Wildcard && r.User == user:
			rank = 3
		case r.Database == Wildcard && r.User == Wildcard:
			rank = 4
		}
		if rank < bestRank {
			best, bestRank = i, rank
		}
	}
	return best
}

// poolFor returns the pool for sk, creating it if needed. A new pool of a
// wildcard route counts against MaxPools and starts its background loop
// with its first connection; a new pool of a named route is not started
// (NewManager warms it first).
func (m *Manager) poolFor(sk serverKey) (*Pool, error) {
	m.mu.RLock()
	p, closed := m.pools[sk], m.closed
	m.mu.RUnlock()
	switch {
	case closed:
		return nil, fmt.Errorf("backend: pool for %s/%s: %w", sk.database, sk.user, ErrPoolClosed)
	case p != nil:
		return p, nil
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("backend: pool for %s/%s: %w", sk.database, sk.user, ErrPoolClosed)
	}
	if p := m.pools[sk]; p != nil {
		return p, nil
	}
	r := m.routes[sk.route]
	dynamic := r.Database == Wildcard
	if dynamic && m.dynamic >= m.maxPools {
		m.metrics.poolRefused()
		return nil, fmt.Errorf("backend: pool for database %q user %q: %w (max_pools %d reached)",
			sk.database, sk.user, ErrTooManyPools, m.maxPools)
	}
	pgcfg := r.pgcfg.Copy()
	if sk.database != "" {
		pgcfg.Database = sk.database
	}
	if sk.user != "" {
		pgcfg.User = sk.user
	}
	pc := r.PoolConfig
	if dynamic {
		// MinPool is for pools an operator configured: a pool created for
		// a name a client chose starts empty and shrinks back to nothing,
		// so no server connection lingers in, say, template1 (which
		// CREATE DATABASE needs unused) or a database being dropped.
		pc.MinPool = 0
	}
	p, err := newPool(pc, pgcfg, m.logger, m.metrics)
	if err != nil {
		return nil, fmt.Errorf("route %d (%s/%s): %w", sk.route, r.Database, r.User, err)
	}
	if dynamic {
		p.mgr, p.key = m, sk
		m.dynamic++
	}
	m.pools[sk] = p
	m.metrics.poolOpened(dynamic)
	return p, nil
}

// Pools returns every pool open now, for stats and tests.
func (m *Manager) Pools() []*Pool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]*Pool, 0, len(m.pools))
	for _, p := range m.pools {
		out = append(out, p)
	}
	return out
}

// Reasons a wildcard pool is retired, used as the "reason" label of
// pgquic_backend_pools_retired_total.
const (
	retireRejected = "login_rejected" // the server refused its first login: unknown database or user
	retireIdle     = "idle"           // unused for PoolIdleTimeout
)

var retireReasons = [...]string{retireRejected, retireIdle}

// loginRejectedCodes are the SQLSTATEs with which a server refuses a login
// because of the database or user named: invalid_catalog_name (the
// database does not exist), invalid_authorization_specification (the role
// does not exist or pg_hba.conf rejects it), invalid_password, and
// insufficient_privilege (no CONNECT privilege).
var loginRejectedCodes = [...]string{pgproto.CodeInvalidCatalogName, pgproto.CodeInvalidAuthSpec,
	pgproto.CodeInvalidPassword, pgproto.CodeInsufficientPrivilege}

// loginRejected reports whether err is a server's refusal of the database
// or user a connection named.
func loginRejected(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && slices.Contains(loginRejectedCodes[:], pe.Code)
}

// retire forgets p and closes it in the background, unless it was retired
// already or the manager is closing (Close then closes it). Later Acquire
// calls on p are handed to the route's current pool (see Pool.acquire).
func (m *Manager) retire(p *Pool, reason string) {
	m.mu.Lock()
	if m.closed || m.pools[p.key] != p {
		m.mu.Unlock()
		return
	}
	delete(m.pools, p.key)
	m.dynamic--
	m.metrics.poolClosed(true)
	p.retired.Store(true)
	m.retiring.Add(1)
	m.mu.Unlock()

	m.logger.Debug("backend: wildcard pool retired", "database", p.database, "user", p.user, "reason", reason)
	go func() {
		defer m.retiring.Done()
		p.Close()
		m.metrics.poolRetired(reason)
	}()
}

// successor returns the pool now serving the route and server key of the
// retired pool p, creating it if needed.
func (m *Manager) successor(p *Pool) (*Pool, error) {
	return m.poolFor(p.key)
}

// reapEvery returns how often the reaper looks for idle pools: a quarter of
// the timeout, so a pool outlives it by at most a quarter, between 10ms and
// 30s.
func (m *Manager) reapEvery() time.Duration {
	return min(max(m.idleTimeout/4, 10*time.Millisecond), 30*time.Second)
}

// reap retires wildcard pools that have been unused for PoolIdleTimeout,
// until ctx ends.
func (m *Manager) reap(ctx context.Context) {
	defer close(m.reaperDone)
	t := time.NewTicker(m.reapEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			m.reapIdle(now)
		}
	}
}

// reapIdle is one round of reap.
func (m *Manager) reapIdle(now time.Time) {
	m.mu.RLock()
	var dynamic []*Pool
	for _, p := range m.pools {
		if p.mgr != nil {
			dynamic = append(dynamic, p)
		}
	}
	m.mu.RUnlock()
	for _, p := range dynamic {
		if p.unusedFor(now) >= m.idleTimeout {
			m.retire(p, retireIdle)
		}
	}
}

// Close closes every pool in parallel (each waits for its checked-out
// connections, see Pool.Close), waits for retired pools to finish closing,
// unregisters the metrics and makes later Pool calls fail with
// ErrPoolClosed. It is safe to call more than once.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	pools := m.pools
	m.pools = map[serverKey]*Pool{}
	m.dynamic = 0
	m.mu.Unlock()

	if m.stopReaper != nil {
		m.stopReaper()
		<-m.reaperDone
	}
	var wg sync.WaitGroup
	for _, p := range pools {
		wg.Go(p.Close)
		m.metrics.poolClosed(p.mgr != nil)
	}
	wg.Wait()
	m.retiring.Wait()
	if m.reg != nil {
		m.reg.Unregister(m.metrics)
	}
}
