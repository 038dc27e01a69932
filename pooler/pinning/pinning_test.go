package pinning

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/sqllex"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// read classifies sql as the pooler does, with the lexer's union of flags.
func read(sql string) Info {
	var sum sqllex.Flags
	for st := range sqllex.Statements(sql) {
		sum |= st.Flags
	}
	return Read(sql, sum)
}

// TestRead checks what a text may do to session state: which kinds it
// may hold or release, whether it may do what the text does not show,
// and whether a holding statement comes outside a block the text opened.
func TestRead(t *testing.T) {
	for _, tc := range []struct {
		sql             string
		holds, releases sqllex.Held
		opaque, outside bool
	}{
		{sql: "SELECT 1"},
		{sql: "CREATE TEMP TABLE t (a int)", holds: sqllex.HeldTemp, opaque: true, outside: true},
		{sql: "BEGIN; CREATE TEMP TABLE t (a int); COMMIT", holds: sqllex.HeldTemp, opaque: true},
		{sql: "BEGIN; COMMIT; LISTEN c", holds: sqllex.HeldListen, outside: true},
		{sql: "UNLISTEN *", releases: sqllex.HeldListen},
		{sql: "DO $$BEGIN END$$", opaque: true},
	} {
		in := read(tc.sql)
		if in.Holds != tc.holds || in.Releases&tc.releases != tc.releases || in.Opaque != tc.opaque || in.Outside != tc.outside {
			t.Errorf("%q: %+v, want holds %v releases %v opaque %v outside %v", tc.sql, in, tc.holds, tc.releases, tc.opaque, tc.outside)
		}
		if (in.Holds != 0) != (in.Kind != "") {
			t.Errorf("%q: kind %q with holds %v", tc.sql, in.Kind, in.Holds)
		}
	}
}

// TestBlock follows the transaction block through BEGIN, COMMIT AND
// CHAIN, ROLLBACK and a plain statement.
func TestBlock(t *testing.T) {
	open := false
	for _, tc := range []struct {
		sql        string
		open, ends bool
	}{
		{"SELECT 1", false, false},
		{"BEGIN", true, false},
		{"SELECT 1", true, false},
		{"COMMIT AND CHAIN", true, true},
		{"ROLLBACK", false, true},
		{"COMMIT", false, true},
	} {
		var f sqllex.Flags
		for st := range sqllex.Statements(tc.sql) {
			f |= st.Flags
		}
		var ends bool
		if open, ends = Block(open, f); open != tc.open || ends != tc.ends {
			t.Errorf("after %q: open %v ends %v, want %v %v", tc.sql, open, ends, tc.open, tc.ends)
		}
	}
}

// row builds a DataRow body of text columns; nil is NULL.
func row(cols ...[]byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(cols)))
	for _, c := range cols {
		if c == nil {
			b = binary.BigEndian.AppendUint32(b, 0xffffffff)
			continue
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(c)))
		b = append(b, c...)
	}
	return b
}

// TestReadProbeRow checks the probe's answer: false columns hold nothing,
// true or unexpected ones ("", "x") count as held, the last column is
// the identity, and a cut-off row or a NULL changes nothing.
func TestReadProbeRow(t *testing.T) {
	f, tr := []byte("f"), []byte("t")
	p, ok := ReadProbeRow(row(f, f, f, f, f, f))
	if !ok || p != (Probe{Complete: true}) {
		t.Errorf("all false: %+v %v", p, ok)
	}
	p, ok = ReadProbeRow(row(tr, f, []byte{}, f, []byte("x"), tr))
	want := Probe{Found: sqllex.Held(1 | 1<<2 | 1<<4), Role: true, Complete: true}
	if !ok || p != want {
		t.Errorf("mixed: %+v %v, want %+v", p, ok, want)
	}
	if p, ok = ReadProbeRow(row(f, f)); !ok || p.Complete {
		t.Errorf("short row: %+v %v, want ok and not complete", p, ok)
	}
	full := row(f, f, f, f, f, f)
	if _, ok = ReadProbeRow(full[:len(full)-1]); ok {
		t.Errorf("cut-off row read as ok")
	}
	if _, ok = ReadProbeRow(row(f, nil, f, f, f, f)); ok {
		t.Errorf("row with a NULL read as ok")
	}
	if _, ok = ReadProbeRow([]byte{0}); ok {
		t.Errorf("one-byte row read as ok")
	}
}

// TestProbeQuery checks that the login role is quoted into the identity
// column and left out when unknown.
func TestProbeQuery(t *testing.T) {
	q := ProbeQuery("o'neil")
	if !strings.HasPrefix(q, probeSQL+", NOT (") || !strings.HasSuffix(q, "'o''neil'::pg_catalog.name)") {
		t.Errorf("probe for o'neil: %s", q[len(probeSQL):])
	}
	if q := ProbeQuery(""); strings.Contains(q[len(probeSQL):], "AND session_user") {
		t.Errorf("probe without a login names one: %s", q[len(probeSQL):])
	}
	if got := Names(Opaque | Role); !slices.Equal(got, []string{"opaque", "role"}) {
		t.Errorf("Names(Opaque|Role) = %v", got)
	}
}
