package pooler

import (
	"reflect"
	"strings"
	"testing"
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
	}
	var s session
	for _, first := range texts {
		for _, second := range texts {
			for _, q := range []string{first, first, second, second, first} {
				got, want := s.inspectQuery([]byte(q)), inspectSQL([]byte(q))
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%q after %q: inspectQuery %+v, inspectSQL %+v", q, first, got, want)
				}
				kept := string(s.plainQuery.text) == q
				if plain := want.pipe && len(q) <= maxPlainQuery; kept != plain && q != "" {
					t.Fatalf("%q: kept %v, want %v", q, kept, plain)
				}
			}
		}
	}
}
