// Package defaults holds the default values that more than one part of
// pgquic applies, so each is written down once: the configuration file
// (config), the pooler, the backend pools, the TCP and QUIC fronts and the
// QUIC client all fill their zero fields from here. A default that only one
// package applies stays in that package. It imports only the standard
// library, so the QUIC client package can use it.
package defaults

import "time"

// Clients and the pooler.
const (
	// MaxClients bounds concurrent client sessions; the TCP front's
	// connection limit and the QUIC front's stream limit default to it too,
	// so neither front holds more sessions than the pooler admits.
	MaxClients = 10000
	// MaxStartingClients bounds the sessions that have not finished
	// authenticating, across all fronts.
	MaxStartingClients = 2000
	// MaxStartingPerSource bounds those sessions per client IP address.
	MaxStartingPerSource = 500
	// MaxMessageLen bounds one client message body in bytes. PostgreSQL
	// itself refuses most messages above 1 GB; a pooler facing untrusted
	// clients wants a much smaller bound so one client cannot exhaust memory.
	MaxMessageLen = 64 << 20
	// StartupTimeout bounds a session's startup and authentication.
	StartupTimeout = 15 * time.Second
	// AcquireTimeout bounds a client's wait for a server connection.
	AcquireTimeout = 30 * time.Second
	// StatementCacheSize bounds the prepared statements kept per server
	// connection in transaction mode.
	StatementCacheSize = 256
	// ClientStatementLimit bounds the named prepared statements one client
	// may hold in transaction mode.
	ClientStatementLimit = 10000
	// ClientStatementBytes bounds their total size.
	ClientStatementBytes = 16 << 20
	// Mode is the pooling mode.
	Mode = "transaction"
	// RoleChanges is what transaction mode does with SET ROLE and its kin
	// outside a transaction block.
	RoleChanges = "refuse"
	// SessionState is what transaction mode does with statements creating
	// session state it cannot move (temporary tables, LISTEN, session
	// advisory locks, WITH HOLD cursors, SQL PREPARE) outside a block.
	SessionState = "pin"
	// PipelineDepth bounds the client requests written at once on one
	// server connection (cross-client pipelining); 1 turns it off.
	PipelineDepth = 16
	// CatalogRefresh is how often transaction mode reads a database's
	// catalog again for code hidden behind names (pooler/catalog.go).
	CatalogRefresh = 5 * time.Second
	// PipelineFastThreshold is the average answer time under which a kind
	// of query may have other clients' requests written behind it.
	PipelineFastThreshold = 5 * time.Millisecond
	// ResetQuery resets a server connection a session-mode client leaves.
	ResetQuery = "DISCARD ALL"
)

// Server connections and their pools.
const (
	// PoolSize bounds the server connections of one pool; PostgreSQL's
	// default max_connections is 100, so a handful of pools fit under it.
	PoolSize = 20
	// ServerConnectTimeout bounds dialing plus authentication of one server
	// connection.
	ServerConnectTimeout = 5 * time.Second
	// ServerLifetime is how long a server connection may live before it is
	// replaced, which bounds server-side memory growth (catalog and plan
	// caches) of long-lived backends.
	ServerLifetime = time.Hour
	// ServerIdleTimeout is how long a surplus server connection may idle.
	ServerIdleTimeout = 10 * time.Minute
	// MaxPools bounds the pools wildcard routes create on demand.
	MaxPools = 100
	// PoolIdleTimeout retires a wildcard pool left unused this long. It
	// matches ServerIdleTimeout: by then a quiet pool has shrunk anyway.
	PoolIdleTimeout = ServerIdleTimeout
)

// The QUIC front and the QUIC client.
const (
	// QUICMaxConns bounds the QUIC connections a server accepts.
	QUICMaxConns = 1000
	// QUICMaxStreamsPerConn is the stream credit a server grants each
	// connection, and the soft cap of streams a client opens on one
	// connection before it prefers another. Clients multiplex hundreds of
	// sessions per connection; quic-go's own default of 100 would make them
	// queue.
	QUICMaxStreamsPerConn = 1000
	// QUICStreamStartupTimeout bounds how long a new stream may take to
	// deliver its startup packet.
	QUICStreamStartupTimeout = 10 * time.Second
	// QUICIdleTimeout is quic MaxIdleTimeout: a connection without any packet
	// for this long is dead.
	QUICIdleTimeout = 60 * time.Second
	// QUICKeepAlivePeriod sends a keep-alive on a quiet connection, well
	// under QUICIdleTimeout and under typical UDP NAT timeouts.
	QUICKeepAlivePeriod = 15 * time.Second
	// DialerConns is how many QUIC connections a client keeps to a pooler.
	DialerConns = 4
	// EdgeStartupTimeout bounds how long a local client of the edge sidecar
	// may take to send its startup packet.
	EdgeStartupTimeout = 10 * time.Second
)
