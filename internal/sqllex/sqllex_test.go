package sqllex

import "testing"

func TestFingerprint(t *testing.T) {
	same := [][2]string{
		{"SELECT abalance FROM pgbench_accounts WHERE aid = 1", "select abalance from pgbench_accounts where aid = 98765"},
		{"SELECT 'a', $$x$$, 1.5", "SELECT 'bb', $$yy$$, 2"},
		{"SELECT 1 -- comment", "/* c */ SELECT 2"},
	}
	for _, p := range same {
		if Fingerprint(p[0]) != Fingerprint(p[1]) {
			t.Errorf("Fingerprint(%q) != Fingerprint(%q)", p[0], p[1])
		}
	}
	differ := [][2]string{
		{"SELECT a FROM t", "SELECT b FROM t"},
		{`SELECT "A" FROM t`, `SELECT a FROM t`},
		{"SELECT 1", "SELECT 1; BEGIN"},
		{"SELECT pg_sleep(1)", "SELECT abs(1)"},
	}
	for _, p := range differ {
		if Fingerprint(p[0]) == Fingerprint(p[1]) {
			t.Errorf("Fingerprint(%q) == Fingerprint(%q)", p[0], p[1])
		}
	}
	if n := testing.AllocsPerRun(100, func() { Fingerprint("SELECT abalance FROM pgbench_accounts WHERE aid = 42") }); n != 0 {
		t.Errorf("Fingerprint allocates %v times", n)
	}
}
