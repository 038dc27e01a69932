package pgxsuite_test

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
)

// setupSQL is pgx's testsetup/postgresql_setup.sql without psql
// meta-commands; it runs in the pgx_test database.
//
//go:embed testdata/setup.sql
var setupSQL string

// hbaConf replaces the cluster's pg_hba.conf so each pgx_* user meets the
// authentication method its connection string is meant to exercise.
//
//go:embed testdata/pg_hba.conf
var hbaConf string

const (
	// testDB is the database pgx's tests use.
	testDB = "pgx_test"
	// testPassword is the password of every pgx_* role (pgx's setup SQL).
	testPassword = "secret"
	// setupTimeout bounds cluster set-up; the machine is small and noisy.
	setupTimeout = 3 * time.Minute
)

// suiteCluster is a throwaway PostgreSQL prepared like pgx's CI server:
// database pgx_test with hstore, ltree and the uint64 domain, the pgx_*
// roles, a role for the OS user, per-user pg_hba methods and TLS.
type suiteCluster struct {
	*pgtest.Cluster
	// osUser is the role the Unix-socket connection string logs in as.
	osUser string
	// keyFile is the server's TLS key, which the pooler's TLS front reuses.
	keyFile string
}

// newSuiteCluster starts and prepares the cluster. Without PostgreSQL the
// test is skipped, or fails under CI=true (pgtest.New decides).
func newSuiteCluster(t *testing.T) *suiteCluster {
	t.Helper()
	c := pgtest.New(t, pgtest.Options{
		SSL: true,
		Settings: map[string]string{
			// Session mode holds a server connection per client; pgx's
			// packages run two at a time with parallel tests inside.
			"max_connections": "400",
		},
	})
	u, err := user.Current()
	if err != nil {
		t.Fatalf("current OS user: %v", err)
	}
	sc := &suiteCluster{Cluster: c, osUser: u.Username, keyFile: filepath.Join(c.DataDir, "server.key")}

	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := c.Exec(ctx, "CREATE DATABASE "+testDB); err != nil {
		t.Fatalf("create database: %v", err)
	}
	// The OS user's role (pgx's `\set whoami` block); when tests run as
	// postgres it exists already.
	roleSQL := fmt.Sprintf(`DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = %s) THEN
    EXECUTE format('CREATE USER %%I WITH SUPERUSER', %s);
  END IF;
END $$;`, quoteLiteral(sc.osUser), quoteLiteral(sc.osUser))
	if err := sc.execIn(ctx, testDB, setupSQL+"\n"+roleSQL); err != nil {
		t.Fatalf("pgx setup SQL: %v", err)
	}
	if err := sc.installHBA(ctx); err != nil {
		t.Fatalf("install pg_hba.conf: %v", err)
	}
	if os.Getenv("PGQUIC_PGX_PGLOG") == "1" {
		sc.logStatements(ctx, t)
	}
	return sc
}

// logStatements makes the server log every statement, connection and
// disconnection with its process ID and session start, and copies the
// server log to the output directory at cleanup: the way to follow one
// session's protocol through the pooler when diagnosing a difference
// (PGQUIC_PGX_PGLOG=1).
func (c *suiteCluster) logStatements(ctx context.Context, t *testing.T) {
	t.Helper()
	for _, sql := range []string{
		"ALTER SYSTEM SET log_statement = 'all'",
		"ALTER SYSTEM SET log_connections = on",
		"ALTER SYSTEM SET log_disconnections = on",
		"ALTER SYSTEM SET log_line_prefix = '%m [%p] %u %c '",
		"SELECT pg_reload_conf()",
	} {
		if err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	dir := outDir(t)
	t.Cleanup(func() {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(c.DataDir), "postgres.log"))
		if err != nil {
			t.Logf("pgxsuite: read server log: %v", err)
			return
		}
		if err := os.WriteFile(filepath.Join(dir, "postgres.log"), b, 0o644); err != nil {
			t.Logf("pgxsuite: save server log: %v", err)
		}
	})
}

// execIn runs sql as the superuser in database db over the Unix socket,
// which pg_hba.conf always trusts.
func (c *suiteCluster) execIn(ctx context.Context, db, sql string) error {
	conn, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable",
		quoteConnValue(c.SocketDir), c.Port, quoteConnValue(c.SuperUser), quoteConnValue(db)))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", db, err)
	}
	defer func() {
		closeCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("exec in %s: %w", db, err)
	}
	return nil
}

// installHBA writes hbaConf over the cluster's pg_hba.conf, reloads the
// server and waits until the new rules are in force: pgx_md5 with a wrong
// password must be refused, which the trust rules pgtest wrote would not do.
func (c *suiteCluster) installHBA(ctx context.Context) error {
	// Truncating keeps the file's owner, which must stay the server's user.
	if err := os.WriteFile(filepath.Join(c.DataDir, "pg_hba.conf"), []byte(hbaConf), 0o600); err != nil {
		return fmt.Errorf("write pg_hba.conf: %w", err)
	}
	if err := c.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	probe := fmt.Sprintf("host=127.0.0.1 port=%d user=pgx_md5 password=wrong dbname=%s sslmode=disable", c.Port, testDB)
	for {
		conn, err := pgconn.Connect(ctx, probe)
		if err == nil {
			_ = conn.Close(ctx)
		} else {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "28P01" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pg_hba.conf not in force after reload (last probe error: %v): %w", err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// endpoint says where pgx's tests connect: a TCP host and port, a Unix
// socket directory serving the same port number, and the CA file that
// verifies the TLS certificate for "localhost".
type endpoint struct {
	host      string
	port      int
	socketDir string
	caFile    string
}

// directEndpoint is the cluster itself.
func (c *suiteCluster) directEndpoint() endpoint {
	return endpoint{host: c.Host, port: c.Port, socketDir: c.SocketDir, caFile: c.SSLCertFile}
}

// suiteEnv is the PGX_TEST_* environment of pgx's CI (pgx's
// scripts/lib/test_targets.rb), minus what needs things we do not have:
// channel binding (SCRAM-PLUS), client certificates (TLS_CLIENT,
// PGX_SSL_PASSWORD), OAuth, CockroachDB, CrateDB and libpq's test binary.
func (e endpoint) suiteEnv() map[string]string {
	tcp := func(user string) string {
		return fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s", e.host, e.port, user, testPassword, testDB)
	}
	return map[string]string{
		"PGX_TEST_DATABASE":                   tcp("pgx_md5"),
		"PGX_TEST_UNIX_SOCKET_CONN_STRING":    fmt.Sprintf("host=%s port=%d dbname=%s", quoteConnValue(e.socketDir), e.port, testDB),
		"PGX_TEST_TCP_CONN_STRING":            tcp("pgx_md5"),
		"PGX_TEST_MD5_PASSWORD_CONN_STRING":   tcp("pgx_md5"),
		"PGX_TEST_PLAIN_PASSWORD_CONN_STRING": tcp("pgx_pw"),
		"PGX_TEST_SCRAM_PASSWORD_CONN_STRING": tcp("pgx_scram") + " channel_binding=disable",
		// localhost, not 127.0.0.1: verify-full checks the certificate's
		// name, which is localhost (it also lists 127.0.0.1).
		"PGX_TEST_TLS_CONN_STRING": fmt.Sprintf(
			"host=localhost port=%d user=pgx_ssl password=%s sslmode=verify-full sslrootcert=%s dbname=%s channel_binding=disable",
			e.port, testPassword, quoteConnValue(e.caFile), testDB),
	}
}

// poolerOpts shape one in-process pooler.
type poolerOpts struct {
	mode pooler.Mode
	// poolSize is the server connections per (database, user) pool.
	poolSize int
	// statementCacheSize is pooler.Config.StatementCacheSize (0: default).
	statementCacheSize int
	// logger receives the pooler's and backend's logs; nil discards them.
	logger *slog.Logger
}

// suitePooler is a real pooler (pooler.New over backend.NewManager) served
// on a loopback TCP listener with TLS through SSLRequest, and on a Unix
// socket, the way tcpfront would serve it.
type suitePooler struct {
	mgr    *backend.Manager
	p      *pooler.Pooler
	tcp    net.Listener
	unix   net.Listener
	sock   string
	ca     string
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// accepted counts client connections, so a test can prove its clients
	// really went through the pooler.
	accepted atomic.Int64
}

// startPooler starts a pooler in front of c and stops it in t.Cleanup.
func startPooler(t *testing.T, c *suiteCluster, o poolerOpts) *suitePooler {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(c.SSLCertFile, c.keyFile)
	if err != nil {
		t.Fatalf("load TLS key pair: %v", err)
	}
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}

	ctx, cancel := context.WithCancel(context.Background())
	// A wildcard route logs in to the client's database as the client's
	// user with the shared pgx password, over TLS so that pgx's
	// pg_stat_ssl checks see an encrypted server connection, as PgBouncer
	// with server_tls_sslmode=require would give them.
	serverURL := fmt.Sprintf("postgres://postgres:%s@%s:%d/postgres?sslmode=require", testPassword, c.Host, c.Port)
	mgr, err := backend.NewManager(ctx, backend.ManagerConfig{
		Routes:   []backend.Route{{Database: backend.Wildcard, PoolConfig: backend.PoolConfig{ConnString: serverURL}}},
		Defaults: backend.PoolConfig{PoolSize: o.poolSize, ConnectTimeout: 30 * time.Second},
	}, o.logger, nil)
	if err != nil {
		cancel()
		t.Fatalf("backend.NewManager: %v", err)
	}
	authn, err := newHBAAuth(c.osUser)
	if err != nil {
		cancel()
		mgr.Close()
		t.Fatalf("client authentication: %v", err)
	}
	p, err := pooler.New(pooler.Config{
		Mode:               o.mode,
		Auth:               authn,
		StatementCacheSize: o.statementCacheSize,
		// Generous: pgx's pool tests queue many clients on few conns.
		AcquireTimeout: 2 * time.Minute,
	}, mgr, o.logger, nil)
	if err != nil {
		cancel()
		mgr.Close()
		t.Fatalf("pooler.New: %v", err)
	}
	tcpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		mgr.Close()
		t.Fatalf("listen tcp: %v", err)
	}
	port := tcpLn.Addr().(*net.TCPAddr).Port
	// A short directory: Unix socket paths are limited to 107 bytes.
	sockDir, err := os.MkdirTemp("", "pgxsuite-sock-")
	if err != nil {
		cancel()
		mgr.Close()
		_ = tcpLn.Close()
		t.Fatalf("socket dir: %v", err)
	}
	unixLn, err := net.Listen("unix", filepath.Join(sockDir, ".s.PGSQL."+strconv.Itoa(port)))
	if err != nil {
		cancel()
		mgr.Close()
		_ = tcpLn.Close()
		_ = os.RemoveAll(sockDir)
		t.Fatalf("listen unix: %v", err)
	}
	sp := &suitePooler{mgr: mgr, p: p, tcp: tcpLn, unix: unixLn, sock: sockDir, ca: c.SSLCertFile, cancel: cancel}
	sp.serve(ctx, tcpLn, "tcp", tlsCfg)
	sp.serve(ctx, unixLn, "unix", nil)
	t.Cleanup(sp.close)
	return sp
}

// serve accepts sessions on ln until it is closed. With tlsCfg an
// SSLRequest is answered 'S' and the session continues over TLS.
func (sp *suitePooler) serve(ctx context.Context, ln net.Listener, transport string, tlsCfg *tls.Config) {
	sp.wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			sp.accepted.Add(1)
			peer := pooler.Peer{Addr: conn.RemoteAddr(), Transport: transport}
			if tlsCfg != nil {
				peer.StartTLS = func(ctx context.Context) (io.ReadWriteCloser, error) {
					tc := tls.Server(conn, tlsCfg)
					if err := tc.HandshakeContext(ctx); err != nil {
						return nil, fmt.Errorf("TLS handshake: %w", err)
					}
					return tc, nil
				}
			}
			sp.wg.Go(func() {
				_ = sp.p.Serve(ctx, conn, peer)
			})
		}
	})
}

// endpoint is where pgx's tests reach this pooler.
func (sp *suitePooler) endpoint() endpoint {
	return endpoint{host: "127.0.0.1", port: sp.tcp.Addr().(*net.TCPAddr).Port, socketDir: sp.sock, caFile: sp.ca}
}

// close drains the pooler, then stops everything it started.
func (sp *suitePooler) close() {
	_ = sp.tcp.Close()
	_ = sp.unix.Close()
	ctx, done := context.WithTimeout(context.Background(), 30*time.Second)
	_ = sp.p.Shutdown(ctx)
	done()
	sp.cancel()
	sp.wg.Wait()
	sp.mgr.Close()
	_ = os.RemoveAll(sp.sock)
}

// hbaAuth authenticates pooler clients the way testdata/pg_hba.conf makes
// PostgreSQL authenticate them, so the pooler, not only the server, runs
// the md5, SCRAM and cleartext exchanges pgx's tests exercise.
type hbaAuth struct {
	byUser map[string]pooler.Authenticator
	trust  pooler.Authenticator
}

// newHBAAuth builds an authenticator per method from internal/pgauth with the
// pgx roles' password as a plaintext userlist, as pgx's
// testsetup/pgbouncer-userlist.txt does.
func newHBAAuth(osUser string) (*hbaAuth, error) {
	users := make(map[string]pgauth.Secret)
	for _, u := range []string{"pgx_md5", "pgx_scram", "pgx_pw", "pgx_ssl"} {
		s, err := pgauth.ParseSecret(u, testPassword)
		if err != nil {
			return nil, err
		}
		users[u] = s
	}
	list := pgauth.NewUserlist(users)
	mk := func(m pgauth.Method) (pooler.Authenticator, error) {
		return pgauth.New(pgauth.Config{Method: m, Users: list})
	}
	md5, err := mk(pgauth.MethodMD5)
	if err != nil {
		return nil, err
	}
	scram, err := mk(pgauth.MethodSCRAM)
	if err != nil {
		return nil, err
	}
	pw, err := mk(pgauth.MethodPassword)
	if err != nil {
		return nil, err
	}
	trust, err := pgauth.New(pgauth.Config{Method: pgauth.MethodTrust, TrustLoopbackOnly: true})
	if err != nil {
		return nil, err
	}
	return &hbaAuth{
		byUser: map[string]pooler.Authenticator{
			"pgx_md5":   md5,
			"pgx_scram": scram,
			"pgx_pw":    pw,
			"pgx_ssl":   scram,
		},
		trust: trust,
	}, nil
}

// Authenticate picks the method for user, trust for users without a rule.
func (a *hbaAuth) Authenticate(ctx context.Context, ex pooler.AuthExchange, user string, peer net.Addr) error {
	if m, ok := a.byUser[user]; ok {
		return m.Authenticate(ctx, ex, user, peer)
	}
	return a.trust.Authenticate(ctx, ex, user, peer)
}

// quoteLiteral quotes a SQL string literal (standard_conforming_strings on).
func quoteLiteral(s string) string {
	return `'` + strings.ReplaceAll(s, `'`, `''`) + `'`
}

// quoteConnValue quotes a keyword/value connection string value.
func quoteConnValue(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, `'`, `\'`)
	return `'` + s + `'`
}
