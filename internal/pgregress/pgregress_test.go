package pgregress

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestParseOutput(t *testing.T) {
	out := "(using postmaster on 127.0.0.1, port 5432)\n" +
		"============== running regression test queries        ==============\n" +
		"test test_setup                   ... ok          387 ms\n" +
		"parallel group (2 tests):  char boolean\n" +
		"     boolean                      ... ok           80 ms\n" +
		"     char                         ... FAILED      123 ms\n" +
		"test tablespace                   ... FAILED (test process exited with exit code 137)  4 ms\n" +
		"     name                         ... failed (ignored)  3 ms\n" +
		" 2 of 5 tests failed.\n"
	got := ParseOutput(out)
	want := map[string]string{"test_setup": "ok", "boolean": "ok", "char": "failed", "tablespace": "failed", "name": "failed"}
	if len(got) != len(want) {
		t.Fatalf("ParseOutput = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}

func TestParseExpected(t *testing.T) {
	e, err := ParseExpected(strings.NewReader("# c\n\ntransaction guc SET SESSION AUTHORIZATION is refused\nsession psql reads the backend PID\n"))
	if err != nil {
		t.Fatal(err)
	}
	if e[Transaction]["guc"] != "SET SESSION AUTHORIZATION is refused" || e[Session]["psql"] != "reads the backend PID" {
		t.Errorf("parsed %v", e)
	}
	for _, bad := range []string{"transaction guc\n", "direct guc reason\n", "sometimes guc reason\n", "session a r\nsession a r\n"} {
		if _, err := ParseExpected(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseExpected(%q) accepted it", bad)
		}
	}
}

// TestExpectedFile: the committed list parses, and each test on it is in
// the parallel schedule's names (the suite is not here, so only the form
// is checked: names are identifiers).
func TestExpectedFile(t *testing.T) {
	f, err := os.Open("../../scripts/pg-regress-expected.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e, err := ParseExpected(f)
	if err != nil {
		t.Fatal(err)
	}
	for m, tests := range e {
		for name, reason := range tests {
			if strings.ContainsAny(name, "/. ") || len(reason) < 10 {
				t.Errorf("%s %s: odd name or too short a reason %q", m, name, reason)
			}
		}
	}
}

// TestJudge: a pooled run's failures are expected (listed), the direct
// run's own, or unexpected; hangs and changes outside the database fail
// the check whatever the list says.
func TestJudge(t *testing.T) {
	direct := &Result{Mode: Direct, Tests: map[string]string{"a": "ok", "b": "ok", "c": "failed", "d": "ok", "e": "ok"}}
	tx := &Result{Mode: Transaction, Tests: map[string]string{"a": "ok", "b": "failed", "c": "failed", "d": "failed", "e": "ok"}}
	e := Expected{Transaction: {"b": "refused SET ROLE", "e": "was failing"}}
	v := Judge(tx, direct, e)
	if !slices.Equal(v.Unexpected, []string{"d"}) || !slices.Equal(v.Expected, []string{"b"}) ||
		!slices.Equal(v.DirectToo, []string{"c"}) || !slices.Equal(v.Passed, []string{"e"}) || v.OK() {
		t.Errorf("verdict %+v", v)
	}
	tx.Tests["d"] = "ok"
	if v := Judge(tx, direct, e); !v.OK() {
		t.Errorf("all failures explained, yet not OK: %+v", v)
	}
	tx.Hung = []string{"b"}
	if v := Judge(tx, direct, e); v.OK() {
		t.Error("a hung test passed the check")
	}
	tx.Hung, tx.Harm = nil, []string{"postgres.pg_class: 10 before, 11 after"}
	v = Judge(tx, direct, e)
	if v.OK() {
		t.Error("a change outside the database passed the check")
	}
	var buf bytes.Buffer
	WriteReport(&buf, tx, v, e)
	for _, want := range []string{"== transaction: 3 ok, 2 failed (0 hung)", "expected failure: b: refused SET ROLE",
		"fails directly too: c", "CHANGED outside the test database: postgres.pg_class"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestMain checks that no goroutine outlives the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestLauncherRecordsHang: the launcher kills a test's psql after the
// timeout, records the test (named by its standard input, the .sql file)
// and exits with timeout's status, while a test that finishes in time is
// not recorded.
func TestLauncherRecordsHang(t *testing.T) {
	dir := t.TempDir()
	launch := filepath.Join(dir, "launch.sh")
	if err := os.WriteFile(launch, []byte(launcher), 0o755); err != nil {
		t.Fatal(err)
	}
	hung := filepath.Join(dir, "hung.txt")
	run := func(name string, args ...string) int {
		sql := filepath.Join(dir, name+".sql")
		if err := os.WriteFile(sql, []byte("SELECT 1;\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		in, err := os.Open(sql)
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		cmd := exec.Command(launch, args...)
		cmd.Stdin = in
		cmd.Env = append(os.Environ(), "PGREGRESS_TEST_TIMEOUT=1", "PGREGRESS_HUNG="+hung)
		err = cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	}
	if rc := run("quick", "true"); rc != 0 {
		t.Errorf("a test that finishes: exit %d", rc)
	}
	if rc := run("stuck", "sleep", "30"); rc != 137 {
		t.Errorf("a test killed after the timeout: exit %d, want 137", rc)
	}
	b, err := os.ReadFile(hung)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(b)); !slices.Equal(got, []string{"stuck"}) {
		t.Errorf("hung.txt lists %v, want [stuck]", got)
	}
}
