package driversuite

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/pgcluster"
)

// TestMain checks that clusters, poolers and runners leave no goroutine
// behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParseNodeOutput(t *testing.T) {
	out := "\n  first ✔\n  noisy console line\n  skipped one ? - SKIPPED\n  first ✔\n" +
		"  broken FAILED!\n\nAssertionError [ERR_ASSERTION]: boom\n    at x.js:1:1\n"
	res := newResult("s", Direct, "files")
	parseNodeOutput(res, "a-tests.js", out, &exec.ExitError{})
	want := map[string]Outcome{
		"a-tests.js":                Fail,
		"a-tests.js :: first":       Pass,
		"a-tests.js :: first #2":    Pass,
		"a-tests.js :: skipped one": Skip,
		"a-tests.js :: broken":      Fail,
	}
	for id, o := range want {
		if got := res.Tests[id]; got != o {
			t.Errorf("%s: got %q, want %q", id, got, o)
		}
	}
	if len(res.Tests) != len(want) {
		t.Errorf("got %d results, want %d: %v", len(res.Tests), len(want), res.Tests)
	}
	if d := res.Detail["a-tests.js"]; !strings.Contains(d, "AssertionError [ERR_ASSERTION]: boom") {
		t.Errorf("file detail %q lacks the assertion", d)
	}

	timedOut := "  slow one \nError: test: slow one did not complete withint 5000ms\n"
	res = newResult("s", Direct, "files")
	parseNodeOutput(res, "b-tests.js", timedOut, errors.New("exit status 255"))
	if got := res.Tests["b-tests.js :: slow one"]; got != Fail {
		t.Errorf("timed-out case: got %q, want fail", got)
	}

	res = newResult("s", Direct, "files")
	parseNodeOutput(res, "c-tests.js", "", nil)
	if got := res.Tests["c-tests.js"]; got != Pass {
		t.Errorf("silent passing file: got %q, want pass", got)
	}
}

func TestParseJUnit(t *testing.T) {
	doc := `<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_ok" time="0.1"/>
<testcase classname="tests.test_a" name="test_bad[x]" time="0.1"><failure message="assert 1 == 2">long</failure></testcase>
<testcase classname="tests.test_a" name="test_skip" time="0"><skipped message="no"/></testcase>
<testcase classname="tests.test_a" name="test_teardown" time="0.1"/>
<testcase classname="tests.test_a" name="test_teardown" time="0.1"><error message="teardown broke"/></testcase>
</testsuite></testsuites>`
	res := newResult("s", Direct, "tests")
	if err := parseJUnit(res, strings.NewReader(doc)); err != nil {
		t.Fatal(err)
	}
	want := map[string]Outcome{
		"tests.test_a::test_ok":       Pass,
		"tests.test_a::test_bad[x]":   Fail,
		"tests.test_a::test_skip":     Skip,
		"tests.test_a::test_teardown": Fail,
	}
	for id, o := range want {
		if got := res.Tests[id]; got != o {
			t.Errorf("%s: got %q, want %q", id, got, o)
		}
	}
	if got := res.Detail["tests.test_a::test_bad[x]"]; got != "assert 1 == 2" {
		t.Errorf("failure detail %q", got)
	}
	if err := parseJUnit(newResult("s", Direct, "tests"), strings.NewReader("<testsuites><testcase")); err == nil {
		t.Errorf("truncated XML: no error")
	}
}

func TestRegressionsAndReport(t *testing.T) {
	direct := &Result{Suite: "s", Mode: Direct, Units: "tests", Tests: map[string]Outcome{
		"a": Pass, "b": Pass, "c": Fail, "d": Pass, "e": Skip}}
	session := &Result{Suite: "s", Mode: Session, Units: "tests", Tests: map[string]Outcome{
		"a": Pass, "b": Fail, "c": Pass, "e": Skip}, Detail: map[string]string{"b": "\n  08006 server connection lost\nmore"}}
	if got, want := Regressions(direct, session), []string{"b", "d"}; !slices.Equal(got, want) {
		t.Errorf("Regressions = %v, want %v", got, want)
	}
	var buf bytes.Buffer
	WriteReport(&buf, direct, []*Result{session})
	for _, want := range []string{
		"direct       tests: 3 passed, 1 failed, 1 skipped",
		"session      tests: 2 passed, 1 failed, 1 skipped",
		"pass directly, not through pgquic in session mode (2):",
		"  b [fail] 08006 server connection lost",
		"  d [did not run]",
		"failing directly too (1; not counted as pgquic's):\n  c",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestInSelection(t *testing.T) {
	for _, tc := range []struct {
		id   string
		sel  []string
		want bool
	}{
		{"client/a-tests.js", []string{"client/a-tests.js"}, true},
		{"client/a-tests.js :: case", []string{"client/a-tests.js"}, true},
		{"client/ab-tests.js :: case", []string{"client/a"}, false},
		{"tests.test_cursor::test_x[1]", []string{"tests/test_cursor.py"}, true},
		{"tests.test_cursor.TestC::test_x", []string{"tests/test_cursor.py"}, true},
		{"tests.test_cursor_async::test_x", []string{"tests/test_cursor.py"}, false},
		{"tests.pool.test_pool::test_x", []string{"tests/pool/test_pool.py"}, true},
	} {
		if got := inSelection(tc.id, tc.sel); got != tc.want {
			t.Errorf("inSelection(%q, %v) = %v", tc.id, tc.sel, got)
		}
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"direct", "session", "transaction"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseMode("statement"); err == nil {
		t.Errorf("ParseMode(statement): no error")
	}
}

// suitesEnv turns on TestCISubset outside CI.
const suitesEnv = "PGQUIC_DRIVER_SUITES"

// TestCISubset runs the curated subsets directly, through pgquic in
// session mode and, for the files or modules that passed there, in
// transaction mode: everything must pass directly (else the environment is
// broken) and everything that passes directly must pass through pgquic. It
// runs with PGQUIC_DRIVER_SUITES=1 and the suites' sources under
// SourcesDir (scripts/driver-suites --ci does both); the sources are not in
// this repository, so CI, which cannot download Debian's source packages,
// does not run it. PGQUIC_DRIVER_SUITES_OUT=DIR keeps the logs.
func TestCISubset(t *testing.T) {
	// Asked for explicitly: from here a missing prerequisite is a failure.
	if os.Getenv(suitesEnv) != "1" {
		t.Skipf("runs with %s=1 and the suites' sources in %s (see scripts/driver-suites)", suitesEnv, SourcesEnv)
	}
	if _, err := pgcluster.Binaries(); err != nil {
		t.Fatalf("PostgreSQL server binaries: %v", err)
	}
	cache, err := CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	td, err := SourcesDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"node-postgres-" + NodePostgresVersion, "psycopg-" + PsycopgVersion} {
		if _, err := os.Stat(filepath.Join(td, d)); err != nil {
			t.Fatalf("the suites' sources: %v (scripts/driver-suites fetches them with apt-get source, or set %s)", err, SourcesEnv)
		}
	}
	dir := t.TempDir()
	if d := os.Getenv("PGQUIC_DRIVER_SUITES_OUT"); d != "" {
		dir = d
	}
	node := &NodePostgres{Src: filepath.Join(td, "node-postgres-"+NodePostgresVersion),
		Work: filepath.Join(cache, "node-postgres-"+NodePostgresVersion)}
	psy := &Psycopg{Src: filepath.Join(td, "psycopg-"+PsycopgVersion),
		Work: filepath.Join(cache, "psycopg-"+PsycopgVersion), Timeout: 15 * time.Minute}
	for _, tc := range []struct {
		suite      Suite
		sel, txSel []string
		set        func([]string)
	}{
		{node, CINodePostgresFiles, CINodePostgresTransactionFiles, func(s []string) { node.Files = s }},
		{psy, CIPsycopgModules, CIPsycopgTransactionModules, func(s []string) { psy.Args = s }},
	} {
		t.Run(suiteFile(tc.suite), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			defer cancel()
			if err := tc.suite.Prepare(ctx); err != nil {
				t.Fatal(err)
			}
			run := func(m Mode, sel []string) *Result {
				tc.set(sel)
				r, err := runMode(ctx, tc.suite, m, dir, slog.New(slog.DiscardHandler), t.Logf)
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			direct := run(Direct, tc.sel)
			if len(direct.Tests) == 0 {
				t.Fatalf("no test ran directly; logs in %s", dir)
			}
			if f := direct.With(Fail); len(f) > 0 {
				t.Errorf("the CI subset must pass directly; failing: %v (logs in %s)", f, dir)
			}
			pooled := []*Result{run(Session, tc.sel)}
			if len(tc.txSel) > 0 {
				pooled = append(pooled, run(Transaction, tc.txSel))
			}
			var buf bytes.Buffer
			WriteReport(&buf, direct, pooled)
			t.Log(buf.String())
			for _, r := range pooled {
				sel := tc.sel
				if r.Mode == Transaction {
					sel = tc.txSel
				}
				var reg []string
				for _, id := range Regressions(direct, r) {
					if inSelection(id, sel) {
						reg = append(reg, id)
					}
				}
				if len(reg) > 0 {
					t.Errorf("pass directly but not through pgquic in %s mode: %v (logs in %s)", r.Mode, reg, dir)
				}
				if r.Accepted == 0 {
					t.Errorf("%s mode: no client went through the pooler", r.Mode)
				}
			}
		})
	}
}

func TestParseVerbose(t *testing.T) {
	log := "tests/test_a.py::test_ok PASSED    [  1%]\n" +
		"tests/pool/test_p.py::TestC::test_x[a b] FAILED [  2%]\n" +
		"tests/test_a.py::test_s SKIPPED (no) [  3%]\n" +
		"tests/test_a.py::test_hang \n"
	res := newResult("s", Direct, "tests")
	if n := parseVerbose(res, log); n != 3 {
		t.Errorf("read %d lines, want 3", n)
	}
	want := map[string]Outcome{
		"tests.test_a::test_ok":                Pass,
		"tests.pool.test_p.TestC::test_x[a b]": Fail,
		"tests.test_a::test_s":                 Skip,
	}
	for id, o := range want {
		if got := res.Tests[id]; got != o {
			t.Errorf("%s: got %q, want %q (all: %v)", id, got, o, res.Tests)
		}
	}
}
