// Package driversuite runs other drivers' own test suites (node-postgres,
// psycopg) directly against a throwaway PostgreSQL and through an in-process
// pgquic pooler in session and transaction mode, and compares the outcomes
// test by test. A driver's suite encodes what that driver expects of
// PostgreSQL; a test that passes directly but fails through pgquic points at
// a fidelity gap in the pooler (or, in transaction mode, at session state the
// pooler does not carry). The suites' sources are not part of this
// repository: they are the test trees of the releases Debian 12 ships
// (node-postgres 8.8.0, psycopg 3.1.7), from Debian's source packages
// (apt-get source node-postgres psycopg3) or the upstream release tags, in
// a directory given to the runner (SourcesDir); the drivers themselves come
// from Debian (psycopg) and npm (node-postgres).
package driversuite

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/internal/pgcluster"
	"github.com/pgquic/pgquic/pooler"
)

// Database is the database the suites run in; it is created at start so the
// suites' tables do not land in postgres.
const Database = "pgquic_suite"

// Mode names a way of reaching PostgreSQL: directly, or through the pooler
// in one of its modes.
type Mode string

const (
	// Direct connects the suite to PostgreSQL itself: the reference run.
	Direct Mode = "direct"
	// Session goes through pgquic in session mode.
	Session Mode = "session"
	// Transaction goes through pgquic in transaction mode.
	Transaction Mode = "transaction"
)

// ParseMode checks a mode name given on a command line.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Direct, Session, Transaction:
		return m, nil
	}
	return "", fmt.Errorf("driversuite: unknown mode %q (want direct, session or transaction)", s)
}

// Endpoint is where a suite connects: host, port, user and database, plus
// the CA file that verifies the server certificate.
type Endpoint struct {
	// Host is the TCP host, 127.0.0.1.
	Host string
	// Port is the TCP port of PostgreSQL or of the pooler.
	Port int
	// User is the role the suites log in as (a superuser: both suites
	// create roles, databases and extensions).
	User string
	// Password is User's password (the cluster trusts loopback anyway).
	Password string
	// Database is the suites' database.
	Database string
	// CAFile verifies the TLS certificate of the server and of the pooler.
	CAFile string
}

// Cluster is a throwaway PostgreSQL 15 prepared for the suites: TLS on,
// prepared transactions allowed (psycopg's two-phase commit tests), enough
// connections for session mode, and the suites' database.
type Cluster struct {
	*pgcluster.Cluster
	keyFile string
}

// StartCluster starts and prepares the cluster; Stop removes it.
func StartCluster(ctx context.Context, logger *slog.Logger) (*Cluster, error) {
	c, err := pgcluster.Start(ctx, pgcluster.Options{
		SSL: true,
		Settings: map[string]string{
			"max_connections":           "300",
			"max_prepared_transactions": "10",
		},
		Logger: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("driversuite: start PostgreSQL: %w", err)
	}
	if err := c.Exec(ctx, "CREATE DATABASE "+Database); err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("driversuite: create database: %w", err)
	}
	return &Cluster{Cluster: c, keyFile: filepath.Join(c.DataDir, "server.key")}, nil
}

// Endpoint is the cluster itself, for direct runs.
func (c *Cluster) Endpoint() Endpoint {
	return Endpoint{Host: c.Host, Port: c.Port, User: c.SuperUser, Password: c.SuperPassword,
		Database: Database, CAFile: c.SSLCertFile}
}

// Pooler is an in-process pgquic (pooler.New over backend.NewManager)
// served on a loopback TCP listener, answering SSLRequest with TLS through
// Peer.StartTLS the way the TCP front does.
type Pooler struct {
	mgr      *backend.Manager
	p        *pooler.Pooler
	ln       net.Listener
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	endpoint Endpoint
	// accepted counts client connections, so a run can prove its clients
	// went through the pooler.
	accepted atomic.Int64
}

// PoolSize is the server connections per (database, user) pool. The suites
// open at most a few dozen clients at once; session mode needs one server
// connection each.
const PoolSize = 100

// StartPooler starts a pooler in mode m in front of c with a wildcard route
// (server connections log in as the client's user, over TLS) and trust
// authentication for loopback clients, as the cluster has.
func StartPooler(c *Cluster, m Mode, logger *slog.Logger) (*Pooler, error) {
	var pm pooler.Mode
	switch m {
	case Session:
		pm = pooler.ModeSession
	case Transaction:
		pm = pooler.ModeTransaction
	default:
		return nil, fmt.Errorf("driversuite: no pooler for mode %q", m)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cert, err := tls.LoadX509KeyPair(c.SSLCertFile, c.keyFile)
	if err != nil {
		return nil, fmt.Errorf("driversuite: load TLS key pair: %w", err)
	}
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}

	ctx, cancel := context.WithCancel(context.Background())
	serverURL := fmt.Sprintf("postgres://%s:%s@%s:%d/postgres?sslmode=require", c.SuperUser, c.SuperPassword, c.Host, c.Port)
	mgr, err := backend.NewManager(ctx, backend.ManagerConfig{
		Routes:   []backend.Route{{Database: backend.Wildcard, PoolConfig: backend.PoolConfig{ConnString: serverURL}}},
		Defaults: backend.PoolConfig{PoolSize: PoolSize, ConnectTimeout: 30 * time.Second},
	}, logger, nil)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("driversuite: backend.NewManager: %w", err)
	}
	trust, err := pgauth.New(pgauth.Config{Method: pgauth.MethodTrust, TrustLoopbackOnly: true})
	if err != nil {
		cancel()
		mgr.Close()
		return nil, fmt.Errorf("driversuite: trust authentication: %w", err)
	}
	p, err := pooler.New(pooler.Config{Mode: pm, Auth: trust, AcquireTimeout: 2 * time.Minute}, mgr, logger, nil)
	if err != nil {
		cancel()
		mgr.Close()
		return nil, fmt.Errorf("driversuite: pooler.New: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		mgr.Close()
		return nil, fmt.Errorf("driversuite: listen: %w", err)
	}
	e := c.Endpoint()
	e.Port = ln.Addr().(*net.TCPAddr).Port
	sp := &Pooler{mgr: mgr, p: p, ln: ln, cancel: cancel, endpoint: e}
	sp.wg.Go(func() { sp.serve(ctx, tlsCfg) })
	return sp, nil
}

// serve accepts sessions until the listener closes.
func (sp *Pooler) serve(ctx context.Context, tlsCfg *tls.Config) {
	for {
		conn, err := sp.ln.Accept()
		if err != nil {
			return
		}
		sp.accepted.Add(1)
		peer := pooler.Peer{Addr: conn.RemoteAddr(), Transport: "tcp"}
		peer.StartTLS = func(ctx context.Context) (io.ReadWriteCloser, error) {
			tc := tls.Server(conn, tlsCfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				return nil, fmt.Errorf("TLS handshake: %w", err)
			}
			return tc, nil
		}
		sp.wg.Go(func() { _ = sp.p.Serve(ctx, conn, peer) })
	}
}

// Endpoint is where the suites reach this pooler.
func (sp *Pooler) Endpoint() Endpoint { return sp.endpoint }

// Accepted is how many client connections the pooler has accepted.
func (sp *Pooler) Accepted() int64 { return sp.accepted.Load() }

// Close drains the pooler for up to 30 seconds, then stops everything it
// started.
func (sp *Pooler) Close() error {
	err := sp.ln.Close()
	ctx, done := context.WithTimeout(context.Background(), 30*time.Second)
	if serr := sp.p.Shutdown(ctx); serr != nil && !errors.Is(serr, context.DeadlineExceeded) {
		err = errors.Join(err, serr)
	}
	done()
	sp.cancel()
	sp.wg.Wait()
	sp.mgr.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
