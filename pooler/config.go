package pooler

import (
	"errors"
	"fmt"
	"time"

	"github.com/pgquic/pgquic/internal/defaults"
)

// Mode selects how long a client keeps a server connection.
type Mode string

const (
	// ModeTransaction holds a server connection from the first message of a
	// transaction until ReadyForQuery reports idle. It is the default because
	// it lets many clients share few server connections.
	ModeTransaction Mode = "transaction"
	// ModeSession holds one server connection for the client's whole session,
	// for applications that rely on session state (SET, advisory locks,
	// LISTEN, SQL-level PREPARE).
	ModeSession Mode = "session"
)

// RoleChangePolicy says what transaction mode does with SET ROLE, SET
// SESSION AUTHORIZATION, their RESETs and SET SESSION CHARACTERISTICS sent
// outside a transaction block, whose effect would otherwise outlive the
// transaction and reach other clients of the server connection.
type RoleChangePolicy string

const (
	// RoleChangesRefuse answers such statements with SQLSTATE 0A000, so a
	// client cannot hold a server connection for its whole session by
	// changing its role. It is the default.
	RoleChangesRefuse RoleChangePolicy = "refuse"
	// RoleChangesPin runs them and keeps the client on that server
	// connection until it disconnects, as session mode would; the connection
	// is then reset before it is lent again.
	RoleChangesPin RoleChangePolicy = "pin"
)

// SessionStatePolicy says what transaction mode does with statements that
// create session state the pooler cannot move to another server
// connection: temporary tables, LISTEN, session advisory locks, cursors
// WITH HOLD and SQL-level PREPARE (see pin.go).
type SessionStatePolicy string

const (
	// SessionStatePin runs them and keeps the client on its server
	// connection until it disconnects or the server holds no such state
	// any more (after DISCARD ALL, say). It is the default.
	SessionStatePin SessionStatePolicy = "pin"
	// SessionStateError answers them, outside a transaction block, with
	// SQLSTATE 0A000, for operators who prefer an error to a client that
	// holds a server connection for its whole session.
	SessionStateError SessionStatePolicy = "error"
)

// Config tunes the pooling state machine. The zero value of every field means
// its documented default; call Validate (New does) before use.
type Config struct {
	// Mode is the pooling mode. Default: ModeTransaction.
	Mode Mode

	// MaxClients bounds concurrent client sessions across all fronts; the next
	// client is refused with SQLSTATE 53300. Default: 10000.
	MaxClients int

	// MaxMessageLen bounds one client message body in bytes; a longer message
	// ends the session with SQLSTATE 08P01. Default: 64 MiB.
	MaxMessageLen int

	// StartupTimeout bounds the time from the first byte of a session to the
	// end of authentication (PostgreSQL's authentication_timeout). A client
	// that sends nothing is closed when it expires. Default: 15s.
	StartupTimeout time.Duration

	// AcquireTimeout bounds how long a client waits for a server connection
	// when the pool is exhausted (PgBouncer's query_wait_timeout). The client
	// then gets SQLSTATE 53300 saying so. Default: 30s.
	AcquireTimeout time.Duration

	// IdleTransactionTimeout ends a session whose client has left a
	// transaction open and sent nothing for this long, since it holds a
	// server connection (and its locks) meanwhile: the client gets
	// PostgreSQL's FATAL 25P03 and the transaction is rolled back
	// (PgBouncer's idle_transaction_timeout, PostgreSQL's
	// idle_in_transaction_session_timeout). Zero disables it, the default.
	IdleTransactionTimeout time.Duration

	// ClientIdleTimeout ends a session whose client has sent nothing for
	// this long outside a transaction, with PostgreSQL's FATAL 57P05
	// (PgBouncer's client_idle_timeout, PostgreSQL's idle_session_timeout).
	// Zero disables it, the default.
	ClientIdleTimeout time.Duration

	// QueryTimeout cancels a request (a Query, or the messages up to Sync)
	// the server has not answered within this long, with a CancelRequest as
	// a client's own cancel would: the client gets the server's 57014 and
	// its session goes on (PgBouncer's query_timeout, which also drops the
	// client; PostgreSQL's statement_timeout). Zero disables it, the default.
	QueryTimeout time.Duration

	// PipelineDepth bounds the client requests written at once on one
	// server connection in transaction mode (cross-client pipelining, see
	// pipeline.go): when every connection of a pool is busy, a client's
	// complete implicit transaction may be written behind up to
	// PipelineDepth-1 others instead of waiting. 1 turns pipelining off.
	// Default: 16.
	PipelineDepth int

	// PipelineFastThreshold is how quickly the server must have answered
	// every recent query of a kind (by lexer fingerprint, which leaves
	// constants out: the worst recent time counts, not the mean) before
	// another client's request is written behind one, so a slow query holds
	// up no one but its own client. A request running longer than this marks
	// its kind slow at once. Default: 5ms.
	PipelineFastThreshold time.Duration

	// PipelineBusyOnly is what --pipeline-when busy set. A request is now
	// written behind others only when the pool is full and every server
	// connection of it is busy, whatever this says: an idle connection, or
	// room to open one, is always taken first, so a slow query never holds
	// up a request that had a connection to itself. It is kept so that
	// configurations setting it still load.
	PipelineBusyOnly bool

	// StatementCacheSize bounds the prepared statements the pooler keeps on
	// each server connection in transaction mode; the least recently used
	// one is closed beyond it (PgBouncer's max_prepared_statements).
	// Default: 256.
	StatementCacheSize int

	// ClientStatementLimit bounds the named prepared statements one client may
	// hold in transaction mode, so one client cannot grow pooler memory
	// without bound. Exceeding it fails the Parse with SQLSTATE 53400.
	// Default: 10000.
	ClientStatementLimit int

	// ClientStatementBytes bounds the total size of the named prepared
	// statements (query text and names) one client may hold in transaction
	// mode, since a few huge statements cost as much as many small ones.
	// Exceeding it fails the Parse with SQLSTATE 53400. Default: 16 MiB.
	ClientStatementBytes int

	// RoleChanges says what transaction mode does with identity changes
	// outside a transaction block (see RoleChangePolicy). Inside a block
	// they are always allowed and undone before the connection is lent
	// again. Default: RoleChangesRefuse.
	RoleChanges RoleChangePolicy

	// SessionState says what transaction mode does with statements that
	// create session state it cannot move (see SessionStatePolicy).
	// Inside a transaction block they always run and pin the client.
	// Default: SessionStatePin.
	SessionState SessionStatePolicy

	// CatalogRefresh is how often, in transaction mode, the pooler reads
	// each database's catalog again for the relations, types and operators
	// whose use runs code the query text does not show (triggers, rules,
	// views, defaults calling user functions; see catalog.go). DDL sent
	// through the pooler is noticed at once; DDL run past it is noticed
	// within this time. Default: 5s.
	CatalogRefresh time.Duration

	// ResetQuery runs on a server connection before it goes back to the pool
	// after a session-mode client leaves. Default: "DISCARD ALL".
	ResetQuery string

	// Auth authenticates clients. Default: trust every client, which is only
	// suitable for loopback development.
	Auth Authenticator

	// EdgeTrust lists the QUIC client certificates trusted as edges: a
	// session whose Peer.ClientCerts it trusts for the user and
	// database asked for starts without Auth's exchange, one outside the
	// edge's set is refused with 28000 (see edgeLogin). Default nil: no
	// certificate is trusted and every session goes through Auth.
	EdgeTrust EdgeTrust

	// ZeroRTT says which sessions may run a request received before the
	// transport's handshake was confirmed (0-RTT data, which may be a
	// replay) inside a READ ONLY transaction; see zerortt.go. It is asked
	// at each such request, so a configuration reload applies at once.
	// Default nil: every such request waits for the confirmation.
	ZeroRTT ZeroRTTPolicy

	// ServerVersion, when set, is reported to clients in place of the
	// server's own server_version parameter. Default: the server's value.
	ServerVersion string

	// MaxStartingClients bounds the sessions, across all fronts, that have
	// not finished authenticating: a session counts from its first read
	// until its client has authenticated, or until it ends. A session beyond
	// the bound is refused at once with SQLSTATE 53300, before anything is
	// read from it, so clients that connect and stall cannot pile up.
	// Default: 2000.
	MaxStartingClients int

	// MaxStartingPerSource is MaxStartingClients for one source, as
	// front.Source keys Peer.Addr: an IPv4 address, or an IPv6 address's
	// /64 (a host may use any address of its /64), so one host cannot take
	// every startup slot; sessions whose Peer.Addr is nil count as one
	// source.
	// An edge sidecar that opens many sessions at once is one source: raise
	// this bound if its bursts of logins are refused. Default: 500.
	MaxStartingPerSource int
}

// Validate checks the configuration and fills in defaults (from
// internal/defaults, which the configuration file and the fronts share).
func (c *Config) Validate() error {
	switch c.Mode {
	case "":
		c.Mode = defaults.Mode
	case ModeTransaction, ModeSession:
	default:
		return fmt.Errorf("pooler: unknown mode %q (want transaction or session)", c.Mode)
	}
	switch c.RoleChanges {
	case "":
		c.RoleChanges = defaults.RoleChanges
	case RoleChangesRefuse, RoleChangesPin:
	default:
		return fmt.Errorf("pooler: unknown role change policy %q (want refuse or pin)", c.RoleChanges)
	}
	switch c.SessionState {
	case "":
		c.SessionState = defaults.SessionState
	case SessionStatePin, SessionStateError:
	default:
		return fmt.Errorf("pooler: unknown session state policy %q (want pin or error)", c.SessionState)
	}
	if c.MaxClients < 0 || c.MaxMessageLen < 0 || c.StatementCacheSize < 0 || c.ClientStatementLimit < 0 || c.ClientStatementBytes < 0 {
		return errors.New("pooler: limits must not be negative")
	}
	if c.StartupTimeout < 0 || c.AcquireTimeout < 0 || c.IdleTransactionTimeout < 0 || c.ClientIdleTimeout < 0 || c.QueryTimeout < 0 || c.CatalogRefresh < 0 {
		return errors.New("pooler: timeouts must not be negative")
	}
	if c.MaxClients == 0 {
		c.MaxClients = defaults.MaxClients
	}
	if c.MaxMessageLen == 0 {
		c.MaxMessageLen = defaults.MaxMessageLen
	}
	if c.StartupTimeout == 0 {
		c.StartupTimeout = defaults.StartupTimeout
	}
	if c.AcquireTimeout == 0 {
		c.AcquireTimeout = defaults.AcquireTimeout
	}
	if c.CatalogRefresh == 0 {
		c.CatalogRefresh = defaults.CatalogRefresh
	}
	if c.StatementCacheSize == 0 {
		c.StatementCacheSize = defaults.StatementCacheSize
	}
	if c.ClientStatementLimit == 0 {
		c.ClientStatementLimit = defaults.ClientStatementLimit
	}
	if c.ClientStatementBytes == 0 {
		c.ClientStatementBytes = defaults.ClientStatementBytes
	}
	if c.ResetQuery == "" {
		c.ResetQuery = defaults.ResetQuery
	}
	if c.PipelineDepth < 0 || c.PipelineFastThreshold < 0 {
		return errors.New("pooler: pipeline depth and threshold must not be negative")
	}
	if c.PipelineDepth == 0 {
		c.PipelineDepth = defaults.PipelineDepth
	}
	if c.PipelineFastThreshold == 0 {
		c.PipelineFastThreshold = defaults.PipelineFastThreshold
	}
	if c.MaxStartingClients < 0 || c.MaxStartingPerSource < 0 {
		return errors.New("pooler: limits must not be negative")
	}
	if c.MaxStartingClients == 0 {
		c.MaxStartingClients = defaults.MaxStartingClients
	}
	if c.MaxStartingPerSource == 0 {
		c.MaxStartingPerSource = defaults.MaxStartingPerSource
	}
	return nil
}
