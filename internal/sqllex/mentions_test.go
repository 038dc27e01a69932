package sqllex

import (
	"strings"
	"testing"
)

// mentionsCases pairs SQL text and the names and operators looked for
// with what MentionsAny must report.
var mentionsCases = []struct {
	sql    string
	idents []string
	ops    []string
	want   bool
}{
	// Names as PostgreSQL records them: unquoted ones folded, quoted ones
	// kept, escapes undone.
	{"SELECT * FROM hid_v", []string{"hid_v"}, nil, true},
	{"select * from HID_V", []string{"hid_v"}, nil, true},
	{"SELECT * FROM Hid_V", []string{"Hid_V"}, nil, false},
	{`SELECT * FROM "Hid_V"`, []string{"Hid_V"}, nil, true},
	{`SELECT * FROM "HID_V"`, []string{"hid_v"}, nil, false},
	{`SELECT * FROM "hid""v"`, []string{`hid"v`}, nil, true},
	{`SELECT * FROM U&"hid\005fv"`, []string{"hid_v"}, nil, true},
	{`SELECT * FROM u&"hid\+00005Fv"`, []string{"hid_v"}, nil, true},
	{`SELECT * FROM U&"hid!005fv" UESCAPE '!'`, []string{"hid_v"}, nil, true},
	{`SELECT * FROM U&"hid\\v"`, []string{`hid\v`}, nil, true},
	{"SELECT * FROM ÉCOLE_Ab", []string{"école_ab", "ÉCOLE_Ab"}, nil, false}, // only ASCII letters fold
	{"SELECT * FROM ÉCOLE_Ab", []string{"\u00c9cole_ab"}, nil, true},
	{"SELECT * FROM hid$v", []string{"hid$v"}, nil, true},
	{"SELECT '5'::posint", []string{"posint"}, nil, true},
	{"SELECT 1; SELECT 2; SELECT * FROM hid_v", []string{"hid_v"}, nil, true},
	{"SELECT 'a'hid_v", []string{"hid_v"}, nil, true},
	// Keywords are identifier tokens too.
	{"SELECT 1", []string{"select"}, nil, true},
	{`SELECT 1 FROM "select"`, []string{"select"}, nil, true},
	// Every part of a qualified name counts.
	{"SELECT * FROM app.hid_v", []string{"hid_v"}, nil, true},
	{"SELECT * FROM app.hid_v", []string{"app"}, nil, true},
	{"SELECT * FROM db.app.hid_v", []string{"db"}, nil, true},
	{`SELECT * FROM "App".Hid_V`, []string{"App"}, nil, true},
	{`SELECT * FROM "App".Hid_V`, []string{"app", "Hid_V"}, nil, false},
	{"SELECT * FROM app.other", []string{"hid_v"}, nil, false},
	// Whole tokens only.
	{"SELECT hid_vx, xhid_v FROM t", []string{"hid_v"}, nil, false},
	// Names in constants and comments do not count.
	{"SELECT 'hid_v'", []string{"hid_v"}, nil, false},
	{"SELECT 'hid_v'::regclass", []string{"hid_v"}, nil, false},
	{"SELECT E'\\' hid_v'", []string{"hid_v"}, nil, false},
	{"SELECT N'hid_v', B'01', X'0F', U&'hid_v'", []string{"hid_v"}, nil, false},
	{"SELECT 'a'\n'hid_v'", []string{"hid_v"}, nil, false},
	{"SELECT $$hid_v$$", []string{"hid_v"}, nil, false},
	{"SELECT $q$ $$ hid_v $$ $q$", []string{"hid_v"}, nil, false},
	{"SELECT $hid_v$x$hid_v$", []string{"hid_v"}, nil, false},
	{"SELECT 1 -- hid_v", []string{"hid_v"}, nil, false},
	{"/* hid_v */ SELECT 1", []string{"hid_v"}, nil, false},
	{"/* /* */ hid_v */ SELECT 1", []string{"hid_v"}, nil, false},
	{`SELECT "x" FROM t -- "hid_v"`, []string{"hid_v"}, nil, false},
	{"SELECT $1, $2", []string{"hid_v"}, nil, false},
	// Names are cut to 63 bytes, whatever their length.
	{"SELECT * FROM " + strings.Repeat("a", 70), []string{strings.Repeat("a", 63)}, nil, true},
	{"SELECT * FROM " + strings.Repeat("a", 70), []string{strings.Repeat("a", 70)}, nil, false},
	{"SELECT * FROM " + strings.Repeat("A", 64), []string{strings.Repeat("a", 63)}, nil, true},
	{"SELECT * FROM " + strings.Repeat("b", 63), []string{strings.Repeat("b", 63)}, nil, true},
	{"SELECT * FROM " + strings.Repeat("B", 700), []string{strings.Repeat("b", 63)}, nil, true},
	{`SELECT * FROM "` + strings.Repeat("C", 70) + `"`, []string{strings.Repeat("C", 63)}, nil, true},
	{`SELECT * FROM "` + strings.Repeat("C", 700) + `"`, []string{strings.Repeat("C", 63)}, nil, true},
	{`SELECT * FROM "` + strings.Repeat(`""`, 350) + `"`, []string{strings.Repeat(`"`, 63)}, nil, true},
	{`SELECT * FROM "` + strings.Repeat("é", 40) + `"`, []string{strings.Repeat("é", 31)}, nil, true},
	{`SELECT * FROM "x` + strings.Repeat("é", 350) + `"`, []string{"x" + strings.Repeat("é", 31)}, nil, true},
	{"SELECT * FROM xx" + strings.Repeat("é", 350), []string{"xx" + strings.Repeat("é", 30)}, nil, true},
	{`SELECT * FROM "xx` + strings.Repeat("é", 350) + `"`, []string{"xx" + strings.Repeat("é", 30)}, nil, true},
	{`SELECT * FROM "xx` + strings.Repeat("é", 350) + `"`, []string{"xx" + strings.Repeat("é", 30) + "\xc3"}, nil, false},
	{`SELECT * FROM U&"` + strings.Repeat(`\0064`, 70) + `"`, []string{strings.Repeat("d", 63)}, nil, true},
	{`SELECT * FROM U&"` + strings.Repeat(`\+000064`, 63) + `"`, []string{strings.Repeat("d", 63)}, nil, true},
	{`SELECT * FROM U&"` + strings.Repeat(`\+000064`, 63) + `"`, []string{"zz"}, nil, false},
	{`SELECT * FROM U&"` + strings.Repeat(`!+000064`, 63) + `" UESCAPE '!'`, []string{strings.Repeat("d", 63)}, nil, true},
	// Operators: a substring of any operator token counts.
	{"SELECT 1 ### 2", nil, []string{"###"}, true},
	{"SELECT 1 + 2", nil, []string{"###"}, false},
	{"SELECT 1+###-2", nil, []string{"###"}, true},
	{"SELECT 1 ##- 2", nil, []string{"##"}, true},
	{"SELECT a @@@ b", nil, []string{"@@"}, true},
	{"SELECT 1 *- 2", nil, []string{"*-"}, false}, // PostgreSQL splits it: * then -
	{"SELECT 1 *- 2", nil, []string{"-"}, true},
	{"SELECT 1 OPERATOR(public.###) 2", nil, []string{"###"}, true},
	{"SELECT 1 OPERATOR(public.###) 2", []string{"public"}, nil, true},
	{"SELECT 1 OPERATOR(public.+) 2", nil, []string{"###"}, false},
	{"SELECT 1 @-- ###\n 2", nil, []string{"###"}, false},
	{"SELECT 1 @/* ### */ 2", nil, []string{"###"}, false},
	{"SELECT '###', $$###$$, \"###\"", nil, []string{"###"}, false},
	{"SELECT 1 + 2", nil, []string{""}, true}, // an empty operator is in every one
	{"SELECT 1", nil, []string{""}, false},
	// Unreadable text.
	{"SELECT 'abc", []string{"zz"}, nil, true},
	{"SELECT 'abc", nil, []string{"###"}, true},
	{`SELECT "abc`, []string{"zz"}, nil, true},
	{"SELECT 1 /* x", []string{"zz"}, nil, true},
	{"SELECT $a$ x", []string{"zz"}, nil, true},
	{`SELECT U&'x`, []string{"zz"}, nil, true},
	{`SELECT * FROM U&"bad\00"`, []string{"zz"}, nil, true},
	{`SELECT * FROM U&"bad\00"`, nil, []string{"###"}, true},
	{`SELECT * FROM U&"\d800"`, []string{"zz"}, nil, true},
	{`SELECT * FROM U&"x" UESCAPE hid_v`, []string{"zz"}, nil, true},
	{`SELECT U&'x' UESCAPE '+'`, []string{"zz"}, nil, true},
	{`SELECT U&'x' UESCAPE hid_v`, []string{"zz"}, nil, true},
	{`SELECT U&'x' UESCAPE '!'`, []string{"zz"}, nil, false},
	{`SELECT * FROM U&"` + strings.Repeat("d", 700) + `"`, []string{"zz"}, nil, true}, // too long to decode here
	// A backslash in a plain string: both readings count.
	{`SELECT 'a\'; SELECT x FROM hid_v; --'`, []string{"hid_v"}, nil, true},
	{`SELECT 'a\''; SELECT x FROM hid_v; --'`, []string{"hid_v"}, nil, true}, // only with standard_conforming_strings off
	{`SELECT 'a\'' ### 1 --'`, nil, []string{"###"}, true},
	{`SELECT 'a\'' ### 1`, nil, []string{"zz"}, true}, // unterminated with standard_conforming_strings on
	{`SELECT 'C:\temp', 1`, []string{"hid_v"}, []string{"###"}, false},
	{`SELECT E'a\'; hid_v'`, []string{"hid_v"}, nil, false},
	// Nothing to look for: nothing is read.
	{"SELECT * FROM hid_v", nil, nil, false},
	{"SELECT 'unterminated", nil, nil, false},
	{"SELECT 'unterminated", []string{}, []string{}, false},
}

func TestMentionsAny(t *testing.T) {
	for _, tc := range mentionsCases {
		var idents map[string]struct{}
		if tc.idents != nil {
			idents = make(map[string]struct{}, len(tc.idents))
			for _, n := range tc.idents {
				idents[n] = struct{}{}
			}
		}
		if got := MentionsAny(tc.sql, idents, tc.ops); got != tc.want {
			t.Errorf("MentionsAny(%.80q, %q, %q) = %v, want %v", tc.sql, tc.idents, tc.ops, got, tc.want)
		}
	}
}

// TestMentionsAnyAllocs checks that MentionsAny allocates nothing, for
// short and long names, hits and misses, and both readings.
func TestMentionsAnyAllocs(t *testing.T) {
	idents := map[string]struct{}{"hid_v": {}, "Hid_T": {}, strings.Repeat("a", 63): {}}
	ops := []string{"###", "@@@"}
	for _, sql := range append(hotQueries,
		"SELECT * FROM hid_v",
		`SELECT * FROM U&"hid\005fv" UESCAPE '\'`,
		"SELECT * FROM "+strings.Repeat("A", 700),
		`SELECT * FROM "`+strings.Repeat("x", 700)+`"`,
		`SELECT * FROM "`+strings.Repeat("x", 200)+`"`,
		`SELECT 'a\''; SELECT x FROM hid_v; --'`,
		`SELECT 'C:\temp' FROM t WHERE a ### b`,
	) {
		if n := testing.AllocsPerRun(100, func() { MentionsAny(sql, idents, ops) }); n != 0 {
			t.Errorf("MentionsAny(%.60q) allocates %.1f times per run, want 0", sql, n)
		}
	}
}

// TestHarmlessBuiltin checks HarmlessBuiltin against the rules it
// summarises, on names of every kind and on every built-in.
func TestHarmlessBuiltin(t *testing.T) {
	for name, want := range map[string]bool{
		"lower": true, "now": true, "count": true, "nextval": true, "substring": true,
		"coalesce":          false, // a keyword, not a function PostgreSQL has in pg_proc
		"RI_FKey_check_ins": true, "ri_fkey_check_ins": false,
		"set_config": false, "pg_advisory_lock": false, "pg_advisory_xact_lock": true,
		"pg_advisory_unlock_all": false, "setseed": false, "pg_terminate_backend": false,
		"query_to_xml": false, "table_to_xml": false, "ts_stat": false, "ts_rewrite": false,
		"domain_in": false, "binary_upgrade_set_next_pg_type_oid": false,
		"my_func": false, "": false, strings.Repeat("a", 64): false, "Now": false,
	} {
		if got := HarmlessBuiltin(name); got != want {
			t.Errorf("HarmlessBuiltin(%q) = %v, want %v", name, got, want)
		}
	}
	for _, name := range pgBuiltins {
		f, special := callFlags([]byte(name), []byte("pg_catalog"), true)
		if got, want := HarmlessBuiltin(name), f == 0 && !special; got != want {
			t.Errorf("HarmlessBuiltin(%q) = %v; callFlags gives %v, special %v", name, got, f, special)
		}
		// Classify agrees: a harmless built-in's call is plain.
		call := "SELECT pg_catalog." + name + "(1)"
		if strings.ToLower(name) != name {
			call = `SELECT pg_catalog."` + name + `"(1)`
		}
		if plain := Classify(call).Flags == 0; plain != HarmlessBuiltin(name) {
			t.Errorf("%s: Classify %v, HarmlessBuiltin %v", call, Classify(call).Flags, HarmlessBuiltin(name))
		}
	}
	if n := testing.AllocsPerRun(100, func() { HarmlessBuiltin("pg_catalog_like_name_of_forty_bytes_len") }); n != 0 {
		t.Errorf("HarmlessBuiltin allocates %.1f times per run", n)
	}
}

// TestSessionBuiltinsExist checks, without a server, that every name
// sessionBuiltins and otherBackendFuncs single out is a PostgreSQL 15
// built-in, so a misspelt one cannot leave the real function plain.
func TestSessionBuiltinsExist(t *testing.T) {
	for _, set := range []map[string]struct{}{sessionBuiltins, otherBackendFuncs} {
		for name := range set {
			if _, ok := builtinSet[name]; !ok {
				t.Errorf("%s is not in pgBuiltins", name)
			}
			if got := Classify("SELECT " + name + "(1)").Flags; got&(OpaqueCall|OtherBackend) == 0 {
				t.Errorf("SELECT %s(1): %v, want OpaqueCall or OtherBackend", name, got)
			}
		}
	}
}

// TestProcessFuncs checks that every function processFuncs lists is a
// PostgreSQL 15 built-in or one of dblink's, and that a call of one is
// ProcessState and OpaqueCall, qualified by any schema or not, quoted or
// not, so a misspelt name cannot leave its state to the next client.
func TestProcessFuncs(t *testing.T) {
	for name := range processFuncs {
		if _, ok := builtinSet[name]; !ok && !strings.HasPrefix(name, "dblink_") {
			t.Errorf("%s is neither in pgBuiltins nor dblink's", name)
		}
		for _, call := range []string{name, "pg_catalog." + name, "public." + name, `"` + name + `"`, strings.ToUpper(name)} {
			if got := Classify("SELECT " + call + "(1)").Flags; got&(OpaqueCall|ProcessState) != OpaqueCall|ProcessState {
				t.Errorf("SELECT %s(1): %v, want OpaqueCall|ProcessState", call, got)
			}
		}
	}
	if got := Classify("SELECT random(), setseed_like(1)").Flags; got&ProcessState != 0 {
		t.Errorf("SELECT random(), setseed_like(1): %v, want no ProcessState", got)
	}
}

// FuzzMentionsAny feeds arbitrary text to MentionsAny: it may not panic;
// it must report every name the text's identifier tokens stand for (the
// statements' leading words, read by Statements, and every identifier
// token, decoded with appendIdent) and every operator token; and it may
// report a name the text does not spell only when the text is unreadable
// (Incomplete) or holds a U& token.
func FuzzMentionsAny(f *testing.F) {
	for _, tc := range mentionsCases {
		f.Add(tc.sql)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		if MentionsAny(sql, nil, nil) {
			t.Fatalf("%q: true with nothing to look for", sql)
		}
		for st := range Statements(sql) {
			for _, w := range st.Words() {
				if !MentionsAny(sql, map[string]struct{}{w.Text: {}}, nil) {
					t.Fatalf("%q: leading word %q not reported", sql, w.Text)
				}
			}
		}
		l := lexer{src: sql}
		for range 64 {
			tok := l.next()
			if tok.kind == tEOF || tok.kind == tBad {
				break
			}
			switch tok.kind {
			case tIdent, tQIdent:
				if name, ok := appendIdent(nil, sql, tok); ok && !MentionsAny(sql, map[string]struct{}{string(name): {}}, nil) {
					t.Fatalf("%q: identifier %q (%q) not reported", sql, sql[tok.start:tok.end], name)
				}
			case tOp:
				if op := sql[tok.start:tok.end]; !MentionsAny(sql, nil, []string{op}) {
					t.Fatalf("%q: operator %q not reported", sql, op)
				}
			}
		}
		const absent = "zz_fuzz_absent"
		if MentionsAny(sql, map[string]struct{}{absent: {}}, []string{"~~~~~~~~"}) &&
			!strings.Contains(strings.ToLower(sql), absent) && !strings.Contains(sql, "~~~~~~~~") &&
			!strings.Contains(sql, "&") && Classify(sql).Flags&Incomplete == 0 {
			t.Fatalf("%q: reports a name and an operator it does not hold", sql)
		}
	})
}

func BenchmarkMentionsAny(b *testing.B) {
	idents := map[string]struct{}{"hid_v": {}, "audit_t": {}, "posint": {}}
	ops := []string{"###"}
	for _, bc := range []struct{ name, sql string }{
		{"select", hotQueries[1]},
		{"insert", hotQueries[2]},
		{"hit", "SELECT a, b FROM accounts JOIN hid_v USING (id) WHERE owner = $1"},
		{"backslash", `SELECT a FROM t WHERE path = 'C:\temp' AND owner = $1`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.sql)))
			for b.Loop() {
				MentionsAny(bc.sql, idents, ops)
			}
		})
	}
}

// TestProcessNeedles checks that the one-pass look MayHoldProcessState
// starts with finds every processFuncs name, in any case and spelt with
// Unicode escapes, and that it answers as Classify does.
func TestProcessNeedles(t *testing.T) {
	for name := range processFuncs {
		if !mayNameProcessFunc(name) || !mayNameProcessFunc(strings.ToUpper(name)) {
			t.Errorf("no needle finds %s", name)
		}
	}
	for sql, want := range map[string]bool{
		"SELECT setseed(0.5)":                         true,
		"select SETSEED(0.5)":                         true,
		`SELECT U&"\0073etseed"(0.5)`:                 true,
		"SELECT pg_catalog.pg_backup_start('x')":      true,
		"SELECT public.dblink_connect('c', 'db=x')":   true,
		"SELECT 'setseed(1)'":                         false, // a string
		"SELECT 1 -- setseed(1)":                      false, // a comment
		"SELECT random(), seed FROM t":                false,
		"SELECT * FROM pg_replication_slots":          false, // a view, not a call
		"SELECT pg_drop_replication_slot('s')":        false,
		"SELECT 1 FROM pg_logical_slot_get_changes()": true,
	} {
		if got := MayHoldProcessState(sql); got != want {
			t.Errorf("MayHoldProcessState(%q) = %v, want %v", sql, got, want)
		}
		if got := Classify(sql).Flags&ProcessState != 0; got != want {
			t.Errorf("Classify(%q) ProcessState = %v, want %v", sql, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { MayHoldProcessState("SELECT abalance FROM pgbench_accounts WHERE aid = 42") }); n != 0 {
		t.Errorf("MayHoldProcessState allocates %v times", n)
	}
}
