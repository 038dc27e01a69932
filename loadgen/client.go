package loadgen

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/loadgen/wan"
)

// Transport says how sessions reach the target.
type Transport string

// The two transports compared by the ramp.
const (
	// TCP opens one TCP connection (TLS unless DisableTLS) per session.
	TCP Transport = "tcp"
	// QUIC opens one QUIC stream per session over a few QUIC connections.
	QUIC Transport = "quic"
)

// Defaults of ClientConfig, applied to zero fields.
const (
	// DefaultQuery is the ramp's default statement: cheap to execute, with
	// a small result, so the round trip dominates.
	DefaultQuery = "SELECT trunc(random() * 100) FROM generate_series(1, 10)"
	// DefaultConnectTimeout bounds one session's connection set-up.
	DefaultConnectTimeout = 5 * time.Second
	// DefaultConnectParallel is how many sessions connect at once before a
	// run.
	DefaultConnectParallel = 32
)

// ClientConfig describes the sessions of one transport. Both transports
// use the same client code (pgconn, simple query protocol); only the dial
// differs. Zero values take the defaults named on each field.
type ClientConfig struct {
	// Transport is TCP or QUIC. Required.
	Transport Transport
	// Addr is the target's host:port (a pooler, PgBouncer, PostgreSQL).
	// Its host is the name TLS verifies. Required.
	Addr string
	// Relay, when set, is the address actually dialed (TCP) or sent to
	// (QUIC), for example a WAN emulator forwarding to Addr; TLS still
	// verifies Addr's host.
	Relay string
	// Conns is the number of TCP connections (one session each) or of QUIC
	// connections. Required, positive.
	Conns int
	// Streams is the number of sessions (streams) per QUIC connection.
	// Default 1. TCP accepts only 0 or 1.
	Streams int
	// User, Password and Database log in; User and Database default to
	// "postgres".
	User, Password, Database string
	// Query is the statement each query runs (simple query protocol).
	// Default DefaultQuery.
	Query string
	// DisableTLS makes TCP sessions plain (sslmode=disable). By default TCP
	// sessions require TLS; QUIC always uses TLS 1.3.
	DisableTLS bool
	// CAFile, PinSHA256 and Insecure choose how the server's certificate is
	// verified, exactly one of them (or TLSConfig): a PEM file of CAs; the
	// hex SHA-256 fingerprint of the server's certificate (case, colons and
	// a "sha256:" prefix ignored), which suits a generated certificate; or
	// no verification at all.
	CAFile    string
	PinSHA256 string
	Insecure  bool
	// TLSConfig, when set, is the base TLS configuration (cloned).
	TLSConfig *tls.Config
	// ConnectTimeout bounds each session's connection set-up, before the
	// run and on reconnects. Default DefaultConnectTimeout (5s).
	ConnectTimeout time.Duration
	// ConnectParallel is how many sessions connect at once. Default
	// DefaultConnectParallel (32).
	ConnectParallel int
	// Netns, when set, names the network namespace (a packet-mode WAN
	// emulator's client namespace) in which every socket is created: each
	// TCP connection, and QUIC's UDP socket. The sockets themselves are the
	// kernel's own, unwrapped, so QUIC keeps GSO and ECN.
	Netns string
	// SessionPerQuery makes every query open a new session of its own and
	// close it (Terminate) once the result arrived, as short-lived
	// serverless workers do; Conns x Streams is then the most sessions open
	// at once, not sessions opened before the run, and a query's latency
	// includes its session's set-up. Connect opens only warm-up sessions
	// (one, and for LocalStartup the QUIC connection and two sessions, so
	// the greeting cache is filled), each closed again. See ChurnStats.
	SessionPerQuery bool
	// LocalStartup (QUIC only) answers each session's startup on the
	// client's side (quicclient's LocalStartup, what pgquic edge
	// --local-startup runs), sending startup and query in one flight. The
	// pooler must trust CertFile as an edge (--edge-trust).
	LocalStartup bool
	// CertFile and KeyFile are the client certificate QUIC presents
	// (mutual TLS; LocalStartup needs one the pooler trusts).
	CertFile, KeyFile string
}

// Sessions is the number of sessions the configuration opens.
func (c ClientConfig) Sessions() int {
	if c.Transport == QUIC {
		return c.Conns * max(c.Streams, 1)
	}
	return c.Conns
}

// TLS reports whether sessions are encrypted.
func (c ClientConfig) TLS() bool { return c.Transport == QUIC || !c.DisableTLS }

// ErrConnect is wrapped by errors from setting up a session.
var ErrConnect = errors.New("loadgen: connect")

// ErrBadClientConfig is wrapped by Connect's configuration errors.
var ErrBadClientConfig = errors.New("loadgen: invalid client config")

func (c *ClientConfig) populate() error {
	if c.Transport != TCP && c.Transport != QUIC {
		return fmt.Errorf("%w: transport %q, want %q or %q", ErrBadClientConfig, c.Transport, TCP, QUIC)
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("%w: address %q: %w", ErrBadClientConfig, c.Addr, err)
	}
	if c.Relay != "" {
		if _, _, err := net.SplitHostPort(c.Relay); err != nil {
			return fmt.Errorf("%w: relay address %q: %w", ErrBadClientConfig, c.Relay, err)
		}
	}
	if c.Conns <= 0 {
		return fmt.Errorf("%w: %d connections, want at least 1", ErrBadClientConfig, c.Conns)
	}
	if c.Streams < 0 || (c.Transport == TCP && c.Streams > 1) {
		return fmt.Errorf("%w: %d streams per connection (TCP carries one session per connection)", ErrBadClientConfig, c.Streams)
	}
	if c.Transport == QUIC && c.DisableTLS {
		return fmt.Errorf("%w: QUIC always uses TLS 1.3; DisableTLS applies to TCP only", ErrBadClientConfig)
	}
	if c.Transport != QUIC && (c.LocalStartup || c.CertFile != "" || c.KeyFile != "") {
		return fmt.Errorf("%w: LocalStartup and a client certificate apply to QUIC only", ErrBadClientConfig)
	}
	c.Streams = max(c.Streams, 1)
	if c.User == "" {
		c.User = "postgres"
	}
	if c.Database == "" {
		c.Database = "postgres"
	}
	if c.Query == "" {
		c.Query = DefaultQuery
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.ConnectParallel == 0 {
		c.ConnectParallel = DefaultConnectParallel
	}
	if c.ConnectTimeout < 0 || c.ConnectParallel < 0 {
		return fmt.Errorf("%w: ConnectTimeout and ConnectParallel must not be negative", ErrBadClientConfig)
	}
	if c.TLS() {
		modes := 0
		for _, set := range []bool{c.CAFile != "", c.PinSHA256 != "", c.Insecure} {
			if set {
				modes++
			}
		}
		if modes > 1 {
			return fmt.Errorf("%w: choose one of CAFile, PinSHA256 and Insecure", ErrBadClientConfig)
		}
		if modes == 0 && c.TLSConfig == nil {
			return fmt.Errorf("%w: no server verification for TLS: set CAFile, PinSHA256 or Insecure (or disable TLS for plain TCP)", ErrBadClientConfig)
		}
	}
	return nil
}

// dialAddr is where connections actually go.
func (c ClientConfig) dialAddr() string {
	if c.Relay != "" {
		return c.Relay
	}
	return c.Addr
}

// ConnectStats describes the set-up of a client's sessions, which happens
// before a run so that connection set-up is never counted in it.
type ConnectStats struct {
	// Sessions is the number of sessions connected.
	Sessions int
	// Total is the wall time to connect them all.
	Total time.Duration
	// P50 and Max are per-session connect times (dial, TLS or QUIC
	// handshake, PostgreSQL startup and authentication).
	P50, Max time.Duration
	// QUICConns is the number of live QUIC connections after connecting
	// (QUIC only).
	QUICConns int
}

// Clients is a set of connected sessions of one transport, ready to be
// handed to Run as workers. Close it when done.
type Clients struct {
	cfg      ClientConfig
	pg       *pgconn.Config
	log      *slog.Logger
	closeDia func() error
	liveQUIC func() int
	quicPath func() PathStats
	migrate  func(context.Context) error // nil for TCP
	tcp      tcpConns
	sessions []*session
	warmQUIC func(context.Context) error
	churn    churnStats // SessionPerQuery only

	// Stats describes how the sessions were connected.
	Stats ConnectStats

	reconnects atomic.Int64
}

// Connect opens every session of cfg, in parallel, before any load is
// offered. It fails with an error wrapping ErrConnect (and naming the
// address and transport) as soon as one session cannot connect within
// ConnectTimeout, closing those already open. With SessionPerQuery it opens
// and closes only the warm-up sessions, and each worker opens a session per
// query during the run. logger nil discards logs.
func Connect(ctx context.Context, cfg ClientConfig, logger *slog.Logger) (*Clients, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := cfg.populate(); err != nil {
		return nil, err
	}
	c := &Clients{cfg: cfg, log: logger}
	pg, err := c.pgConfig()
	if err != nil {
		return nil, err
	}
	c.pg = pg
	if cfg.Transport == QUIC {
		qd, err := newQUICDial(cfg, logger)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadClientConfig, err)
		}
		pg.DialFunc, c.liveQUIC, c.closeDia, c.quicPath, c.migrate = wan.DialInNetns(cfg.Netns, qd.dial), qd.live, qd.close, qd.stats, qd.migrate
		c.warmQUIC = qd.warm
	} else {
		nd := &net.Dialer{}
		addr := cfg.dialAddr()
		pg.DialFunc = wan.DialInNetns(cfg.Netns, func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := nd.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			tc := c.tcp.add(conn)
			if cfg.SessionPerQuery {
				// Thousands of connections come and go: each leaves the
				// list at its close, its counters kept in the totals.
				return &retiringConn{Conn: conn, t: &c.tcp, tc: tc}, nil
			}
			return conn, nil
		})
	}
	connect := c.connectAll
	if cfg.SessionPerQuery {
		connect = c.prepareChurn
	}
	if err := connect(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// pgConfig builds the pgconn configuration shared by every session.
func (c *Clients) pgConfig() (*pgconn.Config, error) {
	host, port, _ := net.SplitHostPort(c.cfg.Addr)
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(c.cfg.User, c.cfg.Password),
		Host:     net.JoinHostPort(host, port),
		Path:     "/" + c.cfg.Database,
		RawQuery: url.Values{"sslmode": {"disable"}, "application_name": {"pgquic-loadgen"}}.Encode(),
	}
	if c.cfg.Password == "" {
		u.User = url.User(c.cfg.User)
	}
	pg, err := pgconn.ParseConfig(u.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadClientConfig, err)
	}
	pg.Fallbacks = nil
	pg.ConnectTimeout = c.cfg.ConnectTimeout
	// The dial function knows the real address: no DNS lookup of the label.
	pg.LookupFunc = func(_ context.Context, h string) ([]string, error) { return []string{h}, nil }
	if c.cfg.Transport == TCP && !c.cfg.DisableTLS {
		tc, err := tcpTLSConfig(c.cfg, host)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadClientConfig, err)
		}
		pg.TLSConfig = tc
	}
	return pg, nil
}

// connectAll opens every session, ConnectParallel at a time.
func (c *Clients) connectAll(ctx context.Context) error {
	n := c.cfg.Sessions()
	c.sessions = make([]*session, n)
	times := make([]time.Duration, n)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		next     atomic.Int64
	)
	start := time.Now()
	for range min(c.cfg.ConnectParallel, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				t := time.Now()
				conn, err := c.connect(ctx)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("session %d of %d: %w", i+1, n, err)
					}
					mu.Unlock()
					cancel()
					return
				}
				times[i] = time.Since(t)
				c.sessions[i] = &session{c: c, conn: conn}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrConnect, err)
	}
	slices.Sort(times)
	c.Stats = ConnectStats{Sessions: n, Total: time.Since(start), P50: times[n/2], Max: times[n-1]}
	if c.liveQUIC != nil {
		c.Stats.QUICConns = c.liveQUIC()
	}
	c.log.Debug("sessions connected", "transport", c.cfg.Transport, "sessions", n, "total", c.Stats.Total)
	return nil
}

// connect opens one session.
func (c *Clients) connect(ctx context.Context) (*pgconn.PgConn, error) {
	conn, err := pgconn.ConnectConfig(ctx, c.pg)
	if err != nil {
		return nil, fmt.Errorf("%w to %s over %s: %w", ErrConnect, c.cfg.Addr, c.transportLabel(), err)
	}
	return conn, nil
}

func (c *Clients) transportLabel() string {
	s := string(c.cfg.Transport)
	if c.cfg.Transport == TCP && !c.cfg.DisableTLS {
		s += "+tls"
	}
	if c.cfg.Relay != "" {
		s += " via " + c.cfg.Relay
	}
	return s
}

// Config returns the configuration with its defaults filled in.
func (c *Clients) Config() ClientConfig { return c.cfg }

// Workers returns the sessions as Run's workers.
func (c *Clients) Workers() []Worker {
	ws := make([]Worker, len(c.sessions))
	for i, s := range c.sessions {
		ws[i] = s
	}
	return ws
}

// Reconnects counts sessions re-opened during runs after their connection
// broke.
func (c *Clients) Reconnects() int64 { return c.reconnects.Load() }

// ErrNoMigration is returned by Migrate for TCP clients.
var ErrNoMigration = errors.New("loadgen: only QUIC sessions can move to a new address")

// Migrate moves every QUIC connection to a new local UDP port, as a client
// whose network changed does (quicclient.Dialer.Migrate): the sessions go
// on over the same connections. In a network namespace (Netns) the new
// socket is bound there too.
func (c *Clients) Migrate(ctx context.Context) error {
	if c.migrate == nil {
		return ErrNoMigration
	}
	if c.cfg.Netns == "" {
		return c.migrate(ctx)
	}
	return wan.InNetns(c.cfg.Netns, func() error { return c.migrate(ctx) })
}

// QUICConns is the number of live QUIC connections (0 for TCP).
func (c *Clients) QUICConns() int {
	if c.liveQUIC == nil {
		return 0
	}
	return c.liveQUIC()
}

// Close ends every session (a Terminate message, in parallel) and, for
// QUIC, the connections. It also waits, at most two seconds, for the
// clean-up pgconn runs in the background for sessions whose query was
// canceled (a CancelRequest, then Terminate), so nothing of this client
// outlives it. Call it only when no run is using the sessions.
func (c *Clients) Close() error {
	c.churn.wait()
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(c.cfg.ConnectParallel, 1))
	for _, s := range c.sessions {
		if s == nil || s.conn == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = s.conn.Close(ctx)
			select {
			case <-s.conn.CleanupDone():
			case <-ctx.Done():
			}
		}()
	}
	wg.Wait()
	c.sessions = nil
	if c.closeDia != nil {
		return c.closeDia()
	}
	return nil
}

// session is one PostgreSQL session; Run's worker goroutine owns it.
type session struct {
	c     *Clients
	conn  *pgconn.PgConn
	churn bool // SessionPerQuery: a new session per query (doChurn)
}

// Do runs the query once. A server error leaves the session usable; when
// the connection broke, the next Do reconnects first (its latency then
// includes the reconnection, as an application's would).
func (s *session) Do(ctx context.Context) error {
	if s.churn {
		return s.doChurn(ctx)
	}
	if s.conn == nil || s.conn.IsClosed() {
		s.c.reconnects.Add(1)
		conn, err := s.c.connect(ctx)
		if err != nil {
			return err
		}
		s.conn = conn
	}
	_, err := s.conn.Exec(ctx, s.c.cfg.Query).ReadAll()
	return err
}

// tcpTLSConfig builds the TLS configuration of TCP sessions from the one
// verification mode chosen.
func tcpTLSConfig(cfg ClientConfig, serverName string) (*tls.Config, error) {
	tc := &tls.Config{}
	if cfg.TLSConfig != nil {
		tc = cfg.TLSConfig.Clone()
	}
	if tc.ServerName == "" {
		tc.ServerName = serverName
	}
	if tc.MinVersion == 0 {
		tc.MinVersion = tls.VersionTLS12
	}
	switch {
	case cfg.CAFile != "":
		pool, err := loadCAFile(cfg.CAFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	case cfg.PinSHA256 != "":
		pin, err := normalizePin(cfg.PinSHA256)
		if err != nil {
			return nil, err
		}
		// The pin replaces chain and name verification: the leaf itself is trusted.
		tc.InsecureSkipVerify = true
		tc.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return ErrPinMismatch
			}
			sum := sha256.Sum256(raw[0])
			if got := hex.EncodeToString(sum[:]); got != pin {
				return fmt.Errorf("%w: got %s", ErrPinMismatch, got)
			}
			return nil
		}
	case cfg.Insecure:
		tc.InsecureSkipVerify = true
	}
	return tc, nil
}

// ErrPinMismatch is wrapped by the TLS handshake's error when the server's
// certificate does not match ClientConfig.PinSHA256.
var ErrPinMismatch = errors.New("loadgen: server certificate does not match the pinned SHA-256 fingerprint")

func loadCAFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}

// normalizePin accepts a SHA-256 fingerprint as tools print it (either
// case, optional colons, optional "sha256:" prefix) and returns lower-case
// hex.
func normalizePin(pin string) (string, error) {
	p := strings.ToLower(strings.TrimSpace(pin))
	p = strings.TrimPrefix(p, "sha256:")
	p = strings.ReplaceAll(p, ":", "")
	if b, err := hex.DecodeString(p); err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("pin %q: want %d hex digits of a SHA-256 fingerprint", pin, 2*sha256.Size)
	}
	return p, nil
}
