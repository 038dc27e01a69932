// Package pgcluster starts throwaway PostgreSQL clusters: initdb into a fresh
// temporary directory, postgres on a free loopback port, and removal of
// everything on Stop. The pgquic binary uses Start for the embedded default
// PostgreSQL of its zero-flag runs; integration tests use it through
// internal/pgtest. It does not import the testing package, so the binary
// does not carry it.
//
// Each cluster owns its directory, port, socket directory and process, so
// clusters in parallel test processes never share anything.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/spawn"
)

// Auth methods accepted in Options.Auth. They are the pg_hba.conf method
// names PostgreSQL uses for TCP host connections.
const (
	// AuthTrust lets any TCP client in without a password.
	AuthTrust = "trust"
	// AuthSCRAM requires SCRAM-SHA-256, PostgreSQL's default since 14.
	AuthSCRAM = "scram-sha-256"
	// AuthMD5 requires MD5 password authentication; passwords are stored as
	// MD5 hashes so the server really asks for MD5 rather than SCRAM.
	AuthMD5 = "md5"
	// AuthPassword requires a clear-text password (safe only over TLS).
	AuthPassword = "password"
)

const (
	// superUser and superPassword are fixed so that URLs and tests can be
	// written without asking the cluster, and so password auth methods work
	// for the superuser too.
	superUser     = "postgres"
	superPassword = "postgres"

	// readyTimeout bounds how long Start and Restart wait for the server to
	// accept connections; the machine is small and noisy, so it is generous.
	readyTimeout = 60 * time.Second

	// stopGrace is how long a fast shutdown may take before Stop escalates
	// to an immediate shutdown and then to SIGKILL.
	stopGrace = 30 * time.Second

	// portAttempts is how many free ports Start tries when another process
	// grabs the picked port between the probe and postgres binding it.
	portAttempts = 5
)

// ErrStopped is returned by Restart once Stop has been called.
var ErrStopped = errors.New("pgcluster: cluster is stopped")

// errPortInUse marks a start that failed only because the port was taken,
// which Start answers by trying another port.
var errPortInUse = errors.New("pgcluster: port already in use")

// User is a login role created after the server starts, so tests can
// authenticate as an ordinary user rather than only as the superuser.
type User struct {
	// Name is the role name.
	Name string
	// Password is the role's password; empty creates a role without one,
	// which can then log in only where Auth is trust.
	Password string
	// Superuser grants SUPERUSER to the role.
	Superuser bool
}

// Options shape a cluster. The zero value gives a trust-auth cluster without
// TLS, which suits most tests.
type Options struct {
	// Auth is the pg_hba.conf method for TCP host connections: "trust"
	// (the default when empty), "scram-sha-256", "md5" or "password".
	// Unix-socket connections are always trust, which is how Exec works.
	Auth string
	// SSL turns on ssl=on with a self-signed certificate generated in the
	// data directory, so clients can use sslmode=require. Default off.
	SSL bool
	// Users are roles created after start, with LOGIN and the given
	// password, stored with the encryption matching Auth (md5 for md5,
	// scram-sha-256 otherwise). Default none.
	Users []User
	// Settings are extra postgresql.conf settings that override the
	// throwaway defaults, e.g. {"max_connections": "200"}. Default none.
	Settings map[string]string
	// Logger receives lifecycle messages; nil discards them.
	Logger *slog.Logger
}

// Cluster is one running throwaway PostgreSQL server. Its exported fields
// are fixed after Start returns and safe to read concurrently.
type Cluster struct {
	// Host is the loopback address the server listens on, "127.0.0.1".
	Host string
	// Port is the TCP port, picked free at start and kept across Restart.
	Port int
	// SocketDir is the directory of the server's Unix-domain socket.
	SocketDir string
	// DataDir is the cluster's data directory.
	DataDir string
	// SuperUser is the bootstrap superuser's name, "postgres".
	SuperUser string
	// SuperPassword is the superuser's password, "postgres", set at initdb
	// so password auth methods work for the superuser too.
	SuperPassword string
	// SSLCertFile is the PEM file of the server's self-signed certificate
	// when Options.SSL is set (empty otherwise); clients may use it as
	// sslrootcert with sslmode=verify-full.
	SSLCertFile string

	opts    Options
	log     *slog.Logger
	binDir  string
	rootDir string
	logPath string
	cred    *syscall.Credential
	spawn   *spawn.Thread

	mu      sync.Mutex // serializes Restart and Stop
	proc    *serverProc
	stopped bool
}

// serverProc is one run of the postgres postmaster.
type serverProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done is closed
}

// Start creates a new cluster with initdb, starts postgres on a free
// loopback port and waits until it accepts connections. The context bounds
// only the start-up; the server runs until Stop. When running as root the
// server runs as the "postgres" system user, because PostgreSQL refuses to
// run as root. On any failure everything created so far is removed.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Auth == "" {
		opts.Auth = AuthTrust
	}
	switch opts.Auth {
	case AuthTrust, AuthSCRAM, AuthMD5, AuthPassword:
	default:
		return nil, fmt.Errorf("pgcluster: unsupported auth method %q", opts.Auth)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	binDir, err := Binaries()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	base, err := tempBase(cred)
	if err != nil {
		return nil, err
	}
	sweepStale(base, log)

	root, err := os.MkdirTemp(base, dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: create temp dir: %w", err)
	}
	c := &Cluster{
		Host:          "127.0.0.1",
		SocketDir:     filepath.Join(root, "sock"),
		DataDir:       filepath.Join(root, "data"),
		SuperUser:     superUser,
		SuperPassword: superPassword,
		opts:          opts,
		log:           log,
		binDir:        binDir,
		rootDir:       root,
		logPath:       filepath.Join(root, "postgres.log"),
		cred:          cred,
	}
	if err := c.start(ctx); err != nil {
		c.mu.Lock()
		c.stopped = true
		stopErr := c.stopServer()
		c.mu.Unlock()
		if c.spawn != nil {
			c.spawn.Close()
		}
		rmErr := removeAll(root)
		return nil, errors.Join(err, stopErr, rmErr)
	}
	log.Info("pgcluster: cluster started", "port", c.Port, "data_dir", c.DataDir, "auth", opts.Auth, "ssl", opts.SSL)
	return c, nil
}

// start does Start's work after the Cluster value exists, so Start can
// clean up uniformly on failure.
func (c *Cluster) start(ctx context.Context) error {
	if err := writeOwner(c.rootDir); err != nil {
		return err
	}
	if err := os.Mkdir(c.SocketDir, 0o700); err != nil {
		return fmt.Errorf("pgcluster: create socket dir: %w", err)
	}
	if err := c.chown(c.rootDir, c.SocketDir); err != nil {
		return err
	}
	if err := c.initdb(ctx); err != nil {
		return err
	}
	if c.opts.SSL {
		c.SSLCertFile = filepath.Join(c.DataDir, "server.crt")
		keyFile := filepath.Join(c.DataDir, "server.key")
		if err := writeSelfSignedCert(c.SSLCertFile, keyFile); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
		if err := c.chown(c.SSLCertFile, keyFile); err != nil {
			return err
		}
	}
	if err := c.writeConfig(); err != nil {
		return err
	}
	c.spawn = spawn.New()

	var lastErr error
	for attempt := 0; attempt < portAttempts; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		c.Port = port
		lastErr = c.launchAndWait(ctx)
		if !errors.Is(lastErr, errPortInUse) {
			break
		}
		c.log.Debug("pgcluster: port taken, retrying", "port", port)
	}
	if lastErr != nil {
		return lastErr
	}
	return c.setupRoles(ctx)
}

// initdb creates the data directory with a UTF8, C-locale cluster whose
// superuser password is set from a temporary password file.
func (c *Cluster) initdb(ctx context.Context) error {
	pwfile := filepath.Join(c.rootDir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(superPassword+"\n"), 0o600); err != nil {
		return fmt.Errorf("pgcluster: write password file: %w", err)
	}
	defer os.Remove(pwfile)
	if err := c.chown(pwfile); err != nil {
		return err
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "initdb"),
		"-D", c.DataDir,
		"-U", superUser,
		"--pwfile", pwfile,
		"-A", "trust",
		"-E", "UTF8",
		"--locale=C",
		"--no-sync",
	)
	cmd.Dir = c.rootDir
	cmd.Env = childEnv()
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgcluster: initdb: %w\n%s", err, tailLines(out.String(), 30))
	}
	return nil
}

// writeConfig appends the throwaway settings to postgresql.conf and
// replaces pg_hba.conf. Settings live in the file, not on the command line,
// so Restart brings the same server back.
func (c *Cluster) writeConfig() error {
	settings := map[string]string{
		"listen_addresses":   c.Host,
		"fsync":              "off",
		"synchronous_commit": "off",
		"full_page_writes":   "off",
		"max_connections":    "300",
		"shared_buffers":     "32MB",
		"logging_collector":  "off",
		"huge_pages":         "off",
		"password_encryption": func() string {
			if c.opts.Auth == AuthMD5 {
				return "md5"
			}
			return "scram-sha-256"
		}(),
	}
	if c.opts.SSL {
		settings["ssl"] = "on"
		settings["ssl_cert_file"] = c.SSLCertFile
		settings["ssl_key_file"] = filepath.Join(c.DataDir, "server.key")
	}
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("\n# Added by pgcluster for a fast throwaway cluster.\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(settings[k], "'", "''"))
	}
	f, err := os.OpenFile(filepath.Join(c.DataDir, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: open postgresql.conf: %w", err)
	}
	_, werr := f.WriteString(b.String())
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("pgcluster: write postgresql.conf: %w", werr)
	}

	hba := fmt.Sprintf(`# Written by pgcluster: Unix sockets trust (used by Exec), TCP uses %[1]s.
local all         all                trust
local replication all                trust
host  all         all  127.0.0.1/32  %[1]s
host  all         all  ::1/128       %[1]s
host  replication all  127.0.0.1/32  %[1]s
`, c.opts.Auth)
	// Truncating the existing file keeps its owner, which must stay the
	// server's user.
	if err := os.WriteFile(filepath.Join(c.DataDir, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return fmt.Errorf("pgcluster: write pg_hba.conf: %w", err)
	}
	return nil
}

// setupRoles stores the superuser's password with the encryption matching
// Auth and creates Options.Users.
func (c *Cluster) setupRoles(ctx context.Context) error {
	enc := "scram-sha-256"
	if c.opts.Auth == AuthMD5 {
		enc = "md5"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "SET password_encryption = '%s';\n", enc)
	if enc != "scram-sha-256" {
		// initdb stored the superuser password as SCRAM; with md5 in
		// pg_hba.conf the server would then still ask for SCRAM.
		fmt.Fprintf(&b, "ALTER ROLE %s PASSWORD %s;\n", quoteIdent(superUser), quoteLiteral(superPassword))
	}
	for _, u := range c.opts.Users {
		if u.Name == "" {
			return errors.New("pgcluster: user with empty name")
		}
		fmt.Fprintf(&b, "CREATE ROLE %s LOGIN", quoteIdent(u.Name))
		if u.Superuser {
			b.WriteString(" SUPERUSER")
		}
		if u.Password != "" {
			fmt.Fprintf(&b, " PASSWORD %s", quoteLiteral(u.Password))
		}
		b.WriteString(";\n")
	}
	if err := c.Exec(ctx, b.String()); err != nil {
		return fmt.Errorf("pgcluster: set up roles: %w", err)
	}
	return nil
}

// launchAndWait starts postgres on c.Port and waits until it accepts TCP
// connections, returning errPortInUse (wrapped) if it could not bind.
// The caller holds c.mu or is Start.
func (c *Cluster) launchAndWait(ctx context.Context) error {
	p, err := c.launch()
	if err != nil {
		return err
	}
	c.proc = p
	if err := c.waitReady(ctx, p); err != nil {
		stopErr := c.stopServer()
		return errors.Join(err, stopErr)
	}
	return nil
}

// launch starts the postmaster as a child process. It runs on the
// cluster's spawner thread so the parent-death signal stays armed: Linux
// sends it when the forking thread exits, not the process.
func (c *Cluster) launch() (*serverProc, error) {
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: open server log: %w", err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "---- pgcluster: starting postgres on port %d at %s ----\n", c.Port, time.Now().Format(time.RFC3339Nano))

	cmd := exec.Command(filepath.Join(c.binDir, "postgres"),
		"-D", c.DataDir,
		"-p", strconv.Itoa(c.Port),
		"-k", c.SocketDir,
	)
	cmd.Dir = c.rootDir
	cmd.Env = childEnv()
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: c.cred,
		// Fast shutdown if this process dies without calling Stop.
		Pdeathsig: syscall.SIGINT,
		// Keep a terminal's Ctrl-C away from postgres: Stop (or the
		// parent-death signal) shuts it down in order.
		Setpgid: true,
	}
	var startErr error
	c.spawn.Do(func() { startErr = cmd.Start() })
	if startErr != nil {
		return nil, fmt.Errorf("pgcluster: start postgres: %w", startErr)
	}
	p := &serverProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitReady connects over TCP as the superuser until the server answers,
// the process exits, the context ends or readyTimeout passes.
func (c *Cluster) waitReady(ctx context.Context, p *serverProc) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	url := c.SuperURL("postgres")
	var lastErr error
	for {
		select {
		case <-p.done:
			logTail := c.logTail()
			if strings.Contains(logTail, "could not bind") || strings.Contains(logTail, "Address already in use") {
				return fmt.Errorf("%w: port %d: postgres exited: %v", errPortInUse, c.Port, p.err)
			}
			return fmt.Errorf("pgcluster: postgres exited during start-up (%v); server log tail:\n%s", p.err, logTail)
		default:
		}
		attemptCtx, attemptCancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgconn.Connect(attemptCtx, url)
		attemptCancel()
		if err == nil {
			closeCtx, closeCancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = conn.Close(closeCtx)
			closeCancel()
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: postgres not ready on port %d: %w (last error: %v); server log tail:\n%s",
				c.Port, ctx.Err(), lastErr, c.logTail())
		case <-p.done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopServer shuts the current postmaster down: fast shutdown (SIGINT),
// then immediate (SIGQUIT), then SIGKILL, each after a grace period.
// The caller holds c.mu or is Start.
func (c *Cluster) stopServer() error {
	p := c.proc
	if p == nil {
		return nil
	}
	c.proc = nil
	steps := []struct {
		sig   syscall.Signal
		grace time.Duration
	}{
		{syscall.SIGINT, stopGrace},
		{syscall.SIGQUIT, 10 * time.Second},
		{syscall.SIGKILL, 10 * time.Second},
	}
	for _, s := range steps {
		select {
		case <-p.done:
			return nil
		default:
		}
		if err := p.cmd.Process.Signal(s.sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
			c.log.Warn("pgcluster: signal postgres", "signal", s.sig, "err", err)
		}
		select {
		case <-p.done:
			if s.sig != syscall.SIGINT {
				c.log.Warn("pgcluster: postgres needed a harder stop", "signal", s.sig)
			}
			return nil
		case <-time.After(s.grace):
		}
	}
	return fmt.Errorf("pgcluster: postgres (pid %d) did not exit after SIGKILL", p.cmd.Process.Pid)
}

// Stop shuts the server down (fast shutdown) and removes the whole
// temporary directory. It is idempotent and safe to call concurrently.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped = true
	stopErr := c.stopServer()
	if c.spawn != nil {
		c.spawn.Close()
	}
	rmErr := removeAll(c.rootDir)
	c.log.Info("pgcluster: cluster stopped", "port", c.Port)
	return errors.Join(stopErr, rmErr)
}

// Restart stops the server with a fast shutdown and starts it again on the
// same port and data directory, so tests can simulate a server restart.
// Connections open before the restart are closed by the server.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrStopped
	}
	if err := c.stopServer(); err != nil {
		return err
	}
	// The port is fixed now, so if another process grabbed it in the
	// meantime, wait a little for it to go rather than move.
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		err = c.launchAndWait(ctx)
		if !errors.Is(err, errPortInUse) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: restart: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
	if err != nil {
		return fmt.Errorf("pgcluster: restart: %w", err)
	}
	c.log.Info("pgcluster: cluster restarted", "port", c.Port)
	return nil
}

// URL returns a postgres:// URL over TCP to Host:Port. It uses
// sslmode=disable, or sslmode=prefer when the cluster has SSL, so it works
// with both pgx and libpq tools such as psql and pgbench. An empty password
// leaves the password out.
func (c *Cluster) URL(user, password, database string) string {
	u := url.URL{
		Scheme: "postgres",
		Host:   net.JoinHostPort(c.Host, strconv.Itoa(c.Port)),
		Path:   "/" + database,
	}
	if password != "" {
		u.User = url.UserPassword(user, password)
	} else {
		u.User = url.User(user)
	}
	mode := "disable"
	if c.opts.SSL {
		mode = "prefer"
	}
	u.RawQuery = url.Values{"sslmode": {mode}}.Encode()
	return u.String()
}

// SuperURL returns URL for the superuser with its password.
func (c *Cluster) SuperURL(database string) string {
	return c.URL(c.SuperUser, c.SuperPassword, database)
}

// socketConnString is a keyword/value connection string for the superuser
// over the Unix socket, which is always trusted, so it works whatever Auth is.
func (c *Cluster) socketConnString(database string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable",
		quoteConnValue(c.SocketDir), c.Port, quoteConnValue(c.SuperUser), quoteConnValue(database))
}

// Exec runs sql (one or more statements, simple protocol) as the superuser
// in the "postgres" database over the Unix socket, for test set-up such as
// creating tables, roles or databases.
func (c *Cluster) Exec(ctx context.Context, sql string) error {
	conn, err := pgconn.Connect(ctx, c.socketConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: connect: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("pgcluster: exec: %w", err)
	}
	return nil
}

// LogTail returns up to the last 50 lines of the server log, for test
// failure messages.
func (c *Cluster) LogTail() string {
	return c.logTail()
}

func (c *Cluster) logTail() string {
	f, err := os.Open(c.logPath)
	if err != nil {
		return fmt.Sprintf("(no server log: %v)", err)
	}
	defer f.Close()
	const max = 16 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(fi.Size()-max, io.SeekStart)
	}
	data, _ := io.ReadAll(f)
	return tailLines(string(data), 50)
}

// chown gives paths to the server's user when running as root.
func (c *Cluster) chown(paths ...string) error {
	if c.cred == nil {
		return nil
	}
	for _, p := range paths {
		if err := os.Chown(p, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: chown %s: %w", p, err)
		}
	}
	return nil
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before postgres binds it; Start retries in that case.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: pick free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pgcluster: pick free port: %w", err)
	}
	return port, nil
}

// childEnv is this process's environment without libpq and locale
// variables that would change what initdb and postgres do, and with the C
// locale so server messages (which Start matches) are in English.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PG") || strings.HasPrefix(k, "LC_") || k == "LANG" || k == "LANGUAGE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C", "LANG=C")
}

// removeAll removes dir, retrying briefly because backends of a killed
// postmaster may still be writing while they exit.
func removeAll(dir string) error {
	var err error
	for i := 0; i < 5; i++ {
		if err = os.RemoveAll(dir); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("pgcluster: remove %s: %w", dir, err)
}

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// quoteIdent quotes a SQL identifier.
func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// quoteLiteral quotes a SQL string literal, assuming
// standard_conforming_strings=on (the default since PostgreSQL 9.1).
func quoteLiteral(s string) string {
	return `'` + strings.ReplaceAll(s, `'`, `''`) + `'`
}

// quoteConnValue quotes a keyword/value connection string value.
func quoteConnValue(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, `'`, `\'`)
	return `'` + s + `'`
}
