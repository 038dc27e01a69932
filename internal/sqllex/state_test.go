package sqllex

import (
	"slices"
	"testing"
)

// stateCases pairs SQL text with the session state it may hold and
// release, and the kind StateKind names.
var stateCases = []struct {
	sql      string
	holds    Held
	releases Held
	opaque   bool
	kind     string
}{
	{"SELECT 1", 0, 0, false, ""},
	{"CREATE TEMP TABLE t (a int)", HeldTemp, 0, false, "CREATE TEMP"},
	{"create temporary table t as select 1", HeldTemp, 0, false, "CREATE TEMP"},
	{"CREATE TABLE pg_temp.t (a int)", HeldTemp, 0, false, "CREATE TEMP"},
	{`CREATE TABLE "pg_temp".t (a int)`, HeldTemp, 0, false, "CREATE TEMP"},
	{"SELECT 1 AS a INTO TEMP t", HeldTemp, 0, false, "SELECT INTO TEMP"},
	{"/* c */ select * into temporary table t from s", HeldTemp, 0, false, "SELECT INTO TEMP"},
	{"LISTEN chan", HeldListen, 0, false, "LISTEN"},
	{`listen "Chan"; SELECT 1`, HeldListen, 0, false, "LISTEN"},
	{"SELECT pg_advisory_lock(1)", HeldAdvisory, 0, false, "pg_advisory_lock"},
	{"SELECT pg_try_advisory_lock_shared(1, 2)", HeldAdvisory, 0, false, "pg_advisory_lock"},
	{"SELECT pg_advisory_xact_lock(1)", 0, 0, false, ""},
	{"DECLARE c CURSOR WITH HOLD FOR SELECT 1", HeldCursor, 0, false, "DECLARE WITH HOLD"},
	{"DECLARE c CURSOR FOR SELECT 1", 0, 0, false, ""},
	{"PREPARE p AS SELECT 1", HeldPrepare, 0, false, "PREPARE"},
	{"PREPARE TRANSACTION 'x'", 0, 0, false, ""},
	{"SELECT 1; LISTEN a; CREATE TEMP TABLE t ()", HeldListen | HeldTemp, 0, false, "LISTEN"},
	{"DISCARD ALL", 0, HeldAll, false, ""},
	{"DISCARD TEMP", 0, HeldTemp, false, ""},
	{"DROP TABLE t", 0, HeldTemp, false, ""},
	{"UNLISTEN *", 0, HeldListen, false, ""},
	{"SELECT pg_advisory_unlock_all()", 0, HeldAdvisory, false, ""},
	{"CLOSE ALL", 0, HeldCursor, false, ""},
	{"DEALLOCATE ALL", 0, HeldPrepare, false, ""},
	{"DEALLOCATE p", 0, HeldPrepare, false, ""},
	{"DO $$BEGIN CREATE TEMP TABLE t(); END$$", 0, 0, true, ""},
	{"CALL p()", 0, 0, true, ""},
	// Keywords inside strings, comments, dollar quotes and identifiers
	// are not statements.
	{"SELECT 'LISTEN x'", 0, 0, false, ""},
	{"SELECT $$CREATE TEMP TABLE t()$$", 0, 0, false, ""},
	{"SELECT $q$ $$ $q$; -- LISTEN x", 0, 0, false, ""},
	{`SELECT "pg_advisory_lock"`, 0, 0, false, ""},
	{"SELECT E'\\'; LISTEN x'", 0, 0, false, ""},
	{"/* LISTEN x; */ SELECT 1", 0, 0, false, ""},
	// Unsure text: both readings count.
	{"SELECT '\\'; LISTEN x; --'", HeldListen, 0, false, "LISTEN"},
	{"SELECT 'a\\'; LISTEN x; SELECT '", HeldListen, 0, false, "LISTEN"},
	{"LISTEN x; SELECT 'unterminated", HeldListen, 0, false, "LISTEN"},
}

func TestState(t *testing.T) {
	for _, tc := range stateCases {
		f := Classify(tc.sql).Flags
		if got := f.Holds(); got != tc.holds {
			t.Errorf("Holds(%q) = %v, want %v", tc.sql, got.Names(), tc.holds.Names())
		}
		if got := f.Releases(); got != tc.releases {
			t.Errorf("Releases(%q) = %v, want %v", tc.sql, got.Names(), tc.releases.Names())
		}
		if got := f.Opaque(); got != tc.opaque {
			t.Errorf("Opaque(%q) = %v, want %v", tc.sql, got, tc.opaque)
		}
		if got := StateKind(tc.sql); got != tc.kind {
			t.Errorf("StateKind(%q) = %q, want %q", tc.sql, got, tc.kind)
		}
	}
}

func TestHeldNames(t *testing.T) {
	if got, want := HeldAll.Names(), []string{"temp_table", "listen", "advisory_lock", "cursor_with_hold", "prepare"}; !slices.Equal(got, want) {
		t.Errorf("HeldAll.Names() = %v, want %v", got, want)
	}
	if got := Held(0).Names(); len(got) != 0 {
		t.Errorf("Held(0).Names() = %v", got)
	}
}

func TestStateKindAllocs(t *testing.T) {
	for _, sql := range []string{"SELECT 1 INTO TEMP t", "LISTEN x", "SELECT * FROM t WHERE a = $1"} {
		if n := testing.AllocsPerRun(100, func() { _ = StateKind(sql) }); n != 0 {
			t.Errorf("StateKind(%q): %v allocations", sql, n)
		}
	}
}

// FuzzState feeds arbitrary text to the session-state readers: nothing may
// panic, StateKind names a statement exactly when Holds is not empty, the
// kinds come from the statements' own flags, and a text whose statements
// release or hold nothing is not opaque unless it runs DO, CALL, an
// opaque function call or EXECUTE.
func FuzzState(f *testing.F) {
	for _, tc := range stateCases {
		f.Add(tc.sql)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		sum := Classify(sql).Flags
		holds, kind := sum.Holds(), StateKind(sql)
		if (holds != 0) != (kind != "") {
			t.Fatalf("%q: Holds = %v but StateKind = %q", sql, holds.Names(), kind)
		}
		if holds&^HeldAll != 0 || sum.Releases()&^HeldAll != 0 {
			t.Fatalf("%q: unknown kinds %v/%v", sql, holds, sum.Releases())
		}
		if sum.Opaque() != (sum&(DoBlock|Call|OpaqueCall|Execute) != 0) {
			t.Fatalf("%q: Opaque = %v with flags %v", sql, sum.Opaque(), sum)
		}
		var union Held
		for st := range Statements(sql) {
			union |= st.Flags.Holds()
		}
		if union&^holds != 0 {
			t.Fatalf("%q: statements hold %v, Classify only %v", sql, union.Names(), holds.Names())
		}
	})
}
