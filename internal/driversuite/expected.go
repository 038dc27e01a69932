package driversuite

import (
	"bufio"
	_ "embed" // the transaction-mode list
	"fmt"
	"io"
	"sort"
	"strings"
)

// transactionExpected is the written list of the CI subset's tests that
// pass directly but not in transaction mode, each with its reason.
//
//go:embed transaction-expected.txt
var transactionExpected string

// TransactionExpected returns the written list of tests that are expected
// to pass directly but not through pgquic in transaction mode: test id to
// reason. The list lives in transaction-expected.txt.
func TransactionExpected() (map[string]string, error) {
	return ParseExpected(strings.NewReader(transactionExpected))
}

// ParseExpected reads a list of expected failures: "reason KEY TEXT" lines
// define reasons, every other line is "KEY TEST-ID" (the id may hold
// spaces); blank lines and lines starting with # are skipped. Each test
// must name a defined reason, once.
func ParseExpected(r io.Reader) (map[string]string, error) {
	reasons := map[string]string{}
	type entry struct {
		key, id string
		line    int
	}
	var entries []entry
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, rest, ok := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		if !ok || rest == "" {
			return nil, fmt.Errorf("driversuite: expected-failures line %d: want \"KEY TEST-ID\" or \"reason KEY TEXT\", got %q", n, line)
		}
		if key == "reason" {
			k, text, ok := strings.Cut(rest, " ")
			if !ok || strings.TrimSpace(text) == "" {
				return nil, fmt.Errorf("driversuite: expected-failures line %d: reason %q has no text", n, k)
			}
			reasons[k] = strings.TrimSpace(text)
			continue
		}
		entries = append(entries, entry{key, rest, n})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("driversuite: reading expected failures: %w", err)
	}
	out := make(map[string]string, len(entries))
	for _, e := range entries {
		text, ok := reasons[e.key]
		if !ok {
			return nil, fmt.Errorf("driversuite: expected-failures line %d: reason %q is not defined", e.line, e.key)
		}
		if _, dup := out[e.id]; dup {
			return nil, fmt.Errorf("driversuite: expected-failures line %d: %s listed twice", e.line, e.id)
		}
		out[e.id] = text
	}
	return out, nil
}

// expectedReason returns the reason id is on the list: its own, or, for a
// node-postgres case, its file's (a file stops at its first failure, so
// the cases after it did not run).
func expectedReason(expected map[string]string, id string) (string, bool) {
	if r, ok := expected[id]; ok {
		return r, true
	}
	if file, _, ok := strings.Cut(id, " :: "); ok {
		r, ok := expected[file]
		return r, ok
	}
	return "", false
}

// SplitExpected divides the tests that pass directly but not in r into
// those on the list (expected) and the others (unexpected), sorted; stale
// lists the listed tests of r's suite that passed in r.
func SplitExpected(direct, r *Result, expected map[string]string) (unexpected, listed, stale []string) {
	for _, id := range Regressions(direct, r) {
		if _, ok := expectedReason(expected, id); ok {
			listed = append(listed, id)
		} else {
			unexpected = append(unexpected, id)
		}
	}
	for id := range expected {
		if r.Tests[id] == Pass {
			stale = append(stale, id)
		}
	}
	sort.Strings(stale)
	return unexpected, listed, stale
}

// WriteVerdict prints, for a transaction-mode run, which regressions are on
// the written list (with the reason) and which are not.
func WriteVerdict(w io.Writer, direct, r *Result, expected map[string]string) {
	unexpected, listed, stale := SplitExpected(direct, r, expected)
	fmt.Fprintf(w, "\n%s, %s mode: %d on the list of expected failures, %d not on it\n", r.Suite, r.Mode, len(listed), len(unexpected))
	for _, id := range unexpected {
		fmt.Fprintf(w, "  UNEXPECTED: %s\n", id)
	}
	for _, id := range listed {
		reason, _ := expectedReason(expected, id)
		fmt.Fprintf(w, "  expected: %s: %s\n", id, firstLine(reason)[1:])
	}
	for _, id := range stale {
		fmt.Fprintf(w, "  listed but passed (update transaction-expected.txt?): %s\n", id)
	}
}
