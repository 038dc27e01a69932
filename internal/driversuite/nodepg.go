package driversuite

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// NodePostgresVersion is the node-postgres release whose integration tests
// testdata/ holds and whose library npm installs (Debian 12's
// node-postgres source package is this release).
const NodePostgresVersion = "8.8.0"

// nodeDeps pins pg and its sibling packages to the releases published with
// pg 8.8.0, plus the test-only packages its integration tests require.
var nodeDeps = map[string]string{
	"pg":                   NodePostgresVersion,
	"pg-pool":              "3.5.2",
	"pg-protocol":          "1.5.0",
	"pg-connection-string": "2.5.0",
	"pg-types":             "2.2.0",
	"pgpass":               "1.0.5",
	"async":                "2.6.4",
	"bluebird":             "3.5.2",
	"co":                   "4.6.0",
	"pg-copy-streams":      "0.3.0",
}

// NodePostgres runs node-postgres' integration tests
// (packages/pg/test/integration/**/*-tests.js), one node process per file
// as its Makefile does. Each file's exit status is one result; each case the
// suite's runner prints ("  name ✔") is another, "file :: name".
type NodePostgres struct {
	// Src is a directory holding packages/pg/test (testdata's copy, a
	// Debian source package or a node-postgres checkout).
	Src string
	// Work is where the runnable tree is assembled: the tests next to pg's
	// lib/ and node_modules from npm. Kept between runs.
	Work string
	// Files, when set, limits the run to these files (paths relative to
	// packages/pg/test/integration).
	Files []string
	// FileTimeout bounds one file's run. Default: 2 minutes.
	FileTimeout time.Duration
}

// Name is the suite's name in reports.
func (s *NodePostgres) Name() string { return "node-postgres " + NodePostgresVersion }

// pgDir is the assembled package directory the tests run in.
func (s *NodePostgres) pgDir() string { return filepath.Join(s.Work, "packages", "pg") }

// Prepare assembles the runnable tree: copies the tests, installs pg and
// the test packages with npm once (idempotent: a matching
// node_modules/pg is kept), and puts pg's lib/ where the tests require it.
func (s *NodePostgres) Prepare(ctx context.Context) error {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("driversuite: node-postgres needs %s: %w", tool, err)
		}
	}
	srcTest := filepath.Join(s.Src, "packages", "pg", "test")
	if _, err := os.Stat(filepath.Join(srcTest, "integration")); err != nil {
		return fmt.Errorf("driversuite: node-postgres tests not found in %s: %w", s.Src, err)
	}
	dir := s.pgDir()
	if err := os.RemoveAll(filepath.Join(dir, "test")); err != nil {
		return err
	}
	if err := copyTree(srcTest, filepath.Join(dir, "test")); err != nil {
		return fmt.Errorf("driversuite: copy node-postgres tests: %w", err)
	}
	pkg, err := json.MarshalIndent(map[string]any{
		"name": "pgquic-node-postgres-suite", "private": true, "dependencies": nodeDeps,
	}, "", "  ")
	if err != nil {
		return err
	}
	pkgFile := filepath.Join(dir, "package.json")
	old, _ := os.ReadFile(pkgFile)
	installed := nodePackageVersion(filepath.Join(dir, "node_modules", "pg")) == NodePostgresVersion
	if !installed || !bytes.Equal(old, pkg) {
		if err := os.WriteFile(pkgFile, pkg, 0o644); err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--no-package-lock", "--loglevel=error")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("driversuite: npm install in %s: %w\n%s", dir, err, out)
		}
	}
	if err := os.RemoveAll(filepath.Join(dir, "lib")); err != nil {
		return err
	}
	return copyTree(filepath.Join(dir, "node_modules", "pg", "lib"), filepath.Join(dir, "lib"))
}

// nodePackageVersion reads the version of the npm package in dir, or "".
func nodePackageVersion(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		return ""
	}
	var p struct {
		Version string `json:"version"`
	}
	if json.Unmarshal(b, &p) != nil {
		return ""
	}
	return p.Version
}

// files lists the test files to run, relative to test/integration.
func (s *NodePostgres) files() ([]string, error) {
	if len(s.Files) > 0 {
		return s.Files, nil
	}
	root := filepath.Join(s.pgDir(), "test", "integration")
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, "-tests.js") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	sort.Strings(files)
	return files, err
}

// Run runs every file against e and collects the outcomes. The person
// table the tests read (node-postgres' script/create-test-tables.js) is
// made first.
func (s *NodePostgres) Run(ctx context.Context, e Endpoint, m Mode, logDir string) (*Result, error) {
	if err := createPersonTable(ctx, e); err != nil {
		return nil, err
	}
	files, err := s.files()
	if err != nil {
		return nil, err
	}
	timeout := s.FileTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	env := append(os.Environ(),
		"PGHOST="+e.Host, "PGPORT="+strconv.Itoa(e.Port), "PGUSER="+e.User,
		"PGPASSWORD="+e.Password, "PGDATABASE="+e.Database, "PGSSLMODE=disable")
	res := newResult(s.Name(), m, "files")
	var log bytes.Buffer
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		out, runErr := runNode(ctx, s.pgDir(), filepath.Join("test", "integration", f), env, timeout)
		fmt.Fprintf(&log, "===== %s (%v)\n%s\n", f, runErr, out)
		parseNodeOutput(res, f, out, runErr)
	}
	if logDir != "" {
		if err := os.WriteFile(filepath.Join(logDir, "node-postgres-"+string(m)+".log"), log.Bytes(), 0o644); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// runNode runs one test file in its own process group, killed whole when
// it outlives timeout (a hung test leaves sockets and timers behind).
func runNode(ctx context.Context, dir, file string, env []string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", file)
	cmd.Dir = dir
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if ctx.Err() != nil && err != nil {
		err = fmt.Errorf("killed after %v: %w", timeout, err)
	}
	return out.String(), err
}

var (
	// nodeCaseRE matches the suite runner's per-case lines: "  name ✔",
	// "  name ? - SKIPPED", "  name FAILED!".
	nodeCaseRE = regexp.MustCompile(`^  (\S.*?) (✔|\? - SKIPPED|FAILED!)$`)
	// nodeTimeoutRE matches the runner's own per-case timeout message.
	nodeTimeoutRE = regexp.MustCompile(`test: (.+) did not complete withint`)
)

// parseNodeOutput records the file's outcome (its exit status) and each
// case the output reports. A case name seen twice in a file gets "#2"...
func parseNodeOutput(res *Result, file, out string, runErr error) {
	seen := map[string]int{}
	id := func(name string) string {
		seen[name]++
		if n := seen[name]; n > 1 {
			name = fmt.Sprintf("%s #%d", name, n)
		}
		return file + " :: " + name
	}
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimRight(line, "\r")
		if m := nodeCaseRE.FindStringSubmatch(line); m != nil {
			switch m[2] {
			case "✔":
				res.set(id(m[1]), Pass, "")
			case "FAILED!":
				res.set(id(m[1]), Fail, tail(out, 12))
			default:
				res.set(id(m[1]), Skip, "")
			}
			continue
		}
		if m := nodeTimeoutRE.FindStringSubmatch(line); m != nil {
			res.set(id(m[1]), Fail, "timed out (5s)")
		}
	}
	if runErr != nil {
		var ee *exec.ExitError
		why := runErr.Error()
		if errors.As(runErr, &ee) {
			why = ee.String()
		}
		res.set(file, Fail, why+": "+failureSummary(out))
		return
	}
	res.set(file, Pass, "")
}

// failureSummary picks the most telling line of a failed file's output:
// the first "Error"/"Message:" line, else the last line.
func failureSummary(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "Message:") || strings.Contains(t, "Error:") || strings.Contains(t, "Error [") {
			return t
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// createPersonTable does what node-postgres' script/create-test-tables.js
// does before its integration tests: a fresh person table, 26 rows.
func createPersonTable(ctx context.Context, e Endpoint) error {
	conn, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s sslmode=disable",
		e.Host, e.Port, e.User, e.Password, e.Database))
	if err != nil {
		return fmt.Errorf("driversuite: connect to create the person table: %w", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	names := strings.Fields("Aaron Brian Chris David Elvis Frank Grace Haley Irma Jenny Kevin Larry Michelle " +
		"Nancy Olivia Peter Quinn Ronda Shelley Tobias Uma Veena Wanda Xavier Yoyo Zanzabar")
	var rows []string
	for i, n := range names {
		rows = append(rows, fmt.Sprintf("('%s', %d)", n, (i+1)*10))
	}
	sql := "DROP TABLE IF EXISTS person; CREATE TABLE person (id serial, name varchar(10), age integer); " +
		"INSERT INTO person (name, age) VALUES " + strings.Join(rows, ", ")
	if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("driversuite: create the person table: %w", err)
	}
	return nil
}

// copyTree copies the regular files and directories under src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}
