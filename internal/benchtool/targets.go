package benchtool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Target names accepted by --targets.
const (
	targetDirect   = "direct"
	targetPgquic   = "pgquic"
	targetNoPipe   = "pgquic-nopipe"
	targetBouncer  = "pgbouncer"
	targetRelay    = "relay"
	targetBaseline = "baseline"
	pipelineFlag   = "pipeline-depth"
	serveReadyWait = 30 * time.Second
)

// allTargets is the default --targets, in the order runs interleave.
var allTargets = []string{targetDirect, targetPgquic, targetNoPipe, targetBouncer}

// knownTargets are every target --targets accepts: the defaults, the
// relay (bare-relay, benchtool.Relay), a diagnostic asked for by name, and
// the baseline (another pgquic build).
var knownTargets = append(slices.Clone(allTargets), targetRelay, targetBaseline)

// target is one place pgbench connects to: PostgreSQL itself or a pooler
// process in front of it.
type target struct {
	name  string
	port  int
	proc  *child                // nil for direct
	pid   func() int            // the pooler process to measure; nil for direct
	skip  map[string]skipReason // query mode -> why this target cannot run it
	flags string                // how the pooler was started, for the report
}

// backendPerClient reports whether each pgbench client gets a PostgreSQL
// backend of its own through this target (direct, relay), whose start
// the measurement window leaves out.
func (t *target) backendPerClient() bool {
	return t.name == targetDirect || t.name == targetRelay
}

// skipReason says why a target does not run a query mode: short for the
// medians tables ("not supported by PgBouncer 1.18.0"), why for the notes.
type skipReason struct {
	short, why string
}

// freePort asks the kernel for a free loopback TCP port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// hasPipelineFlag reports whether `pgquic serve --help` lists
// --pipeline-depth, the switch for cross-client pipelining.
func hasPipelineFlag(bin string) (bool, error) {
	out, err := exec.Command(bin, "serve", "--help").CombinedOutput()
	if len(out) == 0 && err != nil {
		return false, fmt.Errorf("%s serve --help: %w", bin, err)
	}
	return bytes.Contains(out, []byte("-"+pipelineFlag)), nil
}

// startPgquic runs `pgquic serve` in transaction mode on a free port with
// only the TCP front, in front of the bench database's server.
func (e *env) startPgquic(ctx context.Context, name string, extra []string) (*target, error) {
	return e.startPgquicBin(ctx, e.cfg.PgquicBin, name, extra)
}

// startPgquicBin runs the pgquic binary bin as target name.
func (e *env) startPgquicBin(ctx context.Context, bin, name string, extra []string) (*target, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	backend := fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d/%s?sslmode=disable", e.cluster.Port, benchDB)
	args := []string{"serve", "--backend", backend,
		"--tcp-listen", fmt.Sprintf("127.0.0.1:%d", port), "--quic-listen", "", "--metrics-listen", "",
		"--pool-size", strconv.Itoa(e.cfg.Pool), "--min-pool", strconv.Itoa(e.cfg.Pool),
		"--mode", "transaction", "--log-level", "warn"}
	args = append(args, extra...)
	return e.startLogged(ctx, &target{name: name, port: port,
		flags: strings.Join(append([]string{"--pool-size", strconv.Itoa(e.cfg.Pool)}, extra...), " ")},
		bin, args...)
}

// startRelay runs the relay target (bare-relay) on a free port in front
// of the bench database's server: one server connection per client, no
// pooling.
func (e *env) startRelay(ctx context.Context) (*target, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	return e.startLogged(ctx, &target{name: targetRelay, port: port,
		flags: "a goroutine per direction and raw socket calls, a server connection per client"},
		e.cfg.RelayBin, "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--upstream", fmt.Sprintf("127.0.0.1:%d", e.cluster.Port))
}

// startLogged runs bin with args as target t (name, port and flags set),
// its output in the work directory's <name>.log, and waits until a query
// through it works.
func (e *env) startLogged(ctx context.Context, t *target, bin string, args ...string) (*target, error) {
	logf, err := os.Create(filepath.Join(e.workDir, t.name+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	c, err := e.spawn.start(t.name, cmd, nil)
	if err != nil {
		return nil, err
	}
	e.children = append(e.children, c)
	t.proc, t.pid = c, c.pid
	if err := e.waitServing(ctx, t, logf.Name()); err != nil {
		return nil, err
	}
	return t, nil
}

// bouncerPreparedSince is the first PgBouncer release that keeps
// protocol-level prepared statements in transaction mode, with its
// max_prepared_statements setting; older ones cannot run -M prepared.
var bouncerPreparedSince = [2]int{1, 21}

// bouncerMaxPrepared is max_prepared_statements in the generated config:
// far above the one statement pgbench -S prepares, so PgBouncer never
// evicts it.
const bouncerMaxPrepared = 200

// bouncerVersionRE matches `pgbouncer --version`'s first line, e.g.
// "PgBouncer 1.18.0" or "PgBouncer 1.23.1-fixed" (old releases said
// "pgbouncer version 1.7.2").
var bouncerVersionRE = regexp.MustCompile(`(?i)pgbouncer (?:version )?(\d+)\.(\d+)[.0-9]*`)

// pgbouncerVersion runs `pgbouncer --version` and parses its output.
func pgbouncerVersion(bin string) (string, [2]int, error) {
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", [2]int{}, fmt.Errorf("%s --version: %w", bin, err)
	}
	name, ver, err := parseBouncerVersion(out)
	if err != nil {
		return "", [2]int{}, fmt.Errorf("%s --version: %w", bin, err)
	}
	return name, ver, nil
}

// parseBouncerVersion finds PgBouncer's name and version in the output of
// `pgbouncer --version`: the name as the report prints it ("PgBouncer
// 1.25.2") and the major and minor numbers the config depends on.
func parseBouncerVersion(out []byte) (string, [2]int, error) {
	m := bouncerVersionRE.FindSubmatch(out)
	if m == nil {
		return "", [2]int{}, fmt.Errorf("no PgBouncer version in %q", out)
	}
	maj, err1 := strconv.Atoi(string(m[1]))
	mnr, err2 := strconv.Atoi(string(m[2]))
	if err := errors.Join(err1, err2); err != nil {
		return "", [2]int{}, fmt.Errorf("PgBouncer version in %q: %w", out, err)
	}
	ver := strings.TrimPrefix(strings.ToLower(string(m[0])), "pgbouncer ")
	return "PgBouncer " + strings.TrimPrefix(ver, "version "), [2]int{maj, mnr}, nil
}

// bouncerKeepsPrepared reports whether PgBouncer version v keeps
// protocol-level prepared statements in transaction mode.
func bouncerKeepsPrepared(v [2]int) bool {
	return v[0] > bouncerPreparedSince[0] || v[0] == bouncerPreparedSince[0] && v[1] >= bouncerPreparedSince[1]
}

// bouncerConf is what PgBouncer's generated configuration depends on.
type bouncerConf struct {
	name       string // "PgBouncer 1.18.0", from --version
	ver        [2]int
	serverPort int    // PostgreSQL's port
	port       int    // PgBouncer's listening port
	dir        string // its config, auth file and log
	pool       int
}

// bouncerSetup generates pgbouncer.ini for the bench database in
// transaction mode with the pool size pgquic gets, the description of it
// for the report, and the query modes this version cannot run: with 1.21
// and later max_prepared_statements makes -M prepared work, before that
// PgBouncer would pass pgbench's named statements to whichever server
// connection the next transaction gets and every client would fail, so
// -M prepared is reported as not supported instead of measured.
func bouncerSetup(c bouncerConf) (ini, flags string, skip map[string]skipReason) {
	extra := ""
	flags = fmt.Sprintf("%s, pool_mode = transaction, default_pool_size = %d", c.name, c.pool)
	skip = map[string]skipReason{}
	if bouncerKeepsPrepared(c.ver) {
		extra = fmt.Sprintf("max_prepared_statements = %d\n", bouncerMaxPrepared)
		flags += fmt.Sprintf(", max_prepared_statements = %d", bouncerMaxPrepared)
	} else {
		skip["prepared"] = skipReason{
			short: "not supported by " + c.name,
			why: fmt.Sprintf("it keeps no prepared statements in transaction mode (%d.%d and later do, with max_prepared_statements)",
				bouncerPreparedSince[0], bouncerPreparedSince[1]),
		}
	}
	ini = fmt.Sprintf(`[databases]
%[1]s = host=127.0.0.1 port=%[2]d dbname=%[1]s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[3]d
unix_socket_dir =
auth_type = trust
auth_file = %[4]s/userlist.txt
pool_mode = transaction
default_pool_size = %[5]d
min_pool_size = %[5]d
max_client_conn = 5000
ignore_startup_parameters = extra_float_digits
logfile = %[4]s/pgbouncer.log
%[6]s`, benchDB, c.serverPort, c.port, c.dir, c.pool, extra)
	return ini, flags, skip
}

// startPgBouncer runs PgBouncer in transaction mode with the same pool
// size (bouncerSetup). As root it runs as the postgres user, since
// PgBouncer refuses root.
func (e *env) startPgBouncer(ctx context.Context) (*target, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(e.workDir, "pgbouncer")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	ini, flags, skip := bouncerSetup(bouncerConf{name: e.bouncerName, ver: e.bouncerVer,
		serverPort: e.cluster.Port, port: port, dir: dir, pool: e.cfg.Pool})
	for name, body := range map[string]string{
		"pgbouncer.ini": ini,
		"userlist.txt":  "\"postgres\" \"\"\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return nil, err
		}
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, PgBouncer needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(e.cfg.PgbouncerBin, filepath.Join(dir, "pgbouncer.ini"))
	c, err := e.spawn.start(targetBouncer, cmd, cred)
	if err != nil {
		return nil, err
	}
	e.children = append(e.children, c)
	t := &target{name: targetBouncer, port: port, proc: c, pid: c.pid, skip: skip, flags: flags}
	if err := e.waitServing(ctx, t, filepath.Join(dir, "pgbouncer.log")); err != nil {
		return nil, err
	}
	return t, nil
}

// waitServing polls until a query through the target works, the process
// exits or serveReadyWait passes; errors carry the end of its log.
func (e *env) waitServing(ctx context.Context, t *target, logPath string) error {
	url := fmt.Sprintf("postgres://postgres:postgres@127.0.0.1:%d/%s?sslmode=disable", t.port, benchDB)
	deadline := time.Now().Add(serveReadyWait)
	var lastErr error
	for {
		if t.proc.exited() {
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("%s exited at start: %v\n%s", t.name, t.proc.err, tail(string(b), 15))
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgconn.Connect(qctx, url)
		if err == nil {
			_, err = conn.Exec(qctx, "SELECT 1").ReadAll()
			conn.Close(qctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		lastErr = err
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("%s not serving after %v: %w\n%s", t.name, serveReadyWait, lastErr, tail(string(b), 15))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lookBin finds a program on PATH or at one of the fallback paths.
func lookBin(name string, fallbacks ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, f := range fallbacks {
		if st, err := os.Stat(f); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return f, nil
		}
	}
	return "", errors.New(name + " not found")
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
