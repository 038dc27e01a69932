package driversuite

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Outcome is one test's result.
type Outcome string

const (
	// Pass means the test ran and passed.
	Pass Outcome = "pass"
	// Fail means the test failed, errored, timed out or its process died.
	Fail Outcome = "fail"
	// Skip means the suite skipped the test.
	Skip Outcome = "skip"
)

// rank orders outcomes so that a test reported twice (pytest reports a
// passing call with a failing teardown that way) keeps its worst one.
func (o Outcome) rank() int {
	switch o {
	case Fail:
		return 2
	case Skip:
		return 1
	}
	return 0
}

// Result is one suite's run in one mode.
type Result struct {
	// Suite is the suite's name.
	Suite string `json:"suite"`
	// Mode is how the suite reached PostgreSQL.
	Mode Mode `json:"mode"`
	// Tests maps a test's identifier to its outcome. Identifiers are the
	// suite's own: "file.js" and "file.js :: case" for node-postgres,
	// pytest's "module::test[params]" for psycopg.
	Tests map[string]Outcome `json:"tests"`
	// Detail keeps a short failure text per failed test.
	Detail map[string]string `json:"detail,omitempty"`
	// Units says what the primary counts are of ("files", "tests"); for
	// node-postgres Cases count the test cases inside the files too.
	Units string `json:"units"`
	// Duration is the run's wall time.
	Duration time.Duration `json:"duration_ns"`
	// Partial, when set, says why the run ended early: its outcomes cover
	// only the tests reached.
	Partial string `json:"partial,omitempty"`
	// Accepted is how many client connections the pooler accepted during
	// the run (0 for direct runs).
	Accepted int64 `json:"accepted,omitempty"`
}

// newResult makes an empty result.
func newResult(suite string, m Mode, units string) *Result {
	return &Result{Suite: suite, Mode: m, Units: units, Tests: map[string]Outcome{}, Detail: map[string]string{}}
}

// set records an outcome, keeping the worst when a test reports twice.
func (r *Result) set(id string, o Outcome, detail string) {
	if old, ok := r.Tests[id]; ok && old.rank() >= o.rank() {
		return
	}
	r.Tests[id] = o
	if o == Fail && detail != "" {
		r.Detail[id] = detail
	}
}

// Counts are a result's totals per outcome.
type Counts struct {
	Pass, Fail, Skip int
}

// String prints counts as "N passed, N failed, N skipped".
func (c Counts) String() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped", c.Pass, c.Fail, c.Skip)
}

// Count totals the tests whose identifier keep accepts (all when nil).
func (r *Result) Count(keep func(id string) bool) Counts {
	var c Counts
	for id, o := range r.Tests {
		if keep != nil && !keep(id) {
			continue
		}
		switch o {
		case Pass:
			c.Pass++
		case Fail:
			c.Fail++
		case Skip:
			c.Skip++
		}
	}
	return c
}

// With lists, sorted, the tests with outcome o.
func (r *Result) With(o Outcome) []string {
	var ids []string
	for id, got := range r.Tests {
		if got == o {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// Regressions lists, sorted, the tests that passed in ref but did not pass
// in r: they failed, were skipped, or did not run at all (their file or
// process died before reaching them).
func Regressions(ref, r *Result) []string {
	var ids []string
	for id, o := range ref.Tests {
		if o == Pass && r.Tests[id] != Pass {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// isCase reports whether a node-postgres identifier names a case inside a
// file rather than the file.
func isCase(id string) bool { return strings.Contains(id, " :: ") }

// WriteReport prints, for one suite, the counts per mode and the tests that
// pass directly but not through pgquic, mode by mode, with the first line of
// each failure. direct may be nil when the direct run was not asked for.
func WriteReport(w io.Writer, direct *Result, others []*Result) {
	all := others
	if direct != nil {
		all = append([]*Result{direct}, others...)
	}
	if len(all) == 0 {
		return
	}
	suite := all[0].Suite
	fmt.Fprintf(w, "\n==================== %s ====================\n", suite)
	for _, r := range all {
		line := fmt.Sprintf("%-12s %s: %s", r.Mode, r.Units, r.Count(func(id string) bool { return !isCase(id) }))
		if r.Units == "files" {
			line += fmt.Sprintf("; cases: %s", r.Count(isCase))
		}
		line += fmt.Sprintf(" (%s", r.Duration.Round(time.Second))
		if r.Mode != Direct {
			line += fmt.Sprintf(", %d client connections through pgquic", r.Accepted)
		}
		fmt.Fprintln(w, line+")")
		if r.Partial != "" {
			fmt.Fprintf(w, "             PARTIAL: %s\n", r.Partial)
		}
	}
	if direct == nil {
		return
	}
	if f := direct.With(Fail); len(f) > 0 {
		fmt.Fprintf(w, "\nfailing directly too (%d; not counted as pgquic's):\n", len(f))
		for _, id := range f {
			fmt.Fprintf(w, "  %s\n", id)
		}
	}
	for _, r := range others {
		reg := Regressions(direct, r)
		fmt.Fprintf(w, "\npass directly, not through pgquic in %s mode (%d):\n", r.Mode, len(reg))
		for _, id := range reg {
			fmt.Fprintf(w, "  %s [%s]%s\n", id, outcomeOrMissing(r.Tests[id]), firstLine(r.Detail[id]))
		}
	}
}

// outcomeOrMissing names what happened to a test that did not pass.
func outcomeOrMissing(o Outcome) string {
	if o == "" {
		return "did not run"
	}
	return string(o)
}

// firstLine is the first non-empty line of s, shortened, prefixed by " ".
func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			if len(l) > 160 {
				l = l[:160] + "..."
			}
			return " " + l
		}
	}
	return ""
}
