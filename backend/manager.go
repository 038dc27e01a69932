package backend

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
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
// and everything else from ConnString.
type Route struct {
	// Database is the database name clients ask for; "*" matches any.
	Database string
	// User is the client user; "" or "*" matches any.
	User string
	// PoolConfig says how to reach the server; zero fields take
	// ManagerConfig.Defaults, then the package defaults.
	PoolConfig
}

// ManagerConfig lists the routes of a Manager.
type ManagerConfig struct {
	// Routes are matched as described on Route. At least one is required.
	Routes []Route
	// Defaults supplies PoolSize, MinPool, timeouts (and ConnString, when a
	// route has none) to routes that leave them zero.
	Defaults PoolConfig
}

// poolKey names a client-side (database, user) pair.
type poolKey struct{ database, user string }

// serverKey names one pool: the route it came from and, for wildcard routes,
// the server database and user.
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
// database are opened at start so their MinPool connections are warm; pools
// of wildcard routes are created on first use. All methods are safe for
// concurrent use.
type Manager struct {
	routes  []route
	logger  *slog.Logger
	metrics *Metrics
	reg     prometheus.Registerer

	mu       sync.RWMutex
	closed   bool
	byClient map[poolKey]*Pool
	byServer map[serverKey]*Pool
	pools    []*Pool
}

// NewManager validates the routes, registers metrics with reg (nil: not
// registered), opens the pools of routes with a named database and warms
// them in parallel. Unreachable servers are logged and retried in the
// background; only invalid configuration is an error. A nil logger discards
// logs.
func NewManager(ctx context.Context, cfg ManagerConfig, logger *slog.Logger, reg prometheus.Registerer) (*Manager, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Routes) == 0 {
		return nil, fmt.Errorf("%w: no routes", ErrInvalidConfig)
	}
	m := &Manager{
		logger:   logger,
		byClient: make(map[poolKey]*Pool),
		byServer: make(map[serverKey]*Pool),
	}
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
	}
	m.metrics = newMetrics()
	if reg != nil {
		if err := reg.Register(m.metrics); err != nil {
			return nil, fmt.Errorf("backend: register metrics: %w", err)
		}
		m.reg = reg
	}

	var fixed []*Pool
	for i, r := range m.routes {
		if r.Database == Wildcard {
			continue
		}
		p, err := m.poolFor(i, "", "", false)
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
	return m, nil
}

// Pool returns the pool serving a client's database and user, creating it
// on first use for wildcard routes. The error wraps ErrNoRoute when no route
// matches, or ErrPoolClosed after Close. ctx is accepted for symmetry with
// other blocking calls; creating a pool does not wait for connections.
func (m *Manager) Pool(ctx context.Context, database, user string) (*Pool, error) {
	k := poolKey{database, user}
	m.mu.RLock()
	p, ok := m.byClient[k]
	closed := m.closed
	m.mu.RUnlock()
	if ok {
		return p, nil
	}
	if closed {
		return nil, fmt.Errorf("backend: pool for %s/%s: %w", database, user, ErrPoolClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("backend: pool for %s/%s: %w", database, user, err)
	}

	i := m.match(database, user)
	if i < 0 {
		return nil, fmt.Errorf("backend: database %q user %q: %w", database, user, ErrNoRoute)
	}
	var sdb, suser string
	if m.routes[i].Database == Wildcard {
		sdb, suser = database, user
	}
	p, err := m.poolFor(i, sdb, suser, true)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("backend: pool for %s/%s: %w", database, user, ErrPoolClosed)
	}
	m.byClient[k] = p
	return p, nil
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

// poolFor returns the pool of route i for the server database and user
// (empty for routes with a named database: the ConnString decides), creating
// it if needed. start says whether to start its background loop now.
func (m *Manager) poolFor(i int, database, user string, start bool) (*Pool, error) {
	sk := serverKey{route: i, database: database, user: user}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("backend: pool for %s/%s: %w", database, user, ErrPoolClosed)
	}
	if p, ok := m.byServer[sk]; ok {
		return p, nil
	}
	r := m.routes[i]
	pgcfg := r.pgcfg.Copy()
	if database != "" {
		pgcfg.Database = database
	}
	if user != "" {
		pgcfg.User = user
	}
	p, err := newPool(r.PoolConfig, pgcfg, m.logger, m.metrics)
	if err != nil {
		return nil, fmt.Errorf("route %d (%s/%s): %w", i, r.Database, r.User, err)
	}
	if start {
		p.start()
	}
	m.byServer[sk] = p
	m.pools = append(m.pools, p)
	return p, nil
}

// Pools returns every pool created so far, for stats and shutdown.
func (m *Manager) Pools() []*Pool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return append([]*Pool(nil), m.pools...)
}

// Close closes every pool in parallel (each waits for its checked-out
// connections, see Pool.Close), unregisters the metrics and makes later Pool
// calls fail with ErrPoolClosed. It is safe to call more than once.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	pools := m.pools
	m.pools = nil
	m.byClient = map[poolKey]*Pool{}
	m.byServer = map[serverKey]*Pool{}
	m.mu.Unlock()

	var wg sync.WaitGroup
	for _, p := range pools {
		wg.Go(p.Close)
	}
	wg.Wait()
	if m.reg != nil {
		m.reg.Unregister(m.metrics)
	}
}
