package backend

import (
	"errors"
	"fmt"
	"time"

	"github.com/pgquic/pgquic/internal/defaults"
)

// Defaults applied by PoolConfig when a field is left at its zero value.
const (
	// DefaultPoolSize is the default maximum number of server connections
	// per pool; PostgreSQL's default max_connections is 100, so a handful of
	// pools fit under it.
	DefaultPoolSize = defaults.PoolSize
	// DefaultConnectTimeout bounds dialing plus authentication of one server
	// connection.
	DefaultConnectTimeout = defaults.ServerConnectTimeout
	// DefaultServerLifetime is how long a server connection may live before
	// it is replaced the next time it is idle, which bounds server-side
	// memory growth (catalog caches, plan caches) of long-lived backends.
	DefaultServerLifetime = defaults.ServerLifetime
	// DefaultServerIdleTimeout is how long a surplus connection (above
	// MinPool) may sit idle before it is closed.
	DefaultServerIdleTimeout = defaults.ServerIdleTimeout
	// DefaultHealthCheckAfter is the idle time after which Acquire checks a
	// connection with a round trip before handing it out.
	DefaultHealthCheckAfter = 30 * time.Second
)

// PoolConfig describes one pool of server connections. Every field's zero
// value means "use the default" stated on the field, so a literal with only
// ConnString set is a complete configuration.
type PoolConfig struct {
	// ConnString is a postgres:// URL or a keyword/value string, parsed by
	// pgconn.ParseConfig. It names host(s), port, dbname, user, password,
	// sslmode and runtime parameters sent in the StartupMessage. Required.
	ConnString string

	// PoolSize is the maximum number of server connections. Default 20.
	PoolSize int

	// MinPool is the number of connections opened at start and kept open
	// (recreated in the background when lost). Default 0. Pools of
	// wildcard-database routes ignore it (see Route).
	MinPool int

	// ConnectTimeout bounds one dial plus authentication. Default 5s.
	ConnectTimeout time.Duration

	// ServerLifetime closes a connection older than this when it is idle or
	// released. Default 1h.
	ServerLifetime time.Duration

	// ServerIdleTimeout closes connections idle longer than this while the
	// pool holds more than MinPool (PgBouncer's server_idle_timeout, with
	// its default). Default 10m.
	ServerIdleTimeout time.Duration

	// HealthCheckAfter makes Acquire run a round-trip check (an empty Query)
	// on a connection idle longer than this. Default 30s.
	HealthCheckAfter time.Duration
}

// ErrInvalidConfig is wrapped by every validation error so callers can tell a
// configuration mistake from a connection failure.
var ErrInvalidConfig = errors.New("backend: invalid pool config")

// withDefaults fills zero fields from d (a route's defaults), then from the
// package defaults, and validates the result.
func (c PoolConfig) withDefaults(d PoolConfig) (PoolConfig, error) {
	if c.PoolSize == 0 {
		c.PoolSize = d.PoolSize
	}
	if c.MinPool == 0 {
		c.MinPool = d.MinPool
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.ServerLifetime == 0 {
		c.ServerLifetime = d.ServerLifetime
	}
	if c.ServerIdleTimeout == 0 {
		c.ServerIdleTimeout = d.ServerIdleTimeout
	}
	if c.HealthCheckAfter == 0 {
		c.HealthCheckAfter = d.HealthCheckAfter
	}
	if c.ConnString == "" {
		c.ConnString = d.ConnString
	}
	return c.populate()
}

// populate validates c and fills the package defaults.
func (c PoolConfig) populate() (PoolConfig, error) {
	switch {
	case c.PoolSize < 0:
		return c, fmt.Errorf("%w: PoolSize %d is negative", ErrInvalidConfig, c.PoolSize)
	case c.MinPool < 0:
		return c, fmt.Errorf("%w: MinPool %d is negative", ErrInvalidConfig, c.MinPool)
	case c.ConnectTimeout < 0, c.ServerLifetime < 0, c.ServerIdleTimeout < 0, c.HealthCheckAfter < 0:
		return c, fmt.Errorf("%w: durations must not be negative", ErrInvalidConfig)
	}
	if c.PoolSize == 0 {
		c.PoolSize = DefaultPoolSize
	}
	if c.MinPool > c.PoolSize {
		return c, fmt.Errorf("%w: MinPool %d exceeds PoolSize %d", ErrInvalidConfig, c.MinPool, c.PoolSize)
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.ServerLifetime == 0 {
		c.ServerLifetime = DefaultServerLifetime
	}
	if c.ServerIdleTimeout == 0 {
		c.ServerIdleTimeout = DefaultServerIdleTimeout
	}
	if c.HealthCheckAfter == 0 {
		c.HealthCheckAfter = DefaultHealthCheckAfter
	}
	return c, nil
}
