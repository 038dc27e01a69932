package params

import (
	"strings"
	"testing"
	"unsafe"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestQuoteValue checks the literals set_config gets: ASCII values as plain
// literals, anything with a backslash or a byte outside ASCII as an escape
// string whose bytes no client_encoding conversion can touch.
func TestQuoteValue(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "''"},
		{"UTF8", "'UTF8'"},
		{"it's", "'it''s'"},
		{`a\b`, `E'a\\b'`},
		{"caf\u00e9", `E'caf\xc3\xa9'`},
		{"\xff'\\", `E'\xff''\\'`},
	} {
		if got := QuoteValue(tc.in); got != tc.want {
			t.Errorf("QuoteValue(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestCanonical checks that a startup name in any case maps to the
// server's spelling of a reported parameter and leaves others alone.
func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"datestyle":   "DateStyle",
		"TIMEZONE":    "TimeZone",
		"search_path": "search_path",
		"Work_Mem":    "Work_Mem",
	} {
		if got := Canonical(in); got != want {
			t.Errorf("Canonical(%q) = %q, want %q", in, got, want)
		}
	}
	n := 0
	for name := range All() {
		if !Reported(name) {
			t.Errorf("All lists %q, which Reported denies", name)
		}
		n++
	}
	if n != 6 || Reported("search_path") {
		t.Errorf("%d reported parameters, search_path reported %v", n, Reported("search_path"))
	}
	if Carried("role") || !Carried("search_path") {
		t.Errorf("Carried: role %v, search_path %v", Carried("role"), Carried("search_path"))
	}
}

// TestKey checks that the key depends on the values and not on the map's
// order, that equal settings share one interned string, and that the
// reapply text sets only the unreported values, in name order.
func TestKey(t *testing.T) {
	v := map[string]string{"search_path": "a, b", "TimeZone": "UTC", "work_mem": "caf\u00e9"}
	k1, q := Key(v, []byte("stale"))
	k2, _ := Key(map[string]string{"work_mem": "caf\u00e9", "TimeZone": "UTC", "search_path": "a, b"}, nil)
	if k1 != k2 || !strings.Contains(k1, "TimeZone\x00UTC\x00") {
		t.Errorf("keys %q and %q", k1, k2)
	}
	if unsafe.StringData(k1) != unsafe.StringData(k2) {
		t.Errorf("equal settings got two copies of their key")
	}
	want := `SELECT pg_catalog.set_config('search_path', 'a, b', false), pg_catalog.set_config('work_mem', E'caf\xc3\xa9', false)`
	if string(q) != want {
		t.Errorf("reapply\n%s\nwant\n%s", q, want)
	}
	if _, q := Key(map[string]string{"TimeZone": "UTC"}, q); len(q) != 0 {
		t.Errorf("reapply %q for reported values only", q)
	}
}

// TestValueChecked: the parameters whose values no server process refuses
// that another accepted, and a few it must not claim (their acceptance
// depends on the process or the catalogs), in any spelling.
func TestValueChecked(t *testing.T) {
	for _, k := range []string{"search_path", "Search_Path", "work_mem", "enable_seqscan", "statement_timeout", "TimeZone", "application_name"} {
		if !ValueChecked(k) {
			t.Errorf("ValueChecked(%q) = false", k)
		}
	}
	for _, k := range []string{"temp_buffers", "default_text_search_config", "default_tablespace", "temp_tablespaces", "plpgsql.extra_warnings", "myapp.tenant", "role", "no_such_variable"} {
		if ValueChecked(k) {
			t.Errorf("ValueChecked(%q) = true", k)
		}
	}
}
