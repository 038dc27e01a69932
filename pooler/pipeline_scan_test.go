package pooler

import (
	"encoding/binary"
	"github.com/pgquic/pgquic/pooler/hiddencode"
	"testing"

	"github.com/pgquic/pgquic/internal/wire"
)

// Unit tests of the request scan that decides what may share a server
// connection (pipeline.go): which requests qualify, and that no input,
// however malformed, makes it read out of bounds.

func msg(typ byte, parts ...string) []byte {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	b := wire.AppendHeader(nil, typ, n)
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func cat(ms ...[]byte) []byte {
	var b []byte
	for _, m := range ms {
		b = append(b, m...)
	}
	return b
}

var (
	sync5   = msg('S')
	exec0   = msg('E', "\x00", "\x00\x00\x00\x00")
	bindU   = msg('B', "\x00", "\x00", "\x00\x00", "\x00\x00", "\x00\x00")
	descP   = msg('D', "P\x00")
	flushH  = msg('H')
	closeSt = msg('C', "Sfoo\x00")
)

func parse(name, sql string) []byte { return msg('P', name+"\x00", sql+"\x00", "\x00\x00") }
func query(sql string) []byte       { return msg('Q', sql+"\x00") }

// split turns a request into the first message's type and body and the
// bytes after it, as the session sees them.
func split(b []byte) (byte, []byte, []byte) {
	n := int(binary.BigEndian.Uint32(b[1:]))
	return b[0], b[5 : 1+n], b[1+n:]
}

func TestScanBatch(t *testing.T) {
	plain := &stmt{info: sqlInfo{pipe: true, fp: 7}}
	begins := &stmt{info: sqlInfo{}}
	stmts := map[string]*stmt{"plain": plain, "begins": begins}
	bindNamed := func(name string) []byte {
		return msg('B', "\x00", name+"\x00", "\x00\x00", "\x00\x00", "\x00\x00")
	}
	cases := []struct {
		name string
		req  []byte
		ok   bool
	}{
		{"simple select", query("SELECT 1"), true},
		{"multi-statement select", query("SELECT 1; SELECT 2"), true},
		{"begin", query("BEGIN"), false},
		{"comment then begin", query("/* x */ begin"), false},
		{"begin inside multi-statement", query("SELECT 1; begin; SELECT 2"), false},
		{"start transaction", query("start transaction"), false},
		{"set", query("SET work_mem = '1MB'"), false},
		{"set_config", query("SELECT set_config('a.b', 'c', false)"), false},
		{"copy", query("COPY t FROM STDIN"), false},
		{"listen", query("LISTEN x"), false},
		{"ddl", query("CREATE TABLE t (a int)"), false},
		{"do", query("DO $$BEGIN END$$"), false},
		{"unterminated", query("SELECT 'abc"), false},
		{"query then more", cat(query("SELECT 1"), query("SELECT 2")), false},
		{"extended unnamed", cat(parse("", "SELECT $1"), bindU, descP, exec0, sync5), true},
		{"extended begin", cat(parse("", "BEGIN"), bindU, exec0, sync5), false},
		{"extended no sync", cat(parse("", "SELECT 1"), bindU, exec0), false},
		{"extended with flush", cat(parse("", "SELECT 1"), bindU, flushH, exec0, sync5), false},
		{"extended close", cat(parse("", "SELECT 1"), closeSt, sync5), false},
		{"two syncs", cat(parse("", "SELECT 1"), bindU, exec0, sync5, bindU, exec0, sync5), false},
		{"named plain", cat(bindNamed("plain"), exec0, sync5), true},
		{"named begin", cat(bindNamed("begins"), exec0, sync5), false},
		{"named unknown", cat(bindNamed("nope"), exec0, sync5), false},
		{"unnamed bound without parse", cat(bindU, exec0, sync5), false},
		{"parse of a name held", cat(parse("plain", "SELECT 1"), sync5), false},
		{"parse new name then bind it", cat(parse("n1", "SELECT 1"), bindNamed("n1"), exec0, sync5), true},
		{"parse new name with begin", cat(parse("n1", "BEGIN"), bindNamed("n1"), exec0, sync5), false},
		{"cut short", cat(parse("", "SELECT 1"), bindU, exec0, sync5)[:20], false},
	}
	for _, c := range cases {
		typ, body, rest := split(c.req)
		if len(body) > len(c.req) {
			t.Fatal(c.name)
		}
		_, ok := scanBatch(typ, body, rest, stmts, nil, nil, hiddencode.None)
		if ok != c.ok {
			t.Errorf("%s: qualifies = %v, want %v", c.name, ok, c.ok)
		}
	}
	// Texts differing only in constants share a fingerprint.
	fp := func(sql string) uint64 {
		typ, body, rest := split(query(sql))
		f, _ := scanBatch(typ, body, rest, nil, nil, nil, hiddencode.None)
		return f
	}
	f1, f2, f3 := fp("SELECT abalance FROM a WHERE aid = 1"), fp("SELECT abalance FROM a WHERE aid = 2"), fp("SELECT pg_sleep(1)")
	if f1 != f2 || f1 == f3 {
		t.Errorf("fingerprints %x %x %x", f1, f2, f3)
	}
}

// TestScanBatchUnnamedFingerprints checks that requests through the unnamed
// statement are told apart by their text, as simple Queries are: the
// latency policy must not take a slow unnamed query for a fast one.
func TestScanBatchUnnamedFingerprints(t *testing.T) {
	fp := func(req []byte, unnamed *stmt) uint64 {
		t.Helper()
		typ, body, rest := split(req)
		f, ok := scanBatch(typ, body, rest, nil, unnamed, nil, hiddencode.None)
		if !ok {
			t.Fatalf("%q does not qualify", req)
		}
		return f
	}
	ext := func(sql string) []byte { return cat(parse("", sql), bindU, descP, exec0, sync5) }
	fast1, fast2 := fp(ext("SELECT abalance FROM a WHERE aid = 1"), nil), fp(ext("SELECT abalance FROM a WHERE aid = 2"), nil)
	slow := fp(ext("SELECT pg_sleep(1)"), nil)
	if fast1 != fast2 || fast1 == slow {
		t.Errorf("unnamed Parse fingerprints %x %x %x: want the first two equal, the third different", fast1, fast2, slow)
	}
	// Bound again without a Parse: the session's unnamed statement's own.
	sleeper := newStmt("", parse("", "SELECT pg_sleep(1)")[6:], nil)
	again := fp(cat(bindU, exec0, sync5), sleeper)
	if again != fp(cat(bindU, exec0, sync5), newStmt("", parse("", "SELECT pg_sleep(2)")[6:], nil)) {
		t.Errorf("rebinding statements of one kind gives different fingerprints")
	}
	if again == fp(cat(bindU, exec0, sync5), newStmt("", parse("", "SELECT 1 FROM a")[6:], nil)) {
		t.Errorf("rebinding statements of different kinds gives one fingerprint")
	}
	// Parsed again word for word: the statement's classification is reused.
	if got := fp(ext("SELECT pg_sleep(1)"), sleeper); got != slow {
		t.Errorf("a repeated unnamed Parse fingerprints %x, a fresh one %x", got, slow)
	}
}

// TestScanBatchLexesOnce checks the hand-over of the first message's
// classification between the scan and the message's handler: a known one
// is used as it is, and one the scan had to find is reported back.
func TestScanBatchLexesOnce(t *testing.T) {
	typ, body, rest := split(query("SELECT 1"))
	q, _, _ := wire.CString(body)
	// What the handler found is believed, even against the text, so the
	// scan provably did not lex again.
	known := lexedText{text: q, plain: false}
	if _, ok := scanBatch(typ, body, rest, nil, nil, &known, hiddencode.None); ok {
		t.Error("the scan lexed a text whose classification it was given")
	}
	// The same classification for a copy of the text is not believed.
	other := append([]byte(nil), q...)
	known = lexedText{text: other, plain: false}
	if _, ok := scanBatch(typ, body, rest, nil, nil, &known, hiddencode.None); !ok {
		t.Error("the scan used a classification of other bytes")
	}
	// Found by the scan: reported for the handler.
	typ, body, rest = split(cat(parse("", "SELECT 2"), bindU, exec0, sync5))
	var found lexedText
	f, ok := scanBatch(typ, body, rest, nil, nil, &found, hiddencode.None)
	if !ok || !found.plain || found.fp == 0 {
		t.Fatalf("scan reported %+v (ok %v)", found, ok)
	}
	st := newStmt("", body[1:], &found)
	if !st.info.pipe || st.info.fp != found.fp || f == 0 {
		t.Errorf("statement built from the scan's classification: %+v", st.info)
	}
	if fresh := newStmt("", body[1:], nil); fresh.info.fp != st.info.fp || fresh.info.pipe != st.info.pipe {
		t.Errorf("lexing again gives %+v, the scan %+v", fresh.info, st.info)
	}
}

// FuzzScanBatch feeds arbitrary bytes after a first message: the scan must
// never panic, and whatever it accepts must end in Sync or be one Query.
func FuzzScanBatch(f *testing.F) {
	f.Add(byte('Q'), []byte("SELECT 1\x00"), []byte{})
	f.Add(byte('P'), parse("", "SELECT 1")[5:], cat(bindU, exec0, sync5))
	f.Add(byte('B'), bindU[5:], cat(exec0, sync5))
	f.Add(byte('P'), parse("s", "SELECT $1")[5:], cat(msg('B', "\x00s\x00"), exec0, sync5))
	f.Add(byte('D'), []byte("S\x00"), []byte{'S', 0, 0, 0, 4})
	f.Add(byte('E'), []byte{0, 0, 0, 0, 0}, []byte{'S', 0, 0, 0, 3})
	f.Add(byte('B'), []byte{0}, []byte{'S', 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, typ byte, body, rest []byte) {
		stmts := map[string]*stmt{"s": {info: sqlInfo{pipe: true}}}
		var first lexedText
		if _, ok := scanBatch(typ, body, rest, stmts, nil, &first, hiddencode.None); ok {
			if typ != 'Q' && !endsInSync(rest) && typ != 'S' {
				t.Fatalf("accepted a request that does not end in Sync: %q %q %q", typ, body, rest)
			}
		}
	})
}

func endsInSync(b []byte) bool {
	return len(b) >= 5 && string(b[len(b)-5:]) == "S\x00\x00\x00\x04"
}
