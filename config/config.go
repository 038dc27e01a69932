// Package config reads the pgquic server's YAML configuration file.
//
// One Config struct holds everything `pgquic serve` can be told. Each field's
// doc comment states its default. Loading follows three steps: decode
// strictly (an unknown key is an error, so a typo never silently falls back
// to a default), fill in defaults, then validate every field and report all
// problems at once. The package knows nothing about the packages that consume
// the values; cmd/pgquic translates a Config into their configurations.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gopkg.in/yaml.v3"

	"github.com/pgquic/pgquic/internal/defaults"
	"github.com/pgquic/pgquic/internal/pgproto"
)

// Default values. They are exported so that flag help texts and tests can
// quote them instead of repeating literals. Those the pooler, the backend
// pools and the fronts apply as well come from internal/defaults (the ALPN
// from internal/pgproto), so each is written down once.
const (
	DefaultTCPListen             = "127.0.0.1:6432"
	DefaultQUICListen            = "127.0.0.1:6432"
	DefaultMetricsListen         = "127.0.0.1:9187"
	DefaultMode                  = defaults.Mode
	DefaultRoleChanges           = defaults.RoleChanges
	DefaultSessionState          = defaults.SessionState
	DefaultClientStatementBytes  = defaults.ClientStatementBytes
	DefaultPoolSize              = defaults.PoolSize
	DefaultMinPool               = 2
	DefaultMaxPools              = defaults.MaxPools
	DefaultPoolIdleTimeout       = defaults.PoolIdleTimeout
	DefaultMaxClientConn         = defaults.MaxClients
	DefaultMaxStartingClients    = defaults.MaxStartingClients
	DefaultMaxStartingPerSource  = defaults.MaxStartingPerSource
	DefaultALPN                  = pgproto.ALPN
	DefaultQUICMaxStreams        = defaults.QUICMaxStreamsPerConn
	DefaultAuthMethod            = "trust"
	DefaultStartupTimeout        = defaults.StartupTimeout
	DefaultAcquireTimeout        = defaults.AcquireTimeout
	DefaultServerLifetime        = defaults.ServerLifetime
	DefaultServerIdleTimeout     = defaults.ServerIdleTimeout
	DefaultServerConnectTimeout  = defaults.ServerConnectTimeout
	DefaultStatementCacheSize    = defaults.StatementCacheSize
	DefaultPipelineDepth         = defaults.PipelineDepth
	DefaultPipelineWhen          = "fast"
	DefaultPipelineFastThreshold = defaults.PipelineFastThreshold
	DefaultCatalogRefresh        = defaults.CatalogRefresh
	DefaultMaxMessageBytes       = defaults.MaxMessageLen
	DefaultShutdownGrace         = 30 * time.Second
	DefaultLogLevel              = "info"
	DefaultLogFormat             = "text"
)

// Config is the whole pgquic server configuration. The zero value of a field
// means its default, except where a field's comment says that empty or zero
// is meaningful; those fields get their defaults from Default, which Parse
// and Load start from, so a file that omits them keeps the default and a file
// that sets them empty keeps that.
type Config struct {
	// TCPListen is the address of the plain TCP front (TLS via SSLRequest).
	// Empty disables the TCP front. Default: "127.0.0.1:6432".
	TCPListen string `yaml:"tcp_listen"`

	// QUICListen is the UDP address of the QUIC front. Empty disables the
	// QUIC front. It may share its port number with TCPListen, since one is
	// TCP and the other UDP. Default: "127.0.0.1:6432".
	QUICListen string `yaml:"quic_listen"`

	// MetricsListen is the address of the HTTP server exposing Prometheus
	// metrics at /metrics. Empty disables it. Default: "127.0.0.1:9187".
	MetricsListen string `yaml:"metrics_listen"`

	// Backend is a PostgreSQL URL used for every database and user that no
	// entry in Databases matches: the client's database and user replace
	// the URL's. Default: none; with neither Backend nor Databases set,
	// `pgquic serve` starts a throwaway PostgreSQL for development.
	Backend string `yaml:"backend"`

	// Mode is the pooling mode, "transaction" or "session".
	// Default: "transaction".
	Mode string `yaml:"mode"`

	// ZeroRTT says what the pooler does with requests a resumed QUIC
	// client sent in 0-RTT, before its handshake is confirmed, data an
	// attacker may have captured and replayed: "off" (nothing runs until
	// the handshake is confirmed, and the QUIC front refuses 0-RTT unless
	// a Databases entry allows it) or "read-only" (in transaction mode, a
	// request that is one plain statement runs at once inside a READ ONLY
	// transaction; everything else waits for the confirmation). A
	// Databases entry may override it. Default: "off".
	ZeroRTT string `yaml:"zero_rtt"`

	// RoleChanges says what transaction mode does with SET ROLE, SET
	// SESSION AUTHORIZATION, their RESETs and SET SESSION CHARACTERISTICS
	// outside a transaction block: "refuse" (SQLSTATE 0A000) or "pin" (the
	// client keeps its server connection until it disconnects).
	// Default: "refuse".
	RoleChanges string `yaml:"role_changes"`

	// SessionState says what transaction mode does with statements that
	// create session state it cannot move to another server connection
	// (temporary tables, LISTEN, session advisory locks, WITH HOLD
	// cursors, SQL PREPARE): "pin" (the client keeps its server connection
	// until it disconnects or the state is gone, e.g. after DISCARD ALL)
	// or "error" (SQLSTATE 0A000 outside a transaction block).
	// Default: "pin".
	SessionState string `yaml:"session_state"`

	// ClientStatementBytes bounds the bytes of named prepared statements
	// one client may hold in transaction mode. Default: 16 MiB.
	ClientStatementBytes int `yaml:"client_statement_bytes"`

	// PoolSize bounds the server connections of each pool (one pool per
	// database and user). Default: 20.
	PoolSize int `yaml:"pool_size"`

	// MinPool is the number of server connections each pool of a
	// Databases entry keeps open even when idle. Zero is meaningful (no
	// warm connections). Pools of the wildcard route (Backend) ignore it:
	// they start empty and drain after ServerIdleTimeout.
	// Default: 2, lowered to PoolSize when that is smaller; a min_pool the
	// user set above pool_size is an error instead.
	MinPool int `yaml:"min_pool"`

	// MaxPools bounds the pools the wildcard route (Backend) holds at once.
	// Clients name the database and user of such a pool, so each distinct
	// pair would otherwise add a pool, its goroutine and its metric series
	// without limit; a client that would exceed the bound gets SQLSTATE
	// 53300. Pools of Databases entries are not counted. Default: 100.
	MaxPools int `yaml:"max_pools"`

	// PoolIdleTimeout closes a wildcard-route pool that has had no server
	// connection lent out and no client asking for one for this long, and
	// deletes its metric series. Pools of Databases entries are kept.
	// Default: 10m.
	PoolIdleTimeout time.Duration `yaml:"pool_idle_timeout"`

	// MaxClientConn bounds concurrent client sessions across both fronts;
	// beyond it clients get SQLSTATE 53300. Default: 10000.
	MaxClientConn int `yaml:"max_client_conn"`

	// MaxStartingClients bounds the client sessions, across both fronts,
	// that have not finished authenticating; beyond it a new session gets
	// SQLSTATE 53300 before anything is read from it. Default: 1000.
	MaxStartingClients int `yaml:"max_starting_clients"`

	// MaxStartingPerSource is MaxStartingClients for one client IP address,
	// an IPv6 client counted by its /64.
	// An edge sidecar is one source: raise it if the sidecar's bursts of
	// logins are refused. Default: 100.
	MaxStartingPerSource int `yaml:"max_starting_per_source"`

	// TLSCert and TLSKey are PEM files of the server certificate and its
	// key, used by the TCP front (after SSLRequest) and the QUIC front. Set
	// both or neither. Without them the TCP front answers SSLRequest with
	// 'N' and the QUIC front generates a self-signed certificate at start
	// and logs its SHA-256 fingerprint. Default: none.
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`

	// RequireTLS refuses TCP clients that do not switch to TLS
	// (SQLSTATE 28000). QUIC is always encrypted. Needs TLSCert.
	// Default: false.
	RequireTLS bool `yaml:"require_tls"`

	// TLSSessionTicketKeysFile holds the keys that encrypt TLS session
	// tickets, for the TCP front and QUIC alike: one secret per line (at
	// least 32 characters, e.g. `openssl rand -hex 32`), the first encrypts
	// new tickets and every line decrypts, so a key is rotated by adding a
	// line on top and dropping the last one later. Replicas behind one
	// address share the file so a client resumes its TLS session on any of
	// them. Needs TLSCert. The file is read again at every reload, which
	// rotates the keys without a restart. Default: none (each process
	// makes its own keys, so resumption works only against the replica
	// that issued the ticket).
	TLSSessionTicketKeysFile string `yaml:"tls_session_ticket_keys_file"`

	// QUICStatelessResetKeyFile holds the secret (at least 32 bytes, e.g.
	// `openssl rand -hex 32`) the QUIC front keys its stateless resets with.
	// Replicas behind one address share it, so when one goes away the next
	// packet its clients send reaches another that resets the connection
	// at once instead of letting the client wait for its idle timeout.
	// Default: none (the key is derived from the TLS private key, which
	// replicas sharing a certificate already share).
	QUICStatelessResetKeyFile string `yaml:"quic_stateless_reset_key_file"`

	// QUICServerID, 1 to 65535, is this replica's ID in the QUIC
	// connection IDs it issues (after the QUIC-LB draft's plaintext
	// mode), so a load balancer that routes by connection ID keeps a
	// connection on its replica when the client's address changes (NAT
	// rebinding, a client moving networks); give every replica behind one
	// address its own. The ID is visible on the path. Default: 0 (random
	// connection IDs, as a balancer hashing the 4-tuple needs nothing else).
	QUICServerID int `yaml:"quic_server_id"`

	// ALPN is the protocol name negotiated on QUIC connections.
	// Default: "pgquic/1".
	ALPN string `yaml:"alpn"`

	// QUICMaxConns bounds concurrent QUIC connections. Zero means the QUIC
	// front's own default. Default: 0.
	QUICMaxConns int `yaml:"quic_max_conns"`

	// QUICMaxConnsPerSource bounds the concurrent QUIC connections of one
	// client source (an IPv4 address, an IPv6 /64), so one client cannot
	// hold every quic_max_conns slot. Behind a UDP load balancer that
	// hides client addresses every client is one source: raise it to
	// quic_max_conns there. Zero means the QUIC front's own default, a
	// quarter of quic_max_conns (250 with its default). Default: 0.
	QUICMaxConnsPerSource int `yaml:"quic_max_conns_per_source"`

	// QUICMaxStreams bounds the concurrent streams (sessions) of one QUIC
	// connection. The QUIC front refuses values below 1000, since clients
	// multiplex hundreds of sessions per connection. Default: 1000.
	QUICMaxStreams int `yaml:"quic_max_streams"`

	// Auth selects how clients authenticate to the pooler.
	Auth Auth `yaml:"auth"`

	// EdgeTrust is a file of trusted edges, one per line:
	// `SHA256-FINGERPRINT USERS DATABASES`, or `ca=FILE subject=PATTERN
	// USERS DATABASES` (and/or cn=PATTERN) for a certificate whose chain
	// verifies against the CA file and whose subject matches (comma
	// lists, "*" for any; see pgauth.ParseEdgeTrust). A QUIC client
	// presenting a trusted certificate may open sessions for those users
	// and databases without a password exchange (the edge authenticated
	// its local clients itself); other users or databases get 28000. A
	// certificate no line trusts asserts nothing. Read again, with its CA
	// files, at every reload. Default: none, no certificate is trusted.
	EdgeTrust string `yaml:"edge_trust"`

	// AdminUsers may use the admin console, the virtual databases "pgquic"
	// and "pgbouncer" (SHOW POOLS, PAUSE...), after authenticating like any
	// client. A YAML list or, as in PgBouncer's admin_users, one
	// comma-separated string. Other users are refused the console with
	// PgBouncer's FATAL 08P01 "not allowed". Default: none.
	AdminUsers UserList `yaml:"admin_users"`

	// StartupTimeout bounds a client's time from connecting to finishing
	// authentication, and a QUIC connection's time from its handshake to
	// opening its first stream. Default: 15s.
	StartupTimeout time.Duration `yaml:"startup_timeout"`

	// AcquireTimeout bounds how long a client waits for a server connection
	// from an exhausted pool before it gets SQLSTATE 53300 (PgBouncer's
	// query_wait_timeout, whose name the key takes). Default: 30s.
	AcquireTimeout time.Duration `yaml:"query_wait_timeout"`

	// LegacyAcquireTimeout is the earlier name of query_wait_timeout,
	// still read so that existing files keep working; giving both is an
	// error.
	LegacyAcquireTimeout time.Duration `yaml:"acquire_timeout"`

	// IdleTransactionTimeout ends a client that leaves a transaction open
	// and sends nothing for this long (FATAL 25P03; its transaction is
	// rolled back and the server connection freed). 0 disables it, the
	// default, as in PgBouncer.
	IdleTransactionTimeout time.Duration `yaml:"idle_transaction_timeout"`

	// ClientIdleTimeout ends a client that sends nothing for this long
	// outside a transaction (FATAL 57P05). 0 disables it, the default.
	ClientIdleTimeout time.Duration `yaml:"client_idle_timeout"`

	// QueryTimeout cancels a request the server has not answered within
	// this long (the client gets 57014 and keeps its session). 0 disables
	// it, the default.
	QueryTimeout time.Duration `yaml:"query_timeout"`

	// ServerLifetime is the age after which an idle server connection is
	// closed and replaced. Default: 1h.
	ServerLifetime time.Duration `yaml:"server_lifetime"`

	// ServerIdleTimeout closes server connections idle this long, down to
	// MinPool (to none in the wildcard route's pools), as PgBouncer's
	// server_idle_timeout. Default: 10m.
	ServerIdleTimeout time.Duration `yaml:"server_idle_timeout"`

	// ServerConnectTimeout bounds dialling and authenticating one server
	// connection. Default: 5s.
	ServerConnectTimeout time.Duration `yaml:"server_connect_timeout"`

	// StatementCacheSize bounds the prepared statements kept on each server
	// connection in transaction mode. Default: 256.
	StatementCacheSize int `yaml:"statement_cache_size"`

	// PipelineDepth bounds the clients' requests written at once on one
	// server connection in transaction mode (cross-client pipelining: when
	// every connection is busy, a complete implicit transaction is written
	// behind others instead of waiting). 1 turns it off. Default: 16.
	PipelineDepth int `yaml:"pipeline_depth"`

	// PipelineFastThreshold is the answer time under which every recent
	// answer of a kind of query must have come for other clients' requests
	// to be written behind one; a query already running longer takes no
	// one behind it. Default: 5ms.
	PipelineFastThreshold time.Duration `yaml:"pipeline_fast_threshold"`

	// CatalogRefresh is how often, in transaction mode, each database's
	// catalog is read again for the tables, views, types and operators
	// whose use runs code a query's text does not show (triggers, rules,
	// views, defaults calling functions): DDL run past the pooler is seen
	// within this time. Default: 5s.
	CatalogRefresh time.Duration `yaml:"catalog_refresh"`

	// PipelineWhen is accepted as "fast" (the default) or "busy" and both
	// now behave alike: a request is pipelined only when the pool is full
	// and every connection busy, since an idle connection, or room to open
	// one, is always taken first.
	PipelineWhen string `yaml:"pipeline_when"`

	// MaxMessageBytes bounds one client protocol message; a larger one ends
	// the session with SQLSTATE 08P01. Default: 67108864 (64 MiB).
	MaxMessageBytes int `yaml:"max_message_bytes"`

	// ShutdownGrace is how long a shutdown waits for clients inside a
	// transaction to finish it before their connections are closed.
	// Default: 30s.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`

	// Procs is how many OS threads run Go code (GOMAXPROCS). Default: 0,
	// meaning half the CPUs the process may use, at least 1. A pooler
	// usually shares its host with the database or the application, and on
	// the 2-core reference machine one thread cut CPU per transaction from
	// 44 to 29 microseconds (fewer cross-thread wake-ups); raise it on a
	// dedicated many-core host.
	Procs int `yaml:"procs"`

	// LogLevel is "debug", "info", "warn" or "error". Default: "info".
	LogLevel string `yaml:"log_level"`

	// LogFormat is "text" or "json". Default: "text".
	LogFormat string `yaml:"log_format"`

	// Databases routes specific databases (and optionally users) to
	// specific servers; they take precedence over Backend. Default: none.
	Databases []Database `yaml:"databases"`

	// Explicit records which settings the user chose, in the file or as
	// flags, rather than left at their defaults. Parse fills it from the
	// keys present in the file; cmd/pgquic sets it for the flags given. It
	// matters where a default must be treated differently from the same
	// value chosen on purpose. It is never read from YAML.
	Explicit Explicit `yaml:"-"`
}

// Explicit says which settings were given by the user.
type Explicit struct {
	// MinPool: min_pool was set. A default MinPool above PoolSize is
	// lowered to PoolSize; a chosen one is an error.
	MinPool bool
	// AuthMethod: auth.method was set. Trust as the default is refused on
	// a listen address other than loopback; trust chosen is accepted.
	AuthMethod bool
	// MetricsListen: metrics_listen was set. If its address cannot be
	// bound `pgquic serve` fails; the default address only gets a warning.
	MetricsListen bool
}

// Auth configures client authentication.
type Auth struct {
	// Method is "trust", "scram-sha-256", "md5" or "password".
	// Default: "trust".
	Method string `yaml:"method"`

	// File is a PgBouncer-format userlist ("user" "secret" per line; the
	// secret plain, "md5..." or "SCRAM-SHA-256$..."). Required by every
	// method except trust. Default: none.
	File string `yaml:"file"`

	// TrustLoopbackOnly makes the trust method accept only clients on a
	// loopback address. Default: false.
	TrustLoopbackOnly bool `yaml:"trust_loopback_only"`
}

// Database routes one database (and optionally one user) to a server.
type Database struct {
	// Name is the database name clients ask for. Required.
	Name string `yaml:"name"`

	// User, when set, restricts the route to that client user; an entry
	// without User serves every user of the database. Default: any user.
	User string `yaml:"user"`

	// Backend is the PostgreSQL URL of the server. The pooler connects as
	// the URL's user to the URL's database, whatever user the client
	// authenticated as. Required.
	Backend string `yaml:"backend"`

	// PoolSize overrides the top-level pool_size for this route.
	// Default: the top-level value.
	PoolSize int `yaml:"pool_size"`

	// MinPool overrides the top-level min_pool for this route; a pointer
	// because zero is a meaningful override. Default: the top-level value.
	MinPool *int `yaml:"min_pool"`

	// ZeroRTT overrides the top-level zero_rtt for this route ("off" or
	// "read-only"). Default: the top-level value.
	ZeroRTT string `yaml:"zero_rtt"`
}

// ZeroRTTFor returns the zero_rtt policy in force for a session of user on
// database: that of the Databases entry routing it (the one naming the
// user, else the one for any user), when it sets one, else the top-level
// value.
func (c *Config) ZeroRTTFor(database, user string) string {
	var route *Database
	for i := range c.Databases {
		d := &c.Databases[i]
		if d.Name != database {
			continue
		}
		if d.User == user {
			route = d
			break
		}
		if d.User == "" && route == nil {
			route = d
		}
	}
	if route != nil && route.ZeroRTT != "" {
		return route.ZeroRTT
	}
	return c.ZeroRTT
}

// AnyZeroRTT reports whether some route may run requests that arrived in
// 0-RTT (zero_rtt: read-only at the top level or on a Databases entry):
// only then does the QUIC front accept 0-RTT at all.
func (c *Config) AnyZeroRTT() bool {
	if c.ZeroRTT == ZeroRTTReadOnly {
		return true
	}
	for _, d := range c.Databases {
		if d.ZeroRTT == ZeroRTTReadOnly {
			return true
		}
	}
	return false
}

// The zero_rtt values.
const (
	// ZeroRTTOff runs nothing of a session before its QUIC handshake is
	// confirmed; the QUIC front then refuses 0-RTT altogether unless
	// another route allows it.
	ZeroRTTOff = "off"
	// ZeroRTTReadOnly runs a 0-RTT request that is one plain statement
	// before the handshake is confirmed, inside a READ ONLY transaction,
	// and defers every other request until it is confirmed.
	ZeroRTTReadOnly = "read-only"
)

// Default returns a Config with every default filled in, including the
// listen addresses that ApplyDefaults leaves alone because empty means
// disabled.
func Default() *Config {
	c := &Config{
		TCPListen:     DefaultTCPListen,
		QUICListen:    DefaultQUICListen,
		MetricsListen: DefaultMetricsListen,
		MinPool:       DefaultMinPool,
	}
	c.ApplyDefaults()
	return c
}

// Load reads, defaults and validates the file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes b over Default, fills remaining defaults and validates. An
// unknown key is an error. An empty document yields Default.
func Parse(b []byte) (*Config, error) {
	c := Default()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("parse: %w", err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("parse: more than one YAML document")
	}
	// Which keys are present: a second, lenient decode into pointers.
	var present struct {
		MinPool       *int    `yaml:"min_pool"`
		MetricsListen *string `yaml:"metrics_listen"`
		Auth          struct {
			Method *string `yaml:"method"`
		} `yaml:"auth"`
	}
	if err := yaml.Unmarshal(b, &present); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	c.Explicit = Explicit{
		MinPool:       present.MinPool != nil,
		AuthMethod:    present.Auth.Method != nil,
		MetricsListen: present.MetricsListen != nil,
	}
	if c.LegacyAcquireTimeout != 0 {
		if c.AcquireTimeout != DefaultAcquireTimeout && c.AcquireTimeout != c.LegacyAcquireTimeout {
			return nil, errors.New("acquire_timeout is the old name of query_wait_timeout: give only query_wait_timeout")
		}
		c.AcquireTimeout, c.LegacyAcquireTimeout = c.LegacyAcquireTimeout, 0
	}
	c.ApplyDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// ApplyDefaults sets every field whose zero value means "default" to that
// default. It leaves TCPListen, QUICListen, MetricsListen and MinPool alone:
// for them the zero value is a valid choice (disabled, no warm connections),
// and their defaults come from Default. A MinPool the user did not set
// (Explicit.MinPool false) is lowered to PoolSize, so that `--pool-size 1`
// alone is valid.
func (c *Config) ApplyDefaults() {
	setIf(&c.Mode, "", DefaultMode)
	setIf(&c.ZeroRTT, "", ZeroRTTOff)
	setIf(&c.RoleChanges, "", DefaultRoleChanges)
	setIf(&c.SessionState, "", DefaultSessionState)
	setIf(&c.ClientStatementBytes, 0, DefaultClientStatementBytes)
	setIf(&c.PoolSize, 0, DefaultPoolSize)
	if !c.Explicit.MinPool && c.PoolSize > 0 && c.MinPool > c.PoolSize {
		c.MinPool = c.PoolSize
	}
	setIf(&c.MaxPools, 0, DefaultMaxPools)
	setIf(&c.PoolIdleTimeout, 0, DefaultPoolIdleTimeout)
	setIf(&c.MaxClientConn, 0, DefaultMaxClientConn)
	setIf(&c.MaxStartingClients, 0, DefaultMaxStartingClients)
	setIf(&c.MaxStartingPerSource, 0, DefaultMaxStartingPerSource)
	setIf(&c.ALPN, "", DefaultALPN)
	setIf(&c.QUICMaxStreams, 0, DefaultQUICMaxStreams)
	setIf(&c.Auth.Method, "", DefaultAuthMethod)
	setIf(&c.StartupTimeout, 0, DefaultStartupTimeout)
	setIf(&c.AcquireTimeout, 0, DefaultAcquireTimeout)
	setIf(&c.ServerLifetime, 0, DefaultServerLifetime)
	setIf(&c.ServerIdleTimeout, 0, DefaultServerIdleTimeout)
	setIf(&c.ServerConnectTimeout, 0, DefaultServerConnectTimeout)
	setIf(&c.StatementCacheSize, 0, DefaultStatementCacheSize)
	setIf(&c.PipelineDepth, 0, DefaultPipelineDepth)
	setIf(&c.PipelineFastThreshold, 0, DefaultPipelineFastThreshold)
	setIf(&c.CatalogRefresh, 0, DefaultCatalogRefresh)
	setIf(&c.PipelineWhen, "", DefaultPipelineWhen)
	setIf(&c.MaxMessageBytes, 0, DefaultMaxMessageBytes)
	setIf(&c.ShutdownGrace, 0, DefaultShutdownGrace)
	setIf(&c.LogLevel, "", DefaultLogLevel)
	setIf(&c.LogFormat, "", DefaultLogFormat)
}

func setIf[T comparable](p *T, zero, def T) {
	if *p == zero {
		*p = def
	}
}

// minMessageBytes is the smallest useful message bound: PostgreSQL's
// startup packet alone may be up to 10000 bytes.
const minMessageBytes = 16 << 10

// Validate checks every field and returns all problems joined, each naming
// its YAML key. Call it after ApplyDefaults.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}

	if c.Procs < 0 {
		bad("procs: must not be negative")
	}
	for _, l := range []struct{ key, addr string }{
		{"tcp_listen", c.TCPListen}, {"quic_listen", c.QUICListen}, {"metrics_listen", c.MetricsListen},
	} {
		if l.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(l.addr); err != nil {
			bad("%s: invalid address %q: %v", l.key, l.addr, err)
		}
	}
	if c.TCPListen == "" && c.QUICListen == "" {
		bad("tcp_listen and quic_listen are both empty: no front would accept clients")
	}
	if c.Backend != "" {
		if err := checkURL(c.Backend); err != nil {
			bad("backend: %v", err)
		}
	}
	if c.Mode != "transaction" && c.Mode != "session" {
		bad("mode: %q is not transaction or session", c.Mode)
	}
	if c.ZeroRTT != ZeroRTTOff && c.ZeroRTT != ZeroRTTReadOnly {
		bad("zero_rtt: %q is not off or read-only", c.ZeroRTT)
	}
	if c.RoleChanges != "refuse" && c.RoleChanges != "pin" {
		bad("role_changes: %q is not refuse or pin", c.RoleChanges)
	}
	if c.SessionState != "pin" && c.SessionState != "error" {
		bad("session_state: %q is not pin or error", c.SessionState)
	}
	if c.ClientStatementBytes < 1 {
		bad("client_statement_bytes: %d must be at least 1", c.ClientStatementBytes)
	}
	if c.PoolSize < 1 {
		bad("pool_size: %d must be at least 1", c.PoolSize)
	}
	if c.MinPool < 0 {
		bad("min_pool: %d must not be negative", c.MinPool)
	} else if c.PoolSize >= 1 && c.MinPool > c.PoolSize {
		bad("min_pool: %d exceeds pool_size %d: lower min_pool (--min-pool) or raise pool_size (--pool-size)", c.MinPool, c.PoolSize)
	}
	if c.MaxPools < 1 {
		bad("max_pools: %d must be at least 1", c.MaxPools)
	}
	if c.MaxClientConn < 1 {
		bad("max_client_conn: %d must be at least 1", c.MaxClientConn)
	}
	if c.MaxStartingClients < 1 {
		bad("max_starting_clients: %d must be at least 1", c.MaxStartingClients)
	}
	if c.MaxStartingPerSource < 1 {
		bad("max_starting_per_source: %d must be at least 1", c.MaxStartingPerSource)
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		bad("tls_cert and tls_key: set both or neither")
	}
	if c.RequireTLS && c.TLSCert == "" {
		bad("require_tls: needs tls_cert and tls_key")
	}
	if c.TLSSessionTicketKeysFile != "" && c.TLSCert == "" {
		bad("tls_session_ticket_keys_file: needs tls_cert and tls_key")
	}
	if strings.TrimSpace(c.ALPN) == "" || len(c.ALPN) > 255 {
		bad("alpn: %q must be 1 to 255 non-blank bytes", c.ALPN)
	}
	if c.QUICMaxConns < 0 {
		bad("quic_max_conns: %d must not be negative", c.QUICMaxConns)
	}
	if c.QUICMaxConnsPerSource < 0 {
		bad("quic_max_conns_per_source: %d must not be negative", c.QUICMaxConnsPerSource)
	}
	if c.QUICServerID < 0 || c.QUICServerID > 0xffff {
		bad("quic_server_id: %d must be 0 (off) or 1 to 65535", c.QUICServerID)
	}
	if c.QUICMaxStreams < 1 {
		bad("quic_max_streams: %d must be at least 1", c.QUICMaxStreams)
	}
	switch c.Auth.Method {
	case "trust":
	case "scram-sha-256", "md5", "password":
		if c.Auth.File == "" {
			bad("auth.file: required by auth method %q", c.Auth.Method)
		}
	default:
		bad("auth.method: %q is not trust, scram-sha-256, md5 or password", c.Auth.Method)
	}
	if c.Auth.Method == "trust" && !c.Explicit.AuthMethod && !c.Auth.TrustLoopbackOnly {
		var exposed []string
		for _, l := range []struct{ key, addr string }{{"tcp_listen", c.TCPListen}, {"quic_listen", c.QUICListen}} {
			if l.addr != "" && !isLoopback(l.addr) {
				exposed = append(exposed, fmt.Sprintf("%s %q", l.key, l.addr))
			}
		}
		if len(exposed) > 0 {
			bad("auth.method: the default, trust, would let anyone who reaches %s log in as any user without a password: "+
				"set --auth-method scram-sha-256 (or md5, password) with --auth-file FILE, listen on a loopback address, "+
				"or pass --auth-method trust (auth.method: trust) to choose trust on purpose", strings.Join(exposed, " and "))
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"startup_timeout", c.StartupTimeout},
		{"query_wait_timeout", c.AcquireTimeout},
		{"idle_transaction_timeout", c.IdleTransactionTimeout},
		{"client_idle_timeout", c.ClientIdleTimeout},
		{"query_timeout", c.QueryTimeout},
		{"server_lifetime", c.ServerLifetime},
		{"server_idle_timeout", c.ServerIdleTimeout},
		{"server_connect_timeout", c.ServerConnectTimeout},
		{"pool_idle_timeout", c.PoolIdleTimeout},
		{"shutdown_grace", c.ShutdownGrace},
	} {
		if d.v < 0 {
			bad("%s: %v must not be negative", d.key, d.v)
		}
	}
	if c.PipelineDepth < 0 {
		bad("pipeline_depth: %d must not be negative (1 turns pipelining off)", c.PipelineDepth)
	}
	if c.PipelineWhen != "fast" && c.PipelineWhen != "busy" {
		bad("pipeline_when: %q is not fast or busy", c.PipelineWhen)
	}
	if c.PipelineFastThreshold < 0 {
		bad("pipeline_fast_threshold: %s must not be negative", c.PipelineFastThreshold)
	}
	if c.CatalogRefresh < 0 {
		bad("catalog_refresh: %s must not be negative", c.CatalogRefresh)
	}
	if c.StatementCacheSize < 0 {
		bad("statement_cache_size: %d must not be negative", c.StatementCacheSize)
	}
	if c.MaxMessageBytes < minMessageBytes {
		bad("max_message_bytes: %d is below the minimum %d", c.MaxMessageBytes, minMessageBytes)
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		bad("log_level: %q is not debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("log_format: %q is not text or json", c.LogFormat)
	}

	for i, u := range c.AdminUsers {
		if u == "" || strings.ContainsAny(u, ", \t\n\x00") {
			bad("admin_users[%d]: %q is not a user name", i, u)
		}
	}

	type routeKey struct{ name, user string }
	seen := make(map[routeKey]bool)
	for i, d := range c.Databases {
		at := fmt.Sprintf("databases[%d]", i)
		switch d.Name {
		case "":
			bad("%s.name: required", at)
		case "*":
			bad("%s.name: \"*\" is not allowed; use the top-level backend for the wildcard route", at)
		case AdminDatabase, AdminAlias:
			bad("%s.name: %q is the admin console's database; clients could not reach this route", at, d.Name)
		}
		k := routeKey{d.Name, d.User}
		if d.Name != "" && seen[k] {
			bad("%s: duplicate route for database %q user %q", at, d.Name, d.User)
		}
		seen[k] = true
		if d.Backend == "" {
			bad("%s.backend: required", at)
		} else if err := checkURL(d.Backend); err != nil {
			bad("%s.backend: %v", at, err)
		}
		if d.PoolSize < 0 {
			bad("%s.pool_size: %d must not be negative", at, d.PoolSize)
		}
		if d.ZeroRTT != "" && d.ZeroRTT != ZeroRTTOff && d.ZeroRTT != ZeroRTTReadOnly {
			bad("%s.zero_rtt: %q is not off or read-only", at, d.ZeroRTT)
		}
		if d.MinPool != nil && *d.MinPool < 0 {
			bad("%s.min_pool: %d must not be negative", at, *d.MinPool)
		}
		if d.MinPool != nil && *d.MinPool > d.EffectivePoolSize(c) && d.EffectivePoolSize(c) >= 1 {
			bad("%s.min_pool: %d exceeds the route's pool size %d", at, *d.MinPool, d.EffectivePoolSize(c))
		}
	}
	return errors.Join(errs...)
}

// EffectivePoolSize returns the route's pool size: its own, or the
// top-level one when it sets none.
func (d Database) EffectivePoolSize(c *Config) int {
	if d.PoolSize > 0 {
		return d.PoolSize
	}
	return c.PoolSize
}

// EffectiveMinPool returns the route's minimum pool: its own, or the
// top-level one when it sets none.
func (d Database) EffectiveMinPool(c *Config) int {
	if d.MinPool != nil {
		return *d.MinPool
	}
	return min(c.MinPool, d.EffectivePoolSize(c))
}

// isLoopback reports whether a listen address accepts only local clients:
// its host is "localhost" or a loopback IP. An empty host (all interfaces)
// and other host names are not.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	host, _, _ = strings.Cut(host, "%") // IPv6 zone
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkURL reports whether s is a connection string pgx can use, without
// echoing the string (it may hold a password).
func checkURL(s string) error {
	if !strings.HasPrefix(s, "postgres://") && !strings.HasPrefix(s, "postgresql://") {
		return errors.New("must be a postgres:// or postgresql:// URL")
	}
	if _, err := pgconn.ParseConfig(s); err != nil {
		return fmt.Errorf("invalid PostgreSQL URL: %w", err)
	}
	return nil
}
