package driversuite

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// PsycopgVersion is the psycopg release whose tests testdata/ holds: the
// version of Debian 12's python3-psycopg, which the tests run against.
const PsycopgVersion = "3.1.7"

// Python is the interpreter that sees Debian's python3-* packages.
const Python = "/usr/bin/python3"

// Psycopg runs psycopg's pytest suite with --test-dsn pointing at the
// cluster or the pooler, and reads the outcomes from pytest's JUnit XML.
type Psycopg struct {
	// Src is a directory holding tests/ and pyproject.toml (testdata's
	// copy, a Debian source package or a psycopg checkout).
	Src string
	// Work is where the tests are copied to and pytest runs.
	Work string
	// Args, when set, replace the default selection ("tests"): test
	// modules, node ids, -k or -m expressions.
	Args []string
	// TestTimeout bounds one test (pytest-timeout). Default: 60 seconds.
	TestTimeout time.Duration
	// Timeout bounds the whole pytest run. Default: 60 minutes.
	Timeout time.Duration
}

// Name is the suite's name in reports.
func (s *Psycopg) Name() string { return "psycopg " + PsycopgVersion }

// psycopgModules are what the suite imports from Debian: python3-psycopg,
// python3-psycopg-pool, python3-pytest, python3-pytest-asyncio,
// python3-pytest-timeout.
var psycopgModules = []string{"psycopg", "psycopg_pool", "pytest", "pytest_asyncio", "pytest_timeout"}

// Prepare checks the interpreter and modules and copies the tests.
func (s *Psycopg) Prepare(ctx context.Context) error {
	check := "import " + strings.Join(psycopgModules, ", ") + "; print(psycopg.__version__)"
	out, err := exec.CommandContext(ctx, Python, "-c", check).CombinedOutput()
	if err != nil {
		return fmt.Errorf("driversuite: psycopg needs %s with %s (Debian's python3-psycopg, python3-psycopg-pool, "+
			"python3-pytest, python3-pytest-asyncio, python3-pytest-timeout): %w\n%s",
			Python, strings.Join(psycopgModules, ", "), err, out)
	}
	if v := strings.TrimSpace(string(out)); v != PsycopgVersion {
		return fmt.Errorf("driversuite: the tests are psycopg %s's but %s imports psycopg %s", PsycopgVersion, Python, v)
	}
	if _, err := os.Stat(filepath.Join(s.Src, "tests", "conftest.py")); err != nil {
		return fmt.Errorf("driversuite: psycopg tests not found in %s: %w", s.Src, err)
	}
	if err := os.RemoveAll(filepath.Join(s.Work, "tests")); err != nil {
		return err
	}
	if err := copyTree(filepath.Join(s.Src, "tests"), filepath.Join(s.Work, "tests")); err != nil {
		return fmt.Errorf("driversuite: copy psycopg tests: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(s.Src, "pyproject.toml"))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(s.Work, "pyproject.toml"), b, 0o644)
}

// Run runs pytest against e. Failing tests make pytest exit non-zero;
// only a missing or unreadable report is an error.
func (s *Psycopg) Run(ctx context.Context, e Endpoint, m Mode, logDir string) (*Result, error) {
	timeout := s.Timeout
	if timeout == 0 {
		timeout = 60 * time.Minute
	}
	testTimeout := s.TestTimeout
	if testTimeout == 0 {
		testTimeout = 60 * time.Second
	}
	if logDir == "" {
		logDir = s.Work
	}
	// conftest.py keeps state in pytest's cache between runs; each run
	// starts clean.
	if err := os.RemoveAll(filepath.Join(s.Work, ".pytest_cache")); err != nil {
		return nil, err
	}
	xmlFile := filepath.Join(logDir, "psycopg-"+string(m)+".xml")
	_ = os.Remove(xmlFile)
	dsn := fmt.Sprintf("host=%s port=%d user=%s password=%s dbname=%s", e.Host, e.Port, e.User, e.Password, e.Database)
	args := []string{"-m", "pytest", "--test-dsn", dsn, "--junitxml", xmlFile,
		"-o", "junit_family=xunit1", "-v", "-rN", "--timeout", fmt.Sprint(int(testTimeout.Seconds())),
		// The mypy checks need mypy and test nothing of the server.
		"--ignore", "tests/test_typing.py"}
	if len(s.Args) > 0 {
		args = append(args, s.Args...)
	} else {
		args = append(args, "tests")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, Python, args...)
	cmd.Dir = s.Work
	// PG* variables of the caller would change what libpq connects to.
	env := []string{"PYTHONDONTWRITEBYTECODE=1", "PYTHONNOUSERSITE=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "PSYCOPG") && !strings.HasPrefix(kv, "PYTHON") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	logFile, err := os.Create(filepath.Join(logDir, "psycopg-"+string(m)+".log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	start := time.Now()
	runErr := cmd.Run()
	res := newResult(s.Name(), m, "tests")
	f, err := os.Open(xmlFile)
	if err != nil {
		// pytest writes the XML only at the end: when it was killed (its
		// timeout, a hang), read what its verbose log says so far.
		log, lerr := os.ReadFile(logFile.Name())
		if lerr != nil || parseVerbose(res, string(log)) == 0 {
			return nil, fmt.Errorf("driversuite: pytest (%v, after %v) wrote no report; see %s: %w",
				runErr, time.Since(start).Round(time.Second), logFile.Name(), err)
		}
		res.Partial = fmt.Sprintf("pytest ended (%v) after %v before writing its report; outcomes read from its log",
			runErr, time.Since(start).Round(time.Second))
		return res, nil
	}
	defer f.Close()
	if err := parseJUnit(res, f); err != nil {
		return nil, err
	}
	return res, nil
}

// pytestVerboseRE matches pytest -v's per-test lines:
// "tests/test_x.py::TestC::test_y[p] PASSED   [ 1%]".
var pytestVerboseRE = regexp.MustCompile(`^(tests/\S+?\.py)::(\S.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b`)

// parseVerbose records the outcomes pytest -v printed, under the same
// identifiers parseJUnit uses, and returns how many lines it read.
func parseVerbose(res *Result, log string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		m := pytestVerboseRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n++
		mod := strings.ReplaceAll(strings.TrimSuffix(m[1], ".py"), "/", ".")
		name := m[2]
		if i := strings.LastIndex(name, "::"); i >= 0 {
			mod += "." + strings.ReplaceAll(name[:i], "::", ".")
			name = name[i+2:]
		}
		id := mod + "::" + name
		switch m[3] {
		case "PASSED", "XPASS":
			res.set(id, Pass, "")
		case "FAILED", "ERROR":
			res.set(id, Fail, "")
		default:
			res.set(id, Skip, "")
		}
	}
	return n
}

// junitCase is one <testcase> of pytest's JUnit XML.
type junitCase struct {
	Classname string       `xml:"classname,attr"`
	Name      string       `xml:"name,attr"`
	Failure   *junitDetail `xml:"failure"`
	Error     *junitDetail `xml:"error"`
	Skipped   *junitDetail `xml:"skipped"`
}

// junitDetail is a failure, error or skip with its message.
type junitDetail struct {
	Message string `xml:"message,attr"`
}

// parseJUnit records every <testcase> found anywhere in the document as
// "module::name" (pytest's classname with dots is module.Class).
func parseJUnit(res *Result, r io.Reader) error {
	dec := xml.NewDecoder(r)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("driversuite: read JUnit XML: %w", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Local != "testcase" {
			continue
		}
		var c junitCase
		if err := dec.DecodeElement(&c, &se); err != nil {
			return fmt.Errorf("driversuite: read JUnit testcase: %w", err)
		}
		id := c.Classname + "::" + c.Name
		switch {
		case c.Failure != nil:
			res.set(id, Fail, c.Failure.Message)
		case c.Error != nil:
			res.set(id, Fail, c.Error.Message)
		case c.Skipped != nil:
			res.set(id, Skip, "")
		default:
			res.set(id, Pass, "")
		}
	}
}
