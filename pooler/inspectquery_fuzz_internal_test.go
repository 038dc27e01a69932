package pooler

import (
	"reflect"
	"strings"
	"testing"
)

// FuzzInspectQuery checks the session's memo of its last plain text end
// to end: after a, b (and a again) get from inspectQuery exactly what
// inspectSQL says of them, whatever a and b are. The seeds pair a plain
// text with texts that differ from it in digits alone and would change
// session state if the memo answered for them.
func FuzzInspectQuery(f *testing.F) {
	for _, p := range [][2]string{
		{"SELECT 1", "SELECT 2"},
		{"SELECT 1; SELECT 2", "SELECT 1; SELECT 3"},
		{"SELECT 1 -- 2\n", "SELECT 1 -- 2\nSET role x"},
		{"SELECT 1 /* 2 */", "SELECT 1 /* 3 */"},
		{"SELECT $a1$x$a1$, 1", "SELECT $a1$x$a2$, 1"},
		{"SELECT 1 $$ 2 $$", "SELECT 1 $$ 2 $$"},
		{"SELECT 1, '2'; SELECT 3", "SELECT 1, '2'; SELECT 33"},
		{"SELECT 1e5, 2", "SELECT 1e5, 3"},
		{"SELECT 0x1F, 2", "SELECT 0x1F, 3"},
		{"SELECT 1_000, 2", "SELECT 1_000, 3"},
		{"SELECT 12abc, 3", "SELECT 12abc, 4"},
		{"SELECT pg_temp_1.f(), 2", "SELECT pg_temp_2.f(), 2"},
		{"SELECT E'1', 2", "SELECT E'1', 3"},
		{"SELECT U&'1' UESCAPE '2', 3", "SELECT U&'1' UESCAPE '2', 4"},
		{"SELECT '\\' 1; SET role x --'", "SELECT '\\' 2; SET role x --'"},
	} {
		f.Add(p[0], p[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		var s session
		for _, q := range []string{a, b, b, a, b, otherDigits(a, len(b)), a} {
			if got, want := s.inspectQuery([]byte(q)), inspectSQL([]byte(q)); !reflect.DeepEqual(got, want) {
				t.Fatalf("%q after %q: inspectQuery %+v, inspectSQL %+v", q, a, got, want)
			}
		}
	})
}

// otherDigits returns a with every digit shifted by k and, for odd k,
// every run of digits doubled: a text the memo may answer for.
func otherDigits(a string, k int) string {
	var b strings.Builder
	for i := 0; i < len(a); i++ {
		c := a[i]
		if c < '0' || c > '9' {
			b.WriteByte(c)
			continue
		}
		d := byte('0' + (int(c-'0')+k)%10)
		b.WriteByte(d)
		if k%2 == 1 {
			b.WriteByte(d)
		}
	}
	return b.String()
}
