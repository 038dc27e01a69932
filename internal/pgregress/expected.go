package pgregress

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Expected is the written list of tests that fail through the pooler for a
// known reason, per mode: test name to reason.
type Expected map[Mode]map[string]string

// ParseExpected reads the list: one test per line, "MODE TEST REASON...",
// where MODE is session or transaction; blank lines and lines starting with
// # are skipped. Every entry needs a reason.
func ParseExpected(r io.Reader) (Expected, error) {
	e := Expected{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("pgregress: expected-failures line %d: want \"MODE TEST REASON\", got %q", n, line)
		}
		m, err := ParseMode(f[0])
		if err != nil || m == Direct {
			return nil, fmt.Errorf("pgregress: expected-failures line %d: mode %q is not session or transaction", n, f[0])
		}
		if e[m] == nil {
			e[m] = map[string]string{}
		}
		if _, dup := e[m][f[1]]; dup {
			return nil, fmt.Errorf("pgregress: expected-failures line %d: %s %s listed twice", n, f[0], f[1])
		}
		e[m][f[1]] = strings.Join(f[2:], " ")
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("pgregress: reading expected failures: %w", err)
	}
	return e, nil
}

// Verdict compares a pooled mode's run with the direct one (nil when
// direct did not run: every test is then taken to pass directly, as all do
// on PostgreSQL 15) and the written list.
type Verdict struct {
	Mode Mode
	// Unexpected are tests that failed through the pooler, passed directly
	// and are not on the list: each fails the check.
	Unexpected []string
	// Hung are tests killed after the timeout: each fails the check.
	Hung []string
	// Harm are changes outside the run's database: each fails the check.
	Harm []string
	// Expected are the listed tests that failed, as written.
	Expected []string
	// Passed are listed tests that passed: the list may be out of date.
	Passed []string
	// DirectToo are tests that failed directly as well: not the pooler's.
	DirectToo []string
}

// OK reports whether the run passes the check.
func (v *Verdict) OK() bool {
	return len(v.Unexpected) == 0 && len(v.Hung) == 0 && len(v.Harm) == 0
}

// Judge compares r with direct and the list.
func Judge(r, direct *Result, e Expected) *Verdict {
	v := &Verdict{Mode: r.Mode, Hung: r.Hung, Harm: r.Harm}
	listed := e[r.Mode]
	for _, name := range r.Failed() {
		switch {
		case direct != nil && direct.Tests[name] != "ok":
			v.DirectToo = append(v.DirectToo, name)
		case listed[name] != "":
			v.Expected = append(v.Expected, name)
		default:
			v.Unexpected = append(v.Unexpected, name)
		}
	}
	for name := range listed {
		if r.Tests[name] == "ok" {
			v.Passed = append(v.Passed, name)
		}
	}
	sort.Strings(v.Passed)
	return v
}

// WriteReport prints a mode's counts and its verdict.
func WriteReport(w io.Writer, r *Result, v *Verdict, e Expected) {
	ok, failed := r.Counts()
	fmt.Fprintf(w, "\n== %s: %d ok, %d failed (%d hung), %s\n", r.Mode, ok, failed, len(r.Hung), r.Duration.Round(time.Second))
	if v == nil {
		for _, name := range r.Failed() {
			fmt.Fprintf(w, "  failed: %s\n", name)
		}
	} else {
		for _, name := range v.Hung {
			fmt.Fprintf(w, "  HUNG (killed after the per-test timeout): %s\n", name)
		}
		for _, name := range v.Unexpected {
			if !contains(v.Hung, name) {
				fmt.Fprintf(w, "  UNEXPECTED failure (passes directly, not on the list): %s\n", name)
			}
		}
		for _, name := range v.Expected {
			fmt.Fprintf(w, "  expected failure: %s: %s\n", name, e[r.Mode][name])
		}
		for _, name := range v.DirectToo {
			fmt.Fprintf(w, "  fails directly too: %s\n", name)
		}
		for _, name := range v.Passed {
			fmt.Fprintf(w, "  listed but passed (update the list?): %s\n", name)
		}
	}
	for _, h := range r.Harm {
		fmt.Fprintf(w, "  CHANGED outside the test database: %s\n", h)
	}
	for _, g := range r.Globals {
		fmt.Fprintf(w, "  cluster-wide objects left behind: %s\n", g)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
