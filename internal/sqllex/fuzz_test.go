package sqllex

import "testing"

// FuzzClassify feeds arbitrary text to Statements and Classify: neither may
// panic, statements must lie in order within the text, and Classify must
// report the union of the statements' flags and their number (or, for
// ambiguous text, at least that).
func FuzzClassify(f *testing.F) {
	for _, tc := range classifyCases {
		f.Add(tc.sql)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		checkAgreement(t, sql)
		for st := range Statements(sql) {
			if len(st.Words()) > MaxWords {
				t.Fatalf("%q: %d words", sql, len(st.Words()))
			}
			for _, w := range st.Words() {
				if len(w.Text) > nameMax {
					t.Fatalf("%q: word %q longer than %d bytes", sql, w.Text, nameMax)
				}
			}
		}
	})
}
