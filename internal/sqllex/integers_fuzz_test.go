package sqllex

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// memoSeeds are texts whose runs of digits touch every token a digit can
// touch: letters, '.', 'e', '_', '$', quotes, backslashes, E'…' and U&'…'
// strings, dollar quotes and their tags, line and nested block comments,
// radix prefixes and PostgreSQL 15/16 trailing junk.
var memoSeeds = []string{
	"SELECT 1",
	"SELECT 1; SET role postgres",
	"SELECT 1; SELECT set_config('role', 'x', false)",
	"SELECT 1 /* 2 /* 3 */ 4 */; RESET ALL",
	"SELECT 1 -- 2\n; DISCARD ALL",
	"SELECT 1 --\r2; SET search_path = x",
	"SELECT $$1$$, $a1$ 2 $a1$, $1, 2",
	"SELECT 1$$x$$",
	"SELECT 1 $x1$ 2 $x1$ 3",
	"SELECT E'1''2', 3, U&'4' UESCAPE '5', 6",
	"SELECT 1, 'a''1', 2",
	"SELECT 1., .5, 5., 1.e5, 1e, 1e+, 1e+5, 1E-5x, 2",
	"SELECT 1_000, 1__0, 1_, 0x1F, 0X1f, 0o17, 0b101, 0b2, 0x, 00x1, 3",
	"SELECT 123abc, 1a, 1$, 1_a, 1é, 2",
	"SELECT 1..2, 1...2, 1.2.3, 3",
	"SELECT 1::int, 2:3, 4:=5, a[6:7]",
	"SELECT x1 1, \"1\" 2, U&\"3\" 4",
	"SELECT 1 FROM pg_temp_1.t, 2",
	"SELECT n'1', b'01', x'1F', 2",
	"SELECT 1 \\; SET role x",
	"SELECT '\\' 1; SET role x --'",
	"SELECT 1 'unterminated",
	"SELECT 1 /* unterminated 2",
	"SELECT 1 $u$ unterminated 2",
	"PREPARE p1 AS SELECT 1; EXECUTE p1(2)",
	"BEGIN; SELECT 1; COMMIT",
	"SELECT pg_advisory_lock(1), 2",
	"SELECT 1;;; ; SELECT 2",
	"select 1 from t where a=1 and b=2 or c<>3 limit 4 offset 5",
}

// FuzzSameButIntegers is a differential check of the memo of the
// pooler's simple-Query path: whenever SameButIntegers takes b for a with
// other integer constants, every reading of this package must give b
// exactly what it gives a. b comes as given and as a mutation of a's runs
// of digits (changed, lengthened, shortened, emptied, or a digit put
// next to any byte) driven by seed.
func FuzzSameButIntegers(f *testing.F) {
	for i, a := range memoSeeds {
		f.Add(a, a, uint64(i))
		f.Add(a, strings.ReplaceAll(a, "1", "9"), uint64(i)*7919)
	}
	f.Fuzz(func(t *testing.T, a, b string, seed uint64) {
		checkSameButIntegers(t, a, b)
		r := rand.New(rand.NewPCG(seed, uint64(len(a))))
		for range 4 {
			checkSameButIntegers(t, a, mutateDigits(a, r, seed&1 == 1))
		}
	})
}

// mutateDigits returns a with its runs of digits rewritten at random,
// and, when anywhere is set, now and then a digit inserted before any
// byte, a byte dropped or a run of digits emptied. Without anywhere the
// result differs from a in digits alone, the case SameButIntegers must
// get right most often.
func mutateDigits(a string, r *rand.Rand, anywhere bool) string {
	var b strings.Builder
	for i := 0; i < len(a); {
		if anywhere && r.IntN(16) == 0 {
			b.WriteByte(byte('0' + r.IntN(10))) // a digit next to whatever follows
		}
		if !isDigit(a[i]) {
			if !anywhere || r.IntN(64) != 0 {
				b.WriteByte(a[i])
			}
			i++
			continue
		}
		j := i
		for j < len(a) && isDigit(a[j]) {
			j++
		}
		switch r.IntN(4) {
		case 0:
			b.WriteString(a[i:j])
		case 1:
			for range j - i {
				b.WriteByte(byte('0' + r.IntN(10)))
			}
		case 2:
			for range 1 + r.IntN(20) {
				b.WriteByte(byte('0' + r.IntN(10)))
			}
		case 3:
			if anywhere && r.IntN(2) == 0 {
				break
			}
			b.WriteString(a[i : j-1])
			if j-i == 1 {
				b.WriteByte(byte('0' + r.IntN(10)))
			}
		}
		i = j
	}
	return b.String()
}

// reading is everything this package says about a text that the pooler
// may act on.
type reading struct {
	Summary     Summary
	Fingerprint uint64
	StateKind   string
	Stmts       []stmtReading
	Kinds       []tokKind
}

type stmtReading struct {
	Flags Flags
	Name  string
	Words []Word
}

func readAll(sql string) reading {
	rd := reading{Summary: Classify(sql), Fingerprint: Fingerprint(sql), StateKind: StateKind(sql)}
	for st := range Statements(sql) {
		rd.Stmts = append(rd.Stmts, stmtReading{st.Flags, st.Name, append([]Word(nil), st.Words()...)})
	}
	for _, esc := range []bool{false, true} {
		l := lexer{src: sql, escapeStrings: esc}
		for {
			t := l.next()
			rd.Kinds = append(rd.Kinds, t.kind)
			if t.kind == tEOF || t.kind == tBad {
				break
			}
		}
	}
	return rd
}

// checkSameButIntegers fails when SameButIntegers takes b for a with other
// integers but a reading of b differs from a's.
func checkSameButIntegers(t *testing.T, a, b string) {
	t.Helper()
	spans := IntegerSpans(a, nil)
	if !SameButIntegers(a, b, spans) {
		return
	}
	if !DifferInDigitsOnly(a, b) {
		t.Fatalf("%q and %q: SameButIntegers without DifferInDigitsOnly", a, b)
	}
	if ra, rb := readAll(a), readAll(b); !reflect.DeepEqual(ra, rb) {
		t.Fatalf("%q and %q taken for the same text but integers:\n%+v\n%+v", a, b, ra, rb)
	}
	if sb := IntegerSpans(b, nil); len(sb) != len(spans) {
		t.Fatalf("%q and %q: %d and %d integer constants", a, b, len(spans), len(sb))
	}
}

// TestFuzzSameButIntegersBites checks that the fuzz target's digit-only
// mutations are often taken by SameButIntegers, so the differential check
// runs on more than equal texts.
func TestFuzzSameButIntegersBites(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var tried, taken int
	for _, a := range memoSeeds {
		spans := IntegerSpans(a, nil)
		for range 50 {
			b := mutateDigits(a, r, false)
			tried++
			if b != a && SameButIntegers(a, b, spans) {
				taken++
				checkSameButIntegers(t, a, b)
			}
		}
	}
	t.Logf("%d of %d mutations taken", taken, tried)
	if taken < tried/10 {
		t.Fatalf("only %d of %d mutations taken", taken, tried)
	}
}
