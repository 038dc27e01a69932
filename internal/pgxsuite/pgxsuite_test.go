package pgxsuite_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/pooler"
)

// TestMain checks that the pooler, its pools and the clusters leave no
// goroutine behind once each test's cleanup ran.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fullEnv turns on the full-suite comparison, which takes many minutes.
const fullEnv = "PGQUIC_PGX_FULL"

// pgbouncerTests are pgx's tests that read PGX_TEST_PGBOUNCER_CONN_STRING,
// by package; each must run and pass, not skip.
var pgbouncerTests = []testKey{
	{pgxModulePath, "TestPgbouncerQueryExecModes"},
	{pgxModulePath, "TestPgbouncerStatementCacheEviction"},
	{pgxModulePath + "/pgconn", "TestConnContextCanceledCancelsRunningQueryOnServer/pgbouncer"},
}

// TestPgbouncerTransactionMode runs pgx's TestPgbouncer* tests (pgx's
// pgbouncer_test.go) and the other test that reads
// PGX_TEST_PGBOUNCER_CONN_STRING (pgconn's query cancellation on context
// expiry) through the pooler in transaction mode, set up like
// pgx's testsetup/pgbouncer.ini: two server connections for ten clients,
// md5 client authentication, no client TLS. It runs once with the default
// server-side statement cache and once with a cache of 8, so the pooler's
// own eviction (Close of the least recently used statement) happens while
// pgx evicts from its cache too.
func TestPgbouncerTransactionMode(t *testing.T) {
	pc := preparePgx(t)
	c := newSuiteCluster(t)
	dir := outDir(t)

	for _, tc := range []struct {
		name      string
		cacheSize int
	}{
		{"default-statement-cache", 0},
		{"statement-cache-8", 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := startPooler(t, c, poolerOpts{
				mode:               pooler.ModeTransaction,
				poolSize:           2,
				statementCacheSize: tc.cacheSize,
				logger:             fileLogger(t, filepath.Join(dir, "pooler-transaction-"+tc.name+".log")),
			})
			e := sp.endpoint()
			// PGX_TEST_DATABASE serves the direct ("postgres") half of the
			// pgconn test.
			env := map[string]string{
				"PGX_TEST_DATABASE": c.directEndpoint().suiteEnv()["PGX_TEST_DATABASE"],
				"PGX_TEST_PGBOUNCER_CONN_STRING": fmt.Sprintf(
					"host=%s port=%d user=pgx_md5 password=%s dbname=%s sslmode=disable", e.host, e.port, testPassword, testDB),
			}
			ctx, cancel := runContext(t, 15*time.Minute)
			defer cancel()
			res := runPgxTests(ctx, t, pc, env, filepath.Join(dir, "pgbouncer-"+tc.name+".jsonl"),
				"-timeout", "10m", "-run", "^(TestPgbouncer.*|TestConnContextCanceledCancelsRunningQueryOnServer)$", ".", "./pgconn")
			t.Logf("pgxsuite: pgbouncer tests through pgquic (transaction mode, %s): %s", tc.name, res.summary())
			checkPgbouncerResult(t, res)
			if n := sp.accepted.Load(); n == 0 {
				t.Errorf("no client connected to the pooler")
			} else {
				t.Logf("pgxsuite: the pooler accepted %d client connections", n)
			}
		})
	}
}

// checkPgbouncerResult fails t unless every pgbouncer test ran and passed.
func checkPgbouncerResult(t *testing.T, res *suiteResult) {
	t.Helper()
	if len(res.Tests) == 0 {
		t.Fatalf("no test ran (exit: %v):\n%s", res.ExitErr, tailText(res.BuildErrors, 40))
	}
	for _, k := range pgbouncerTests {
		switch got := res.Tests[k]; got {
		case "pass":
			t.Logf("pgxsuite: %s: pass", k)
		case "":
			t.Errorf("%s did not run", k)
		default:
			t.Errorf("%s: %s\n%s", k, got, tailText(strings.Join(res.Output[k], ""), 60))
		}
	}
	if failed := res.with("fail"); len(failed) > 0 {
		t.Errorf("failed through pgquic:\n%s", res.failureReport(failed, 40))
	}
	if res.ExitErr != nil && !t.Failed() {
		t.Errorf("go test exited with %v:\n%s", res.ExitErr, tailText(res.BuildErrors, 40))
	}
}

// TestPgxFullSuiteSession runs pgx's whole test suite (`go test ./...` in
// pgx's module) directly against PostgreSQL and then through the pooler in
// session mode, and fails when the outcomes differ: a test that fails or
// skips only through pgquic, or runs in one and not the other. A test that
// failed only through pgquic is run again, alone, both ways, to tell a
// pooler bug from a test that is flaky on a busy machine. Set
// PGQUIC_PGX_FULL=1 to run it; give `go test` a -timeout of an hour or so.
func TestPgxFullSuiteSession(t *testing.T) {
	if os.Getenv(fullEnv) != "1" {
		t.Skipf("set %s=1 to run pgx's full test suite directly and through pgquic (takes many minutes)", fullEnv)
	}
	pc := preparePgx(t)
	c := newSuiteCluster(t)
	dir := outDir(t)
	ctx, cancel := runContext(t, 90*time.Minute)
	defer cancel()
	args := []string{"-timeout", "20m"}
	if run := os.Getenv("PGQUIC_PGX_RUN"); run != "" {
		args = append(args, "-run", run)
	}
	// PGQUIC_PGX_PKG may name several packages, separated by spaces or
	// commas ("./pgconn ." for instance).
	pkgs := strings.FieldsFunc(os.Getenv("PGQUIC_PGX_PKG"), func(r rune) bool { return r == ',' || r == ' ' })
	if len(pkgs) == 0 {
		pkgs = []string{"./..."}
	}
	args = append(args, pkgs...)

	directEnv := c.directEndpoint().suiteEnv()
	direct := runPgxTests(ctx, t, pc, directEnv, filepath.Join(dir, "full-direct.jsonl"), args...)
	t.Logf("pgxsuite: direct to PostgreSQL: %s", direct.summary())
	if len(direct.Tests) == 0 {
		t.Fatalf("no test ran directly (exit: %v):\n%s", direct.ExitErr, tailText(direct.BuildErrors, 40))
	}

	sp := startPooler(t, c, poolerOpts{
		mode:     pooler.ModeSession,
		poolSize: 150,
		logger:   fileLogger(t, filepath.Join(dir, "pooler-session.log")),
	})
	poolerEnv := sp.endpoint().suiteEnv()
	through := runPgxTests(ctx, t, pc, poolerEnv, filepath.Join(dir, "full-pgquic-session.jsonl"), args...)
	t.Logf("pgxsuite: through pgquic (session mode): %s; the pooler accepted %d client connections",
		through.summary(), sp.accepted.Load())

	d := compare(direct, through)
	// Tests of a package that hung or died never report an end; most were
	// paused behind the culprit. Rerunning them would hang again, so they
	// are reported apart.
	var failedOnlyB, unfinished []testKey
	for _, k := range d.FailOnlyB {
		if through.Unfinished[k] {
			unfinished = append(unfinished, k)
		} else {
			failedOnlyB = append(failedOnlyB, k)
		}
	}
	rc := recheck(ctx, t, pc, dir, directEnv, poolerEnv, failedOnlyB)

	t.Logf("pgxsuite: tests per package:\n%s", packageTable(direct, through))
	t.Logf("pgxsuite: failed directly (%d):\n  %s", len(direct.with("fail")), keyList(direct.with("fail")))
	t.Logf("pgxsuite: skipped directly (%d top-level):\n  %s", len(topLevel(direct.with("skip"))), keyList(topLevel(direct.with("skip"))))
	t.Logf("pgxsuite: failed only through pgquic, confirmed by a rerun (%d):\n  %s", len(rc.confirmed), keyList(rc.confirmed))
	t.Logf("pgxsuite: failed only through pgquic, not rerun (too many) (%d):\n  %s", len(rc.notRechecked), keyList(rc.notRechecked))
	t.Logf("pgxsuite: failed only through pgquic once, passed on rerun (flaky) (%d):\n  %s", len(rc.flaky), keyList(rc.flaky))
	t.Logf("pgxsuite: never finished through pgquic: their package hung or died (%d, %d top-level):\n  %s",
		len(unfinished), len(topLevel(unfinished)), keyList(topLevel(unfinished)))
	t.Logf("pgxsuite: failed only directly (%d):\n  %s", len(d.FailOnlyA), keyList(d.FailOnlyA))
	writeSummary(t, dir, direct, through, d, rc, unfinished)

	if bad := append(append([]testKey{}, rc.confirmed...), rc.notRechecked...); len(bad) > 0 {
		t.Errorf("%d tests fail through pgquic but pass directly:\n%s", len(bad), through.failureReport(bad, 30))
	}
	if len(unfinished) > 0 {
		t.Errorf("%d tests never finished through pgquic (packages %s hung or died); see the end of each package's output in %s",
			len(unfinished), strings.Join(unfinishedPackages(unfinished), ", "), through.LogFile)
	}
	if len(d.SkipOnlyB) > 0 || len(d.SkipOnlyA) > 0 {
		t.Errorf("skipped tests differ:\nonly through pgquic:\n  %s\nonly directly:\n  %s\n%s",
			keyList(d.SkipOnlyB), keyList(d.SkipOnlyA), through.failureReport(d.SkipOnlyB, 5))
	}
	if len(d.MissingB) > 0 || len(d.MissingA) > 0 {
		t.Errorf("tests that ran only one way:\nonly directly:\n  %s\nonly through pgquic:\n  %s",
			keyList(d.MissingB), keyList(d.MissingA))
	}
}

// maxRecheck bounds how many top-level tests recheck runs again.
const maxRecheck = 40

// recheckResult sorts the tests that failed only through the pooler.
type recheckResult struct {
	// confirmed failed through the pooler again, alone, and not directly.
	confirmed []testKey
	// flaky passed through the pooler when run again alone.
	flaky []testKey
	// notRechecked were too many to run again (beyond maxRecheck).
	notRechecked []testKey
}

// recheck runs the top-level tests of keys again, alone per package, both
// directly and through the pooler. A key is confirmed when it fails
// through the pooler again while not failing directly; the others are
// flaky. Beyond maxRecheck top-level tests nothing is rerun.
func recheck(ctx context.Context, t *testing.T, pc *pgxCopy, dir string, directEnv, poolerEnv map[string]string, keys []testKey) recheckResult {
	t.Helper()
	if len(keys) == 0 {
		return recheckResult{}
	}
	tops := topLevel(keys)
	if len(tops) > maxRecheck {
		t.Logf("pgxsuite: %d top-level tests failed only through pgquic; too many to rerun", len(tops))
		return recheckResult{notRechecked: keys}
	}
	byPkg := make(map[string][]string)
	for _, k := range tops {
		byPkg[k.Pkg] = append(byPkg[k.Pkg], regexp.QuoteMeta(k.Test))
	}
	pkgs := make([]string, 0, len(byPkg))
	for p := range byPkg {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	failedAgain := make(map[testKey]bool)
	for i, pkg := range pkgs {
		run := "^(" + strings.Join(byPkg[pkg], "|") + ")$"
		args := []string{"-timeout", "10m", "-run", run, pkg}
		d := runPgxTests(ctx, t, pc, directEnv, filepath.Join(dir, fmt.Sprintf("recheck-%d-direct.jsonl", i)), args...)
		p := runPgxTests(ctx, t, pc, poolerEnv, filepath.Join(dir, fmt.Sprintf("recheck-%d-pgquic.jsonl", i)), args...)
		for k, a := range p.Tests {
			if a == "fail" && d.Tests[k] != "fail" {
				failedAgain[k] = true
			}
		}
	}
	var rc recheckResult
	for _, k := range keys {
		if failedAgain[k] {
			rc.confirmed = append(rc.confirmed, k)
		} else {
			rc.flaky = append(rc.flaky, k)
		}
	}
	return rc
}

// unfinishedPackages names the packages of keys, shortened and sorted.
func unfinishedPackages(keys []testKey) []string {
	seen := make(map[string]bool)
	var out []string
	for _, k := range keys {
		if n := k.pkgName(); !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// writeSummary saves the comparison as summary.json next to the raw logs.
func writeSummary(t *testing.T, dir string, direct, through *suiteResult, d diff, rc recheckResult, unfinished []testKey) {
	t.Helper()
	type counts struct {
		Tests, Pass, Fail, Skip int
		Failed                  []string
		Log                     string
	}
	mk := func(r *suiteResult) counts {
		p, f, s := r.counts()
		var failed []string
		for _, k := range r.with("fail") {
			failed = append(failed, k.String())
		}
		return counts{len(r.Tests), p, f, s, failed, r.LogFile}
	}
	names := func(ks []testKey) []string {
		out := []string{}
		for _, k := range ks {
			out = append(out, k.String())
		}
		return out
	}
	sum := map[string]any{
		"direct":                         mk(direct),
		"pgquic_session":                 mk(through),
		"packages_direct":                direct.byPackage(),
		"packages_pgquic":                through.byPackage(),
		"fail_only_pgquic":               names(rc.confirmed),
		"fail_only_pgquic_not_rechecked": names(rc.notRechecked),
		"fail_only_pgquic_flaky":         names(rc.flaky),
		"unfinished_pgquic":              names(unfinished),
		"fail_only_direct":               names(d.FailOnlyA),
		"skip_only_pgquic":               names(d.SkipOnlyB),
		"skip_only_direct":               names(d.SkipOnlyA),
		"missing_pgquic":                 names(d.MissingB),
		"missing_direct":                 names(d.MissingA),
	}
	b, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		t.Errorf("summary: %v", err)
		return
	}
	p := filepath.Join(dir, "summary.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Errorf("write summary: %v", err)
		return
	}
	t.Logf("pgxsuite: summary written to %s", p)
}

// fileLogger logs warnings and errors of the pooler and its pools to path,
// for diagnosing failures without flooding the test log.
func fileLogger(t *testing.T, path string) *slog.Logger {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("create %s: %v", path, err)
	}
	t.Cleanup(func() { _ = f.Close() })
	level := slog.LevelWarn
	if os.Getenv("PGQUIC_PGX_DEBUG") == "1" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: level}))
}
