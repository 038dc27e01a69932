package pgxsuite_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// pgxModulePath is the module whose tests this package runs; its version is
// the one in our go.mod.
const pgxModulePath = "github.com/jackc/pgx/v5"

// inCI reports whether missing tools must fail tests rather than skip them.
func inCI() bool { return os.Getenv("CI") == "true" }

// skipOrFail skips the test, or fails it under CI=true, where a missing
// prerequisite must not pass silently.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if inCI() {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// goTool finds the go command: on PATH, else in the GOROOT of the Go that
// built this test, else in /usr/local/go.
func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	for _, p := range []string{filepath.Join(runtime.GOROOT(), "bin", "go"), "/usr/local/go/bin/go"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", errors.New("go command not found on PATH, in GOROOT or in /usr/local/go/bin")
}

// pgxCopy is a writable copy of pgx's module, where `go test` may resolve
// pgx's own test dependencies (testify...) from pgx's complete go.sum
// instead of ours.
type pgxCopy struct {
	goBin string
	dir   string
}

var (
	copyOnce sync.Once
	copyRes  *pgxCopy
	copyErr  error
	// copyNetErr marks a failure to download modules, which skips outside
	// CI rather than failing.
	copyNetErr bool
)

// preparePgx returns the copy of pgx's module with its test dependencies
// downloaded and its packages loaded, preparing it once per process. A
// missing go command or module download failure skips the test, except
// under CI=true.
func preparePgx(t *testing.T) *pgxCopy {
	t.Helper()
	goBin, err := goTool()
	if err != nil {
		skipOrFail(t, "pgxsuite: %v", err)
	}
	copyOnce.Do(func() { copyRes, copyNetErr, copyErr = makePgxCopy(goBin) })
	if copyErr != nil {
		if copyNetErr {
			skipOrFail(t, "pgxsuite: cannot download pgx's test dependencies (network or module proxy unavailable): %v", copyErr)
		}
		t.Fatalf("pgxsuite: prepare pgx's module: %v", copyErr)
	}
	return copyRes
}

// makePgxCopy copies pgx's module directory out of the read-only module
// cache into a stable per-version directory under the user cache (a stable
// path keeps the Go build cache warm across runs), then loads all its
// packages and test dependencies, downloading what is missing.
func makePgxCopy(goBin string) (c *pgxCopy, netErr bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	out, err := goOutput(ctx, goBin, "", nil, "list", "-m", "-f", "{{.Version}}\t{{.Dir}}", pgxModulePath)
	if err != nil {
		return nil, false, fmt.Errorf("locate %s: %w", pgxModulePath, err)
	}
	version, src, _ := strings.Cut(strings.TrimSpace(out), "\t")
	if src == "" {
		// Not in the module cache yet: download it.
		out, err := goOutput(ctx, goBin, "", nil, "mod", "download", "-json", pgxModulePath+"@"+version)
		if err != nil {
			return nil, true, fmt.Errorf("download %s@%s: %w", pgxModulePath, version, err)
		}
		var info struct{ Dir string }
		if err := json.Unmarshal([]byte(out), &info); err != nil || info.Dir == "" {
			return nil, false, fmt.Errorf("download %s@%s: no directory in %q", pgxModulePath, version, out)
		}
		src = info.Dir
	}

	cacheDir, err := os.UserCacheDir()
	if err != nil {
		cacheDir = os.TempDir()
	}
	base := filepath.Join(cacheDir, "pgquic", "pgxsuite")
	dst := filepath.Join(base, "pgx@"+version)
	if _, err := os.Stat(filepath.Join(dst, ".pgxsuite-complete")); err != nil {
		if err := os.MkdirAll(base, 0o755); err != nil {
			return nil, false, fmt.Errorf("create %s: %w", base, err)
		}
		tmp, err := os.MkdirTemp(base, "tmp-")
		if err != nil {
			return nil, false, fmt.Errorf("create temp copy dir: %w", err)
		}
		defer os.RemoveAll(tmp) // no-op once renamed
		staged := filepath.Join(tmp, "pgx")
		// CopyFS creates files writable (0666 plus the source's execute
		// bits), unlike the module cache's read-only ones.
		if err := os.CopyFS(staged, os.DirFS(src)); err != nil {
			return nil, false, fmt.Errorf("copy %s: %w", src, err)
		}
		if err := os.WriteFile(filepath.Join(staged, ".pgxsuite-complete"), []byte(src+"\n"), 0o644); err != nil {
			return nil, false, fmt.Errorf("mark copy complete: %w", err)
		}
		_ = os.RemoveAll(dst) // an incomplete copy left by a killed run
		if err := os.Rename(staged, dst); err != nil {
			// A concurrent test process may have won the race.
			if _, statErr := os.Stat(filepath.Join(dst, ".pgxsuite-complete")); statErr != nil {
				return nil, false, fmt.Errorf("install copy at %s: %w", dst, err)
			}
		}
	}

	// Loading every package with its test imports downloads pgx's test
	// dependencies and proves they resolve before any test runs.
	if _, err := goOutput(ctx, goBin, dst, nil, "list", "-deps", "-test", "./..."); err != nil {
		return nil, true, fmt.Errorf("load pgx packages in %s: %w", dst, err)
	}
	return &pgxCopy{goBin: goBin, dir: dst}, false, nil
}

// goEnv is this process's environment for a go command run in the pgx
// copy: without PG* and PGX_* variables (pgx's tests would read them) and
// without module settings of ours, plus extra.
func goEnv(extra map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PG") || k == "GOFLAGS" || k == "GOWORK" {
			continue
		}
		env = append(env, kv)
	}
	// -mod=mod lets go resolve pgx's test-only requirements from pgx's
	// own go.mod and go.sum; GOWORK=off keeps any workspace out.
	env = append(env, "GOFLAGS=-mod=mod", "GOWORK=off")
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+extra[k])
	}
	return env
}

// goOutput runs the go command in dir ("" is the current directory) and
// returns its standard output; the error carries standard error.
func goOutput(ctx context.Context, goBin, dir string, extra map[string]string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = dir
	if dir != "" {
		cmd.Env = goEnv(extra)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, tailText(stderr.String(), 40))
	}
	return stdout.String(), nil
}

// testKey names one test or subtest of a package.
type testKey struct {
	Pkg  string
	Test string
}

func (k testKey) String() string { return k.pkgName() + " " + k.Test }

// pkgName is the package path shortened to start at "pgx".
func (k testKey) pkgName() string { return "pgx" + strings.TrimPrefix(k.Pkg, pgxModulePath) }

// suiteResult is what one `go test -json` run of pgx reported.
type suiteResult struct {
	// Tests maps every test and subtest to its final action: pass, fail or
	// skip. Tests that started but never ended (a package that panicked or
	// timed out) are "fail", and also in Unfinished.
	Tests map[testKey]string
	// Unfinished holds the tests that started but never reported an end:
	// their package died (a hang until -timeout, a panic, a signal). Most
	// of them are innocent parallel tests that were paused behind the one
	// that hung, so they are reported apart from real failures.
	Unfinished map[testKey]bool
	// Packages maps every package to its final action.
	Packages map[string]string
	// Output holds each test's output lines, for failure reports.
	Output map[testKey][]string
	// BuildErrors is non-JSON output (compile errors and the like).
	BuildErrors string
	// ExitErr is the go command's exit error, if any.
	ExitErr error
	// LogFile is where the raw JSON stream was saved.
	LogFile string
	// Elapsed is the wall time of the run.
	Elapsed time.Duration
}

// counts returns how many tests (subtests included) passed, failed and
// were skipped.
func (r *suiteResult) counts() (pass, fail, skip int) {
	for _, a := range r.Tests {
		switch a {
		case "pass":
			pass++
		case "fail":
			fail++
		case "skip":
			skip++
		}
	}
	return pass, fail, skip
}

// with returns the sorted tests whose final action is action.
func (r *suiteResult) with(action string) []testKey {
	var ks []testKey
	for k, a := range r.Tests {
		if a == action {
			ks = append(ks, k)
		}
	}
	sortKeys(ks)
	return ks
}

func (r *suiteResult) summary() string {
	p, f, s := r.counts()
	return fmt.Sprintf("tests (with subtests)=%d pass=%d fail=%d (unfinished %d) skip=%d packages=%d failed_packages=%d elapsed=%s",
		len(r.Tests), p, f, len(r.Unfinished), s, len(r.Packages), countValue(r.Packages, "fail"), r.Elapsed.Round(time.Second))
}

// pkgCounts is one package's outcome in a run.
type pkgCounts struct {
	Pass, Fail, Unfinished, Skip int
	// Result is the package's own final action (pass, fail, skip).
	Result string
}

// byPackage counts tests (subtests included) per package.
func (r *suiteResult) byPackage() map[string]pkgCounts {
	out := make(map[string]pkgCounts)
	for p, a := range r.Packages {
		c := out[p]
		c.Result = a
		out[p] = c
	}
	for k, a := range r.Tests {
		c := out[k.Pkg]
		switch {
		case r.Unfinished[k]:
			c.Unfinished++
		case a == "pass":
			c.Pass++
		case a == "fail":
			c.Fail++
		case a == "skip":
			c.Skip++
		}
		out[k.Pkg] = c
	}
	return out
}

// packageTable prints direct and through-pgquic counts per package,
// "pass/fail/skip" with unfinished tests counted as failures and shown
// in parentheses.
func packageTable(a, b *suiteResult) string {
	ca, cb := a.byPackage(), b.byPackage()
	var pkgs []string
	for p := range ca {
		pkgs = append(pkgs, p)
	}
	for p := range cb {
		if _, ok := ca[p]; !ok {
			pkgs = append(pkgs, p)
		}
	}
	sort.Strings(pkgs)
	cell := func(c pkgCounts) string {
		s := fmt.Sprintf("%d/%d/%d", c.Pass, c.Fail+c.Unfinished, c.Skip)
		if c.Unfinished > 0 {
			s += fmt.Sprintf(" (%d unfinished)", c.Unfinished)
		}
		return s
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-30s %-16s %s\n", "package (pass/fail/skip)", "direct", "through pgquic")
	for _, p := range pkgs {
		fmt.Fprintf(&sb, "%-30s %-16s %s\n", testKey{Pkg: p}.pkgName(), cell(ca[p]), cell(cb[p]))
	}
	return sb.String()
}

// testEvent is one line of `go test -json` (cmd/test2json).
type testEvent struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// runPgxTests runs `go test -json` in the pgx copy with env added, saving
// the raw stream to logPath, and parses it. The go command failing because
// tests failed is normal; the caller inspects the result.
func runPgxTests(ctx context.Context, t *testing.T, pc *pgxCopy, env map[string]string, logPath string, args ...string) *suiteResult {
	t.Helper()
	full := append([]string{"test", "-json", "-count=1"}, args...)
	cmd := exec.CommandContext(ctx, pc.goBin, full...)
	cmd.Dir = pc.dir
	cmd.Env = goEnv(env)
	// On cancellation interrupt first so test binaries can clean up.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("pipe: %v", err)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("create %s: %v", logPath, err)
	}
	defer logf.Close()

	t.Logf("pgxsuite: running go %s in %s (raw log %s)", strings.Join(full, " "), pc.dir, logPath)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start go test: %v", err)
	}
	res := parseEvents(io.TeeReader(stdout, logf))
	res.ExitErr = cmd.Wait()
	res.Elapsed = time.Since(start)
	res.LogFile = logPath
	res.BuildErrors += stderr.String()
	return res
}

// parseEvents reads a `go test -json` stream.
func parseEvents(r io.Reader) *suiteResult {
	res := &suiteResult{
		Tests:      make(map[testKey]string),
		Unfinished: make(map[testKey]bool),
		Packages:   make(map[string]string),
		Output:     make(map[testKey][]string),
	}
	var build strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var ev testEvent
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			build.Write(line)
			build.WriteByte('\n')
			continue
		}
		if ev.Test == "" {
			switch ev.Action {
			case "pass", "fail", "skip":
				res.Packages[ev.Package] = ev.Action
			case "build-output":
				build.WriteString(ev.Output)
			}
			continue
		}
		k := testKey{ev.Package, normalizeTestName(ev.Test)}
		switch ev.Action {
		case "run":
			if _, done := res.Tests[k]; !done {
				res.Tests[k] = "running"
			}
		case "pass", "fail", "skip":
			res.Tests[k] = ev.Action
		case "output":
			res.Output[k] = append(res.Output[k], ev.Output)
		}
	}
	// A test that never ended died with its package (panic, timeout).
	for k, a := range res.Tests {
		if a == "running" {
			res.Tests[k] = "fail"
			res.Unfinished[k] = true
		}
	}
	res.BuildErrors = build.String()
	return res
}

// tempDirInName matches a t.TempDir() path inside a subtest name (pgconn's
// TestParseConfigSSLCertMode names subtests after a service file in one):
// the test's name, random digits, then a three-digit sequence directory.
var tempDirInName = regexp.MustCompile(`(Test[A-Za-z0-9_]*?)[0-9]{6,}(/[0-9]{3}/)`)

// normalizeTestName removes what differs between two runs of the same test
// from its name, so that the runs compare test by test.
func normalizeTestName(name string) string {
	if !strings.Contains(name, "/") {
		return name
	}
	return tempDirInName.ReplaceAllString(name, "${1}TMP${2}")
}

// failureReport is the output of the given tests, each cut to its last
// lines, for a test log.
func (r *suiteResult) failureReport(keys []testKey, maxLines int) string {
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "--- %s\n", k)
		b.WriteString(tailText(strings.Join(r.Output[k], ""), maxLines))
		b.WriteString("\n")
	}
	return b.String()
}

// diff lists tests whose outcome differs between two runs.
type diff struct {
	// FailOnlyB failed in b but passed (or skipped) in a.
	FailOnlyB []testKey
	// FailOnlyA failed in a but not in b.
	FailOnlyA []testKey
	// SkipOnlyB were skipped in b but ran in a, and SkipOnlyA the reverse.
	SkipOnlyB, SkipOnlyA []testKey
	// MissingB ran in a but not at all in b, and MissingA the reverse.
	MissingB, MissingA []testKey
}

// compare sets run b (through the pooler) against run a (direct).
func compare(a, b *suiteResult) diff {
	var d diff
	for k, av := range a.Tests {
		bv, ok := b.Tests[k]
		switch {
		case !ok:
			d.MissingB = append(d.MissingB, k)
		case bv == "fail" && av != "fail":
			d.FailOnlyB = append(d.FailOnlyB, k)
		case av == "fail" && bv != "fail":
			d.FailOnlyA = append(d.FailOnlyA, k)
		case bv == "skip" && av != "skip":
			d.SkipOnlyB = append(d.SkipOnlyB, k)
		case av == "skip" && bv != "skip":
			d.SkipOnlyA = append(d.SkipOnlyA, k)
		}
	}
	for k := range b.Tests {
		if _, ok := a.Tests[k]; !ok {
			d.MissingA = append(d.MissingA, k)
		}
	}
	for _, ks := range [][]testKey{d.FailOnlyB, d.FailOnlyA, d.SkipOnlyB, d.SkipOnlyA, d.MissingB, d.MissingA} {
		sortKeys(ks)
	}
	return d
}

// topLevel returns the distinct top-level tests of keys, per package.
func topLevel(keys []testKey) []testKey {
	seen := make(map[testKey]bool)
	var out []testKey
	for _, k := range keys {
		top, _, _ := strings.Cut(k.Test, "/")
		tk := testKey{k.Pkg, top}
		if !seen[tk] {
			seen[tk] = true
			out = append(out, tk)
		}
	}
	sortKeys(out)
	return out
}

func sortKeys(ks []testKey) {
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].Pkg != ks[j].Pkg {
			return ks[i].Pkg < ks[j].Pkg
		}
		return ks[i].Test < ks[j].Test
	})
}

func keyList(ks []testKey) string {
	if len(ks) == 0 {
		return "(none)"
	}
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = k.String()
	}
	return strings.Join(s, "\n  ")
}

func countValue(m map[string]string, v string) int {
	n := 0
	for _, x := range m {
		if x == v {
			n++
		}
	}
	return n
}

// tailText returns the last n lines of s.
func tailText(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines cut)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// outDir is where raw logs go: $PGQUIC_PGX_OUT when set (scripts/pgx-suite
// sets it so logs outlive the test), else the test's temporary directory.
func outDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("PGQUIC_PGX_OUT"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("create PGQUIC_PGX_OUT %s: %v", d, err)
		}
		return d
	}
	return t.TempDir()
}

// runContext bounds a go test run by the test binary's own deadline, minus
// a margin to report, or by fallback without one.
func runContext(t *testing.T, fallback time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := t.Deadline(); ok {
		return context.WithDeadline(context.Background(), dl.Add(-time.Minute))
	}
	return context.WithTimeout(context.Background(), fallback)
}
