package sqllex

import "testing"

// hotQueries are statements a pooler classifies on every simple Query or
// Parse; none of them may allocate.
var hotQueries = []string{
	"SELECT * FROM t WHERE id = $1",
	"select a, b from accounts where owner = $1 and created_at > now() - interval '1 day'",
	"INSERT INTO t (a, b) VALUES ($1, $2) RETURNING id",
	"BEGIN",
	"SET ROLE bob",
	"SET LOCAL statement_timeout = '5s'",
	"DEALLOCATE pgx_1",
	"SELECT set_config('role', 'bob', false)",
	`SELECT "Quoted" FROM "Table" -- comment` + "\n",
	"SELECT 1; SELECT 2; COMMIT",
	"SELECT now(), lower(name), coalesce(a, 1), app.f($1), \"MyFunc\"(2) FROM t JOIN u ON my_match(t.a, u.b)",
	"SELECT pg_catalog.set_config('search_path'::text, 'x', true::boolean AND false)",
	"UPDATE pg_catalog.pg_settings SET setting = 'x' WHERE name = 'search_path'",
	"SELECT 1 INTO pg_temp.t",
}

func TestClassifyAllocs(t *testing.T) {
	for _, q := range hotQueries {
		if n := testing.AllocsPerRun(100, func() { Classify(q) }); n != 0 {
			t.Errorf("Classify(%q) allocates %.1f times per run, want 0", q, n)
		}
	}
}

func BenchmarkClassify(b *testing.B) {
	for _, bc := range []struct{ name, sql string }{
		{"select", hotQueries[0]},
		{"set_role", hotQueries[4]},
		{"set_config", hotQueries[7]},
		{"multi", hotQueries[9]},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.sql)))
			for b.Loop() {
				Classify(bc.sql)
			}
		})
	}
}

func BenchmarkStatements(b *testing.B) {
	sql := hotQueries[9]
	b.ReportAllocs()
	for b.Loop() {
		for range Statements(sql) {
		}
	}
}

// BenchmarkMayHoldProcessState is the look a session-mode pooler gives
// every Query and Parse text: one pass that finds no candidate name in
// pgbench's SELECT, and one that finds setseed and classifies the text.
func BenchmarkMayHoldProcessState(b *testing.B) {
	for _, sql := range []string{"SELECT abalance FROM pgbench_accounts WHERE aid = 42", "SELECT setseed(0.5)"} {
		b.Run(sql[:min(len(sql), 20)], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				MayHoldProcessState(sql)
			}
		})
	}
}
