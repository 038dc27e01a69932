package sqllex

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// integerTexts are texts with integer constants and runs of digits that
// are not constants, next to every token a digit can touch.
var integerTexts = []string{
	"SELECT abalance FROM pgbench_accounts WHERE aid = 12345;",
	"SELECT 1",
	"select 1,2 ,3; select 42",
	"SELECT x1, t2.c3 FROM t2 WHERE c3 > 10 LIMIT 5 OFFSET 20",
	"SELECT '123', E'4\\n5', $$6$$, $a7$8$a7$, \"col9\" FROM t WHERE id = 10",
	"SELECT $1::int + 2, 3.5, .5, 1e5, 1E+5, 0x1F, 0o17, 0b11, 1_000, 12abc, 7",
	"SELECT 1..2, 3-4, 5+-6, 7*(8), array[9,10][11]",
	"SELECT 1 -- 2 comment 3\n, 4 /* 5 /* 6 */ 7 */ , 8",
	"SELECT set_config('a.b', '1', false), 2",
	"SET statement_timeout = 5000",
	"SET LOCAL work_mem = 64",
	"SELECT pg_advisory_lock(12)",
	"BEGIN; SELECT 1; COMMIT",
	"PREPARE p1 AS SELECT 1; EXECUTE p1(2)",
	"DECLARE c1 CURSOR WITH HOLD FOR SELECT 1",
	"SELECT 'unterminated 12",
	"SELECT U&'\\0041' UESCAPE '!' , 3",
	"SELECT 1 FROM generate_series(1, 100) g(i) WHERE i % 7 = 3",
	"SELECT ü1, 2ü, 3",
}

// corpus returns integerTexts and the fuzz corpus of Classify.
func corpus(t *testing.T) []string {
	texts := append([]string(nil), integerTexts...)
	files, _ := filepath.Glob("testdata/fuzz/FuzzClassify/*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		_, v, ok := strings.Cut(string(b), "\n")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(v, "string("), ")")); err == nil {
			texts = append(texts, s)
		}
	}
	return texts
}

// withDigits returns a with each span's digits replaced by a random run
// of one to six digits.
func withDigits(a string, spans []Span, r *rand.Rand) string {
	var b strings.Builder
	last := 0
	for _, sp := range spans {
		b.WriteString(a[last:sp.Start])
		for range 1 + r.IntN(6) {
			b.WriteByte(byte('0' + r.IntN(10)))
		}
		last = sp.End
	}
	b.WriteString(a[last:])
	return b.String()
}

// TestSameButIntegers checks the promise of SameButIntegers over the
// corpus: a text whose integer constants got other digits is recognised,
// and every reading of this package gives it what it gives the original.
func TestSameButIntegers(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	texts := corpus(t)
	if len(texts) < 50 {
		t.Fatalf("%d texts: the fuzz corpus was not read", len(texts))
	}
	if got := IntegerSpans(integerTexts[0], nil); len(got) != 1 || integerTexts[0][got[0].Start:got[0].End] != "12345" {
		t.Fatalf("IntegerSpans(%q) = %v", integerTexts[0], got)
	}
	for _, a := range texts {
		spans := IntegerSpans(a, nil)
		for range 20 {
			b := withDigits(a, spans, r)
			if !SameButIntegers(a, b, spans) {
				t.Fatalf("%q and %q: not recognised", a, b)
			}
			if ca, cb := Classify(a), Classify(b); ca != cb {
				t.Errorf("%q: %v, %q: %v", a, ca, b, cb)
			}
			if Fingerprint(a) != Fingerprint(b) {
				t.Errorf("%q and %q: fingerprints differ", a, b)
			}
			if StateKind(a) != StateKind(b) {
				t.Errorf("%q and %q: state kinds differ", a, b)
			}
			var fa, fb []Flags
			for st := range Statements(a) {
				fa = append(fa, st.Flags)
			}
			for st := range Statements(b) {
				fb = append(fb, st.Flags)
			}
			if len(fa) != len(fb) {
				t.Errorf("%q and %q: %d and %d statements", a, b, len(fa), len(fb))
				continue
			}
			for i := range fa {
				if fa[i] != fb[i] {
					t.Errorf("%q and %q: statement %d: %v and %v", a, b, i, fa[i], fb[i])
				}
			}
		}
	}
}

// TestSameButIntegersRefuses checks texts that differ in a run of digits
// that is no integer constant of its own, or elsewhere.
func TestSameButIntegersRefuses(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"SELECT x1", "SELECT x2"},                           // identifier
		{"SELECT '1'", "SELECT '2'"},                         // string
		{"SELECT $1", "SELECT $2"},                           // parameter
		{"SELECT 1.5", "SELECT 2.5"},                         // not a plain run
		{"SELECT 1e5", "SELECT 1e6"},                         // exponent
		{"SELECT 0x1F", "SELECT 0x2F"},                       // radix
		{"SELECT 0x1F", "SELECT 1x1F"},                       // radix prefix
		{"SELECT 1_000", "SELECT 2_000"},                     // underscores
		{"SELECT 12abc", "SELECT 13abc"},                     // trailing junk
		{"SELECT 1 -- 2", "SELECT 1 -- 3"},                   // comment
		{"SELECT $a1$x$a1$", "SELECT $a2$x$a2$"},             // dollar tag
		{"SELECT 1", "SELECT 1 "},                            // another byte
		{"SELECT 1", "SELECT a"},                             // not digits
		{"SELECT 1", "SELECT"},                               // shorter
		{"SELECT 'a\\' 1", "SELECT 'a\\' 2"},                 // backslash: two readings
		{"SELECT 1 FROM t2", "SELECT 1 FROM t3"},             // table name
		{"SELECT ü1", "SELECT ü2"},                           // identifier of non-ASCII bytes
		{"PREPARE p1 AS SELECT 1", "PREPARE p2 AS SELECT 1"}, // statement name
	} {
		if SameButIntegers(tc.a, tc.b, IntegerSpans(tc.a, nil)) {
			t.Errorf("%q and %q: taken for the same text but integers", tc.a, tc.b)
		}
	}
	if !SameButIntegers("SELECT 1", "SELECT 1", nil) {
		t.Error("equal texts not recognised")
	}
}
