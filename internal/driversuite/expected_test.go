package driversuite

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// TestTransactionExpectedList: the committed list parses, every entry has
// a reason, and the entries of the node-postgres and psycopg subsets are
// tests the CI subset runs.
func TestTransactionExpectedList(t *testing.T) {
	e, err := TransactionExpected()
	if err != nil {
		t.Fatal(err)
	}
	if len(e) == 0 {
		t.Fatal("the list is empty")
	}
	for id, reason := range e {
		if reason == "" {
			t.Errorf("%s has no reason", id)
		}
		if !inSelection(id, CINodePostgresFiles) && !inSelection(id, CIPsycopgModules) {
			t.Errorf("%s is not in the CI subset", id)
		}
	}
}

func TestParseExpected(t *testing.T) {
	good := "# comment\n\nreason r1 Because of one thing.\nr1 a.js\nr1 tests.test_x::test_y[a b]\n"
	e, err := ParseExpected(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	if e["a.js"] != "Because of one thing." || e["tests.test_x::test_y[a b]"] != "Because of one thing." || len(e) != 2 {
		t.Errorf("parsed %v", e)
	}
	for _, bad := range []string{
		"r1 a.js\n",                       // undefined reason
		"reason r1\n",                     // reason without text
		"reason r1 x\nr1 a.js\nr1 a.js\n", // listed twice
		"lonely\n",                        // no id
	} {
		if _, err := ParseExpected(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseExpected(%q) accepted it", bad)
		}
	}
}

// TestSplitExpected: a regression is expected when listed itself or, for a
// node-postgres case, through its file; others are unexpected; listed
// tests that passed are reported as stale.
func TestSplitExpected(t *testing.T) {
	direct := &Result{Suite: "s", Mode: Direct, Tests: map[string]Outcome{
		"f.js": Pass, "f.js :: c1": Pass, "g.js": Pass, "h.js": Pass, "k.js": Fail}}
	tx := &Result{Suite: "s", Mode: Transaction, Tests: map[string]Outcome{
		"f.js": Fail, "g.js": Fail, "h.js": Pass, "k.js": Fail}}
	e := map[string]string{"f.js": "own pid", "h.js": "prepared list"}
	unexpected, listed, stale := SplitExpected(direct, tx, e)
	if !slices.Equal(unexpected, []string{"g.js"}) || !slices.Equal(listed, []string{"f.js", "f.js :: c1"}) || !slices.Equal(stale, []string{"h.js"}) {
		t.Errorf("unexpected %v, listed %v, stale %v", unexpected, listed, stale)
	}
	var buf bytes.Buffer
	WriteVerdict(&buf, direct, tx, e)
	for _, want := range []string{"2 on the list of expected failures, 1 not on it", "UNEXPECTED: g.js", "expected: f.js: own pid", "listed but passed (update transaction-expected.txt?): h.js"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("verdict lacks %q:\n%s", want, buf.String())
		}
	}
}
