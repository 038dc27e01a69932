package pooler

import (
	"reflect"
	"strings"
	"testing"

	"github.com/pgquic/pgquic/internal/sqllex"
)

// TestInspectQueryMemo checks that the session's memo of its last plain
// simple-Query text never changes a classification: every text, sent
// twice and after another, gets exactly what inspectSQL says of it, and
// only a plain text short enough is kept.
func TestInspectQueryMemo(t *testing.T) {
	texts := []string{
		"SELECT 1",
		"SELECT abalance FROM pgbench_accounts WHERE aid = 42;",
		"SET search_path = evil",
		"SELECT 1 ",
		"BEGIN; SELECT 1",
		"SELECT set_config('application_name', 'x', false)",
		"select 1",
		"DO $$BEGIN PERFORM 1; END$$",
		"SELECT 1; SELECT 2",
		"SELECT '" + strings.Repeat("x", maxPlainQuery) + "'",
		"",
		// Integer constants with other digits take the memo; other runs
		// of digits do not.
		"SELECT abalance FROM pgbench_accounts WHERE aid = 7;",
		"SELECT abalance FROM pgbench_accounts WHERE aid = 123456;",
		"SELECT 2",
		"SELECT x1",
		"SELECT x2",
		"SELECT '1'",
		"SELECT '2'",
		"SELECT 1.5",
		"SELECT 2.5",
		"SET statement_timeout = 5",
		"SET statement_timeout = 6",
		"SELECT pg_advisory_lock(1)",
		"SELECT pg_advisory_lock(2)",
		"SELECT 1 FROM t1",
		"SELECT 1 FROM t2",
		"SELECT '\\' , 1",
		"SELECT '\\' , 2",
	}
	var s session
	for _, first := range texts {
		for _, second := range texts {
			for _, q := range []string{first, first, second, second, first} {
				got, want := s.inspectQuery([]byte(q)), inspectSQL([]byte(q))
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%q after %q: inspectQuery %+v, inspectSQL %+v", q, first, got, want)
				}
				m := &s.plainQuery
				kept := string(m.text) == q || (len(q) > 0 && sqllex.SameButIntegers(string(m.text), q, m.ints))
				if plain := want.pipe && len(q) <= maxPlainQuery; kept != plain && q != "" {
					t.Fatalf("%q: kept %v, want %v", q, kept, plain)
				}
			}
		}
	}
}

// TestInspectQueryMemoIntegers checks that pgbench's simple-protocol
// SELECT, whose constant changes with every query, is lexed once: the
// memo keeps the first text and answers the others.
func TestInspectQueryMemoIntegers(t *testing.T) {
	var s session
	first := "SELECT abalance FROM pgbench_accounts WHERE aid = 42;"
	want := inspectSQL([]byte(first))
	s.inspectQuery([]byte(first))
	for _, aid := range []string{"7", "100000", "0", "42", "99"} {
		q := "SELECT abalance FROM pgbench_accounts WHERE aid = " + aid + ";"
		if got := s.inspectQuery([]byte(q)); !reflect.DeepEqual(got, want) || !reflect.DeepEqual(got, inspectSQL([]byte(q))) {
			t.Fatalf("%q: %+v, want %+v", q, got, want)
		}
		if string(s.plainQuery.text) != first {
			t.Fatalf("%q was lexed: the memo holds %q", q, s.plainQuery.text)
		}
	}
	q := []byte("SELECT abalance FROM pgbench_accounts WHERE aid = 5;")
	if n := testing.AllocsPerRun(100, func() { s.inspectQuery(q) }); n != 0 {
		t.Errorf("%.1f allocations per memo hit", n)
	}
}
