// Package pgregress runs PostgreSQL's own regression suite (pg_regress with
// the parallel schedule) against a throwaway cluster directly and through
// an in-process pgquic in session and transaction mode, so the pooler is
// checked against the thousands of statements PostgreSQL tests itself with.
// The suite's files are not part of this repository: they come from the
// PostgreSQL source tree of the server's version (src/test/regress), in a
// directory given to the runner. scripts/pg-regress installs what it needs,
// builds the test library and runs cmd/pgregress.
package pgregress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/driversuite"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/internal/pgcluster"
	"github.com/pgquic/pgquic/pooler"
)

// Mode names a way of reaching PostgreSQL: directly, or through pgquic in
// session or transaction mode. It is the driver suites' (driversuite.Mode),
// so both runners read the same --modes.
type Mode = driversuite.Mode

// The modes.
const (
	Direct      = driversuite.Direct
	Session     = driversuite.Session
	Transaction = driversuite.Transaction
)

// ParseMode checks a mode name given on a command line.
func ParseMode(s string) (Mode, error) { return driversuite.ParseMode(s) }

// Database is the database the suite runs in, created for each run.
const Database = "regression"

// Options say where the suite and its tools are and how to run it.
type Options struct {
	// RegressDir holds the suite: sql/, expected/, data/, parallel_schedule
	// and resultmap. It is copied, so it may be read-only. Required.
	RegressDir string
	// LibDir holds regress.so, autoinc.so and refint.so (pg_regress's
	// --dlpath). Required.
	LibDir string
	// PgRegress is the pg_regress program. Required.
	PgRegress string
	// BinDir holds psql (pg_regress's --bindir). Default: the directory
	// internal/pgcluster finds the server binaries in.
	BinDir string
	// Out receives, per mode, the pg_regress output and its diffs.
	// Required.
	Out string
	// PoolSize is the pooler's server connections per (database, user).
	// Default 20, pgquic serve's default.
	PoolSize int
	// MaxConcurrent bounds the tests pg_regress runs at once. Default 20,
	// the parallel schedule's widest group.
	MaxConcurrent int
	// TestTimeout bounds one test (its psql is killed after it, and the
	// test counted as hung). pg_regress has no timeout of its own. Default
	// 3 minutes.
	TestTimeout time.Duration
	// Logger receives the pooler's and the cluster's messages; nil
	// discards them.
	Logger *slog.Logger
}

func (o *Options) populate() error {
	if o.RegressDir == "" || o.LibDir == "" || o.PgRegress == "" || o.Out == "" {
		return errors.New("pgregress: RegressDir, LibDir, PgRegress and Out are required")
	}
	if o.BinDir == "" {
		dir, err := pgcluster.Binaries()
		if err != nil {
			return fmt.Errorf("pgregress: %w", err)
		}
		o.BinDir = dir
	}
	if _, err := os.Stat(filepath.Join(o.BinDir, "psql")); err != nil {
		return fmt.Errorf("pgregress: no psql in %s: give BinDir (-bindir) the directory of the server version's psql: %w", o.BinDir, err)
	}
	if o.PoolSize == 0 {
		o.PoolSize = 20
	}
	if o.MaxConcurrent == 0 {
		o.MaxConcurrent = 20
	}
	if o.TestTimeout == 0 {
		o.TestTimeout = 3 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Result is one mode's run.
type Result struct {
	Mode     Mode
	Tests    map[string]string // test name: "ok" or "failed", as pg_regress printed it
	Hung     []string          // tests killed after TestTimeout
	Duration time.Duration
	// Harm lists changes the run made outside its own database: objects
	// in the postgres and template1 databases, counted before and after.
	Harm []string
	// Globals lists cluster-wide objects (roles, databases, database and
	// role settings) the run left behind: reported, as the suite itself
	// leaves some even directly.
	Globals []string
}

// Failed returns the tests that failed, hung ones included, sorted.
func (r *Result) Failed() []string {
	var out []string
	for name, st := range r.Tests {
		if st != "ok" {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Counts returns the numbers of tests that passed and failed.
func (r *Result) Counts() (ok, failed int) {
	for _, st := range r.Tests {
		if st == "ok" {
			ok++
		} else {
			failed++
		}
	}
	return ok, failed
}

// Run runs the suite once in mode m against a fresh cluster, so one mode's
// leftovers (roles, tablespaces, settings) cannot change the next.
func Run(ctx context.Context, o Options, m Mode) (*Result, error) {
	if err := o.populate(); err != nil {
		return nil, err
	}
	start := time.Now()
	c, err := pgcluster.Start(ctx, pgcluster.Options{
		Settings: map[string]string{"max_connections": "300", "max_prepared_transactions": "10"},
		Logger:   o.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("pgregress: start PostgreSQL: %w", err)
	}
	defer func() { _ = c.Stop() }()
	// As pg_regress creates its database when it makes one itself.
	if err := c.Exec(ctx, "CREATE DATABASE "+Database+" TEMPLATE=template0"); err != nil {
		return nil, fmt.Errorf("pgregress: %w", err)
	}
	if err := c.Exec(ctx, "ALTER DATABASE "+Database+" SET lc_messages TO 'C'; "+
		"ALTER DATABASE "+Database+" SET lc_monetary TO 'C'; ALTER DATABASE "+Database+" SET lc_numeric TO 'C'; "+
		"ALTER DATABASE "+Database+" SET lc_time TO 'C'; ALTER DATABASE "+Database+" SET bytea_output TO 'hex'; "+
		"ALTER DATABASE "+Database+" SET timezone_abbreviations TO 'Default'"); err != nil {
		return nil, fmt.Errorf("pgregress: %w", err)
	}
	before, err := snapshot(ctx, c)
	if err != nil {
		return nil, err
	}

	port := c.Port
	if m != Direct {
		sp, err := startPooler(c, m, o)
		if err != nil {
			return nil, err
		}
		defer sp.close()
		port = sp.port
	}

	dir := filepath.Join(o.Out, string(m))
	if err := prepareDir(o.RegressDir, dir); err != nil {
		return nil, err
	}
	tests, hung, err := runPgRegress(ctx, o, dir, c.Host, port, c.SuperUser)
	if err != nil {
		return nil, err
	}
	r := &Result{Mode: m, Tests: tests, Hung: hung}
	for _, name := range hung {
		r.Tests[name] = "failed"
	}
	after, err := snapshot(ctx, c)
	if err != nil {
		return nil, err
	}
	r.Harm, r.Globals = before.diff(after)
	r.Duration = time.Since(start)
	return r, nil
}

// prepareDir copies the suite into dir, owned by the user the server runs
// as: the server reads data/ and writes into results/ (COPY ... TO).
func prepareDir(src, dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("pgregress: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("pgregress: %w", err)
	}
	if out, err := exec.Command("cp", "-R", src, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("pgregress: copy %s: %w: %s", src, err, out)
	}
	if out, err := exec.Command("chmod", "-R", "u+w", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("pgregress: chmod %s: %w: %s", dir, err, out) // the source may be read-only
	}
	if err := os.MkdirAll(filepath.Join(dir, "results"), 0o755); err != nil {
		return fmt.Errorf("pgregress: %w", err)
	}
	if cred := serverCred(); cred != nil {
		if out, err := exec.Command("chown", "-R", fmt.Sprintf("%d:%d", cred.Uid, cred.Gid), dir).CombinedOutput(); err != nil {
			return fmt.Errorf("pgregress: chown %s: %w: %s", dir, err, out)
		}
		// The server, running as that user, must reach dir.
		for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
			if st, err := os.Stat(d); err == nil && st.Mode().Perm()&0o001 == 0 {
				_ = os.Chmod(d, st.Mode().Perm()|0o011)
			}
		}
	}
	return nil
}

// serverCred is the credential of the postgres system user when running
// as root, as internal/pgcluster runs the server; nil otherwise. pg_regress
// and its psql run under it too, so the files they and the server write
// belong to one user.
func serverCred() *syscall.Credential {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// launcher runs each test's psql under timeout and, when it has to kill
// it, records the test (psql's standard input is the test's sql file) in
// hung.txt. It is pg_regress's --launcher.
const launcher = `#!/bin/sh
timeout -s KILL "$PGREGRESS_TEST_TIMEOUT" "$@"
rc=$?
if [ "$rc" -eq 137 ] || [ "$rc" -eq 124 ]; then
	t=$(readlink /proc/$$/fd/0)
	t=${t##*/}
	echo "${t%.sql}" >>"$PGREGRESS_HUNG"
fi
exit "$rc"
`

// runPgRegress runs pg_regress in dir against host:port and returns each
// test's status and the tests killed after the timeout.
func runPgRegress(ctx context.Context, o Options, dir, host string, port int, user string) (map[string]string, []string, error) {
	launch := filepath.Join(dir, "launch.sh")
	if err := os.WriteFile(launch, []byte(launcher), 0o755); err != nil {
		return nil, nil, fmt.Errorf("pgregress: %w", err)
	}
	hungFile := filepath.Join(dir, "hung.txt")
	args := []string{
		"--inputdir=" + dir, "--outputdir=" + dir, "--bindir=" + o.BinDir, "--dlpath=" + o.LibDir,
		"--schedule=" + filepath.Join(dir, "parallel_schedule"),
		"--max-concurrent-tests=" + strconv.Itoa(o.MaxConcurrent),
		"--host=" + host, "--port=" + strconv.Itoa(port), "--user=" + user,
		"--use-existing", "--dbname=" + Database, "--launcher=" + launch,
	}
	cmd := exec.CommandContext(ctx, o.PgRegress, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"PGREGRESS_TEST_TIMEOUT="+strconv.Itoa(int(o.TestTimeout.Seconds())),
		"PGREGRESS_HUNG="+hungFile,
		"PGPASSWORD=postgres", "PGSSLMODE=disable",
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if cred := serverCred(); cred != nil {
		cmd.SysProcAttr.Credential = cred
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	logFile, err := os.Create(filepath.Join(dir, "pg_regress.log"))
	if err != nil {
		return nil, nil, fmt.Errorf("pgregress: %w", err)
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	runErr := cmd.Run()
	var ee *exec.ExitError
	if runErr != nil && !(errors.As(runErr, &ee) && ee.ExitCode() == 1) {
		return nil, nil, fmt.Errorf("pgregress: pg_regress: %w (see %s)", runErr, logFile.Name())
	}
	if _, err := logFile.Seek(0, io.SeekStart); err != nil {
		return nil, nil, fmt.Errorf("pgregress: %w", err)
	}
	out, err := io.ReadAll(logFile)
	if err != nil {
		return nil, nil, fmt.Errorf("pgregress: %w", err)
	}
	tests := ParseOutput(string(out))
	if len(tests) == 0 {
		return nil, nil, fmt.Errorf("pgregress: pg_regress ran no test (see %s)", logFile.Name())
	}
	var hung []string
	if b, err := os.ReadFile(hungFile); err == nil {
		hung = strings.Fields(string(b))
		sort.Strings(hung)
	}
	return tests, hung, nil
}

// testLine matches pg_regress's line for one finished test, serial
// ("test name ... ok 12 ms") or in a parallel group ("     name ... FAILED").
var testLine = regexp.MustCompile(`^(?:test\s+|\s+)(\S+)\s+\.\.\.\s+(ok|FAILED|failed \(ignored\))`)

// ParseOutput reads each test's status from pg_regress's output: "ok" or
// "failed".
func ParseOutput(out string) map[string]string {
	tests := make(map[string]string)
	for _, line := range strings.Split(out, "\n") {
		m := testLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		st := "failed"
		if m[2] == "ok" {
			st = "ok"
		}
		tests[m[1]] = st
	}
	return tests
}

// counts are what a run must not change outside its database: per
// database, the number of rows in catalogs of objects a statement can
// create; cluster-wide, roles, databases and their settings.
type counts struct {
	local  map[string]int64 // "database.catalog"
	global map[string]int64
}

// localCatalogs are counted in postgres and template1.
var localCatalogs = []string{
	"pg_class", "pg_proc", "pg_type", "pg_namespace", "pg_operator", "pg_trigger", "pg_extension",
	"pg_event_trigger", "pg_publication", "pg_language", "pg_cast", "pg_collation", "pg_ts_config",
	"pg_default_acl", "pg_largeobject_metadata", "pg_policy", "pg_rewrite", "pg_statistic_ext",
	"pg_foreign_server", "pg_foreign_data_wrapper", "pg_user_mapping", "pg_opclass", "pg_amop",
	"pg_conversion", "pg_attribute", "pg_constraint", "pg_index", "pg_description",
}

// globalCatalogs are counted once.
var globalCatalogs = []string{"pg_authid", "pg_database", "pg_db_role_setting", "pg_tablespace", "pg_subscription", "pg_shdescription"}

func snapshot(ctx context.Context, c *pgcluster.Cluster) (*counts, error) {
	s := &counts{local: map[string]int64{}, global: map[string]int64{}}
	for _, db := range []string{"postgres", "template1"} {
		if err := countInto(ctx, c, db, localCatalogs, db+".", s.local); err != nil {
			return nil, err
		}
	}
	if err := countInto(ctx, c, "postgres", globalCatalogs, "", s.global); err != nil {
		return nil, err
	}
	return s, nil
}

func countInto(ctx context.Context, c *pgcluster.Cluster, db string, catalogs []string, prefix string, into map[string]int64) error {
	conn, err := pgconn.Connect(ctx, c.SuperURL(db))
	if err != nil {
		return fmt.Errorf("pgregress: connect to %s: %w", db, err)
	}
	defer conn.Close(context.Background())
	var q strings.Builder
	for i, cat := range catalogs {
		if i > 0 {
			q.WriteString(" UNION ALL ")
		}
		fmt.Fprintf(&q, "SELECT '%s', count(*) FROM %s", cat, cat)
	}
	res := conn.ExecParams(ctx, q.String(), nil, nil, nil, nil).Read()
	if res.Err != nil {
		return fmt.Errorf("pgregress: counting objects in %s: %w", db, res.Err)
	}
	for _, row := range res.Rows {
		n, err := strconv.ParseInt(string(row[1]), 10, 64)
		if err != nil {
			return fmt.Errorf("pgregress: count of %s: %w", row[0], err)
		}
		into[prefix+string(row[0])] = n
	}
	return nil
}

// diff lists the counts that changed.
func (s *counts) diff(after *counts) (local, global []string) {
	cmp := func(a, b map[string]int64) []string {
		var out []string
		for k, v := range a {
			if b[k] != v {
				out = append(out, fmt.Sprintf("%s: %d before, %d after", k, v, b[k]))
			}
		}
		sort.Strings(out)
		return out
	}
	return cmp(s.local, after.local), cmp(s.global, after.global)
}

// poolerProc is an in-process pgquic in front of a cluster.
type poolerProc struct {
	mgr    *backend.Manager
	p      *pooler.Pooler
	ln     net.Listener
	cancel context.CancelFunc
	wg     sync.WaitGroup
	port   int
}

// startPooler starts pgquic in mode m with its defaults otherwise
// (role_changes=refuse, session_state=pin) and a wildcard route: server
// connections log in as the client's user, as pg_regress's tests expect
// when they \c as other roles.
func startPooler(c *pgcluster.Cluster, m Mode, o Options) (*poolerProc, error) {
	pm := pooler.ModeSession
	if m == Transaction {
		pm = pooler.ModeTransaction
	}
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := backend.NewManager(ctx, backend.ManagerConfig{
		Routes: []backend.Route{{Database: backend.Wildcard, PoolConfig: backend.PoolConfig{
			ConnString: fmt.Sprintf("postgres://%s:%s@%s:%d/postgres?sslmode=disable", c.SuperUser, c.SuperPassword, c.Host, c.Port),
		}}},
		Defaults: backend.PoolConfig{PoolSize: o.PoolSize, ConnectTimeout: 30 * time.Second},
	}, o.Logger, nil)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("pgregress: backend.NewManager: %w", err)
	}
	trust, err := pgauth.New(pgauth.Config{Method: pgauth.MethodTrust, TrustLoopbackOnly: true})
	if err != nil {
		cancel()
		mgr.Close()
		return nil, fmt.Errorf("pgregress: trust authentication: %w", err)
	}
	p, err := pooler.New(pooler.Config{Mode: pm, Auth: trust, AcquireTimeout: 2 * time.Minute}, mgr, o.Logger, nil)
	if err != nil {
		cancel()
		mgr.Close()
		return nil, fmt.Errorf("pgregress: pooler.New: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		mgr.Close()
		return nil, fmt.Errorf("pgregress: listen: %w", err)
	}
	sp := &poolerProc{mgr: mgr, p: p, ln: ln, cancel: cancel, port: ln.Addr().(*net.TCPAddr).Port}
	sp.wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			sp.wg.Go(func() { _ = p.Serve(ctx, conn, pooler.Peer{Addr: conn.RemoteAddr(), Transport: "tcp"}) })
		}
	})
	return sp, nil
}

// close drains the pooler for up to 30 seconds, then stops it.
func (sp *poolerProc) close() {
	_ = sp.ln.Close()
	ctx, done := context.WithTimeout(context.Background(), 30*time.Second)
	_ = sp.p.Shutdown(ctx)
	done()
	sp.cancel()
	sp.wg.Wait()
	sp.mgr.Close()
}
