package localstart

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/pgquic/pgquic/internal/pgproto"
)

// startupPacket builds a StartupMessage with protocol code and pairs.
func startupPacket(code uint32, pairs ...string) []byte {
	b := binary.BigEndian.AppendUint32(nil, 0)
	b = binary.BigEndian.AppendUint32(b, code)
	for _, p := range pairs {
		b = append(b, p...)
		b = append(b, 0)
	}
	b = append(b, 0)
	binary.BigEndian.PutUint32(b, uint32(len(b)))
	return b
}

// TestParseStartup: what may be answered locally, and what keys the cache.
func TestParseStartup(t *testing.T) {
	v30 := uint32(pgproto.ProtocolMajor << 16)
	st, err := ParseStartup(startupPacket(v30, "user", "app", "application_name", "psql"))
	if err != nil || st.User != "app" || st.Database != "app" || !st.Local {
		t.Fatalf("ParseStartup = %+v, %v", st, err)
	}
	same, _ := ParseStartup(startupPacket(v30, "application_name", "psql", "user", "app"))
	other, _ := ParseStartup(startupPacket(v30, "user", "app", "application_name", "other"))
	if st.key != same.key || st.key == other.key {
		t.Error("the cache key depends on the order of the parameters or ignores their values")
	}
	for _, tc := range []struct {
		pkt   []byte
		local bool
	}{
		{startupPacket(v30|2, "user", "app"), false},
		{startupPacket(v30, "user", "app", "_pq_.x", "1"), false},
		{startupPacket(v30, "user", "app", "replication", "database"), false},
	} {
		st, err := ParseStartup(tc.pkt)
		if err != nil || st.Local != tc.local {
			t.Errorf("ParseStartup(%q) = %+v, %v", tc.pkt, st, err)
		}
	}
	for _, pkt := range [][]byte{
		startupPacket(v30, "database", "db"),     // no user
		startupPacket(2<<16, "user", "app"),      // protocol 2
		startupPacket(v30, "user", "app", "odd"), // a name without a value
		startupPacket(v30)[:7],
		append(startupPacket(v30, "user", "app"), 'x'),
	} {
		if _, err := ParseStartup(pkt); err == nil {
			t.Errorf("ParseStartup(%q) accepted", pkt)
		}
	}
}

// TestDiff: only changed or new parameters are sent.
func TestDiff(t *testing.T) {
	got := diff([]param{{"TimeZone", "UTC"}, {"DateStyle", "ISO, MDY"}},
		[]param{{"TimeZone", "Asia/Tokyo"}, {"DateStyle", "ISO, MDY"}, {"new", "1"}})
	if len(got) != 2 || got[0] != (param{"TimeZone", "Asia/Tokyo"}) || got[1] != (param{"new", "1"}) {
		t.Errorf("diff = %v", got)
	}
}

// TestErrorResponse: the encoding a libpq client reads.
func TestErrorResponse(t *testing.T) {
	b := ErrorResponse("FATAL", "28P01", "no")
	if b[0] != 'E' || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-1 || !strings.Contains(errorText(b[5:]), "28P01 no") {
		t.Errorf("ErrorResponse = %q", b)
	}
}

// FuzzParseStartup checks that no packet makes the parser panic and that
// what it accepts names a user.
func FuzzParseStartup(f *testing.F) {
	f.Add(startupPacket(pgproto.ProtocolMajor<<16, "user", "app", "database", "db"))
	f.Add(startupPacket(pgproto.ProtocolMajor<<16|2, "user", "u", "_pq_.a", "b"))
	f.Add([]byte{0, 0, 0, 8, 0, 3, 0, 0})
	f.Fuzz(func(t *testing.T, pkt []byte) {
		st, err := ParseStartup(pkt)
		if err == nil && (st.User == "" || st.Database == "") {
			t.Fatalf("accepted %q without a user or database", pkt)
		}
	})
}
