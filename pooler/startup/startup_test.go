package startup

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/pgproto"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// packet encodes name/value pairs as a StartupMessage's body after its
// version word: NUL-terminated strings and a final NUL.
func packet(pairs ...string) []byte {
	var b []byte
	for _, s := range pairs {
		b = append(b, s...)
		b = append(b, 0)
	}
	return append(b, 0)
}

// TestParse checks what a StartupMessage is decoded to, and the refusals
// of the packets PostgreSQL refuses or the pooler cannot serve, with the
// SQLSTATE and text PostgreSQL sends (TestFramesBadStartup compares the
// frames with a server's).
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []byte
		want    *Params
		code    string // with message: the refusal, else want
		message string
	}{
		{
			name: "user and database",
			in:   packet("user", "alice", "database", "shop", "application_name", "psql", "DateStyle", "iso"),
			want: &Params{User: "alice", Database: "shop", Settings: map[string]string{"application_name": "psql", "DateStyle": "iso"}},
		},
		{
			name: "database defaults to the user",
			in:   packet("user", "alice"),
			want: &Params{User: "alice", Database: "alice", Settings: map[string]string{}},
		},
		{
			name: "replication off is accepted",
			in:   packet("user", "alice", "replication", "false"),
			want: &Params{User: "alice", Database: "alice", Settings: map[string]string{}},
		},
		{
			name: "protocol options are collected, not applied",
			in:   packet("user", "alice", "_pq_.a", "1", "_pq_.b", "2"),
			want: &Params{User: "alice", Database: "alice", Settings: map[string]string{}, Unknown: []string{"_pq_.a", "_pq_.b"}},
		},
		{
			name: "options set parameters",
			in:   packet("user", "alice", "options", "-c search_path=app --work-mem=4MB"),
			want: &Params{User: "alice", Database: "alice", Settings: map[string]string{"search_path": "app", "work_mem": "4MB"}},
		},
		{
			name: "the packet's own parameter wins over options, in either order",
			in:   packet("user", "alice", "SEARCH_PATH", "pkt", "options", "-c search_path=opt -c work_mem=1MB", "Work_Mem", "2MB"),
			want: &Params{User: "alice", Database: "alice", Settings: map[string]string{"SEARCH_PATH": "pkt", "Work_Mem": "2MB"}},
		},
		{
			name: "an empty packet has no user",
			in:   packet(),
			code: pgproto.CodeInvalidAuthSpec, message: "no PostgreSQL user name specified in startup packet",
		},
		{
			name: "an empty user is no user",
			in:   packet("user", "", "database", "shop"),
			code: pgproto.CodeInvalidAuthSpec, message: "no PostgreSQL user name specified in startup packet",
		},
		{
			name: "no terminator",
			in:   []byte("user\x00alice\x00"),
			code: pgproto.CodeProtocolViolation, message: "invalid startup packet layout: expected terminator as last byte",
		},
		{
			name: "bytes after the terminator",
			in:   []byte("user\x00alice\x00\x00x"),
			code: pgproto.CodeProtocolViolation, message: "invalid startup packet layout: expected terminator as last byte",
		},
		{
			name: "a name without a value",
			in:   []byte("user\x00alice\x00database\x00"),
			code: pgproto.CodeProtocolViolation, message: "invalid startup packet layout: missing value",
		},
		{
			name: "replication",
			in:   packet("user", "alice", "replication", "database"),
			code: pgproto.CodeFeatureNotSupported, message: "replication connections are not supported by the pooler",
		},
		{
			name: "an unsupported option",
			in:   packet("user", "alice", "options", "-x"),
			code: pgproto.CodeFeatureNotSupported, message: `unsupported startup option "-x": only -c name=value is supported`,
		},
		{
			name: "an option without a value",
			in:   packet("user", "alice", "options", "-c work_mem"),
			code: pgproto.CodeProtocolViolation, message: `invalid startup option "work_mem"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if tc.code != "" {
				if err == nil {
					t.Fatalf("Parse = %+v, want refusal %s %q", got, tc.code, tc.message)
				}
				if err.Code != tc.code || err.Message != tc.message {
					t.Fatalf("Parse refused with %s %q, want %s %q", err.Code, err.Message, tc.code, tc.message)
				}
				if got != nil {
					t.Fatalf("Parse returned %+v with its refusal", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got.User != tc.want.User || got.Database != tc.want.Database || got.Minor != 0 ||
				!maps.Equal(got.Settings, tc.want.Settings) || !slices.Equal(got.Unknown, tc.want.Unknown) {
				t.Fatalf("Parse = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestParseOptions checks the options parameter as libpq fills it from
// PGOPTIONS: -c with its value in the same word or the next, --name=value,
// dashes in names read as underscores, and backslash keeping a space (or a
// backslash) in a value.
func TestParseOptions(t *testing.T) {
	for _, tc := range []struct {
		opts    string
		want    map[string]string
		code    string
		message string
	}{
		{opts: "", want: map[string]string{}},
		{opts: "  \t ", want: map[string]string{}},
		{opts: "-c a=1", want: map[string]string{"a": "1"}},
		{opts: "-ca=1", want: map[string]string{"a": "1"}},
		{opts: "--a=1", want: map[string]string{"a": "1"}},
		{opts: "-c statement-timeout=5s", want: map[string]string{"statement_timeout": "5s"}},
		{opts: "-c a=1\t-c b=2  --c=3", want: map[string]string{"a": "1", "b": "2", "c": "3"}},
		{opts: "-c a=x=y", want: map[string]string{"a": "x=y"}},
		{opts: "-c a=", want: map[string]string{"a": ""}},
		{opts: `-c search_path=my\ schema`, want: map[string]string{"search_path": "my schema"}},
		{opts: `-c a=back\\slash`, want: map[string]string{"a": `back\slash`}},
		{opts: `-c a=tab\	in`, want: map[string]string{"a": "tab\tin"}},
		{opts: `-c\ a=1`, want: map[string]string{" a": "1"}}, // one word: the name is " a", its space kept
		{opts: "-c a=1 -c a=2", want: map[string]string{"a": "2"}},
		{opts: "-c search_path=x -c SEARCH_PATH=y", want: map[string]string{"SEARCH_PATH": "y"}}, // one name in two spellings: the later
		{opts: "-c a=\xff\xfe", want: map[string]string{"a": "\xff\xfe"}},                        // not UTF-8: the bytes as sent
		{opts: "-c", code: pgproto.CodeProtocolViolation, message: `invalid startup option ""`},
		{opts: "-c =1", code: pgproto.CodeProtocolViolation, message: `invalid startup option "=1"`},
		{opts: "--flag", code: pgproto.CodeProtocolViolation, message: `invalid startup option "flag"`},
		{opts: "-c a=1 -d", code: pgproto.CodeFeatureNotSupported, message: `unsupported startup option "-d": only -c name=value is supported`},
		{opts: "a=1", code: pgproto.CodeSyntaxError, message: `invalid command-line argument for server process: a=1`},
	} {
		got := map[string]string{}
		err := parseOptions(tc.opts, got)
		switch {
		case tc.code != "" && err == nil:
			t.Errorf("parseOptions(%q) = %v, want refusal %s %q", tc.opts, got, tc.code, tc.message)
		case tc.code != "" && (err.Code != tc.code || err.Message != tc.message):
			t.Errorf("parseOptions(%q) refused with %s %q, want %s %q", tc.opts, err.Code, err.Message, tc.code, tc.message)
		case tc.code == "" && err != nil:
			t.Errorf("parseOptions(%q): %v", tc.opts, err)
		case tc.code == "" && !maps.Equal(got, tc.want):
			t.Errorf("parseOptions(%q) = %q, want %q", tc.opts, got, tc.want)
		}
	}
}

// TestErrorString: a refusal logs as its SQLSTATE and message.
func TestErrorString(t *testing.T) {
	_, err := Parse(packet())
	if got, want := err.Error(), "28000: no PostgreSQL user name specified in startup packet"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

// TestAppendV2Error checks protocol 2's error format, byte for byte, as
// PostgreSQL sends it to a client asking for protocol 2 or older, and that
// it appends to what dst holds.
func TestAppendV2Error(t *testing.T) {
	got := AppendV2Error([]byte("x"), "unsupported frontend protocol 2.0: server supports 3.0 to 3.2")
	want := []byte("xEFATAL:  unsupported frontend protocol 2.0: server supports 3.0 to 3.2\n\x00")
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendV2Error = %q, want %q", got, want)
	}
}

// TestLimiter checks the per-source and total limits, in the order they
// are named in a refusal, and that Release gives a slot back.
func TestLimiter(t *testing.T) {
	type op struct {
		release bool // else acquire
		src     string
		refusal string // for an acquire: "" when it must succeed
	}
	const maxTotal, maxPerSource = 3, 2
	for _, tc := range []struct {
		name  string
		ops   []op
		count int
	}{
		{name: "under both limits", ops: []op{{src: "a"}, {src: "b"}}, count: 2},
		{name: "per source", ops: []op{
			{src: "a"}, {src: "a"},
			{src: "a", refusal: "too many connections still authenticating from a"},
			{src: "b"},
		}, count: 3},
		{name: "total", ops: []op{
			{src: "a"}, {src: "b"}, {src: "c"},
			{src: "d", refusal: "too many connections still authenticating"},
		}, count: 3},
		{name: "per source named first", ops: []op{
			{src: "a"}, {src: "a"}, {src: "b"},
			{src: "a", refusal: "too many connections still authenticating from a"},
		}, count: 3},
		{name: "release frees a slot", ops: []op{
			{src: "a"}, {src: "a"}, {src: "b"},
			{release: true, src: "a"},
			{src: "c"},
			{src: "a", refusal: "too many connections still authenticating"},
			{release: true, src: "b"},
			{src: "a"},
		}, count: 3},
		{name: "all released", ops: []op{
			{src: "a"}, {src: "b"},
			{release: true, src: "a"}, {release: true, src: "b"},
		}, count: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l Limiter
			for i, o := range tc.ops {
				if o.release {
					l.Release(o.src)
					continue
				}
				refusal, ok := l.Acquire(o.src, maxTotal, maxPerSource)
				if ok != (o.refusal == "") || refusal != o.refusal {
					t.Fatalf("op %d: Acquire(%q) = %q, %v, want %q", i, o.src, refusal, ok, o.refusal)
				}
			}
			if n := l.Count(); n != tc.count {
				t.Fatalf("Count = %d, want %d", n, tc.count)
			}
		})
	}
}

// TestLimiterForgetsSources: the limiter holds only sources with sessions
// starting, so many sources coming and going leave nothing behind.
func TestLimiterForgetsSources(t *testing.T) {
	var l Limiter
	for i := range 1000 {
		src := fmt.Sprint("192.0.2.", i)
		if _, ok := l.Acquire(src, 10, 10); !ok {
			t.Fatalf("Acquire(%s) refused", src)
		}
		l.Release(src)
	}
	if n, m := l.Count(), len(l.bySource); n != 0 || m != 0 {
		t.Fatalf("after every slot was released: Count = %d, %d sources kept; want 0, 0", n, m)
	}
}

// TestLimiterConcurrent: sessions of many sources acquiring and releasing
// at once never exceed the limits (run with -race).
func TestLimiterConcurrent(t *testing.T) {
	var l Limiter
	const maxTotal, maxPerSource = 8, 3
	var wg sync.WaitGroup
	var mu sync.Mutex
	over := ""
	for g := range 16 {
		wg.Go(func() {
			src := fmt.Sprint("src", g%4)
			for range 500 {
				if _, ok := l.Acquire(src, maxTotal, maxPerSource); !ok {
					continue
				}
				l.mu.Lock()
				if l.total > maxTotal || l.bySource[src] > maxPerSource {
					mu.Lock()
					over = fmt.Sprintf("%d in all, %d from %s", l.total, l.bySource[src], src)
					mu.Unlock()
				}
				l.mu.Unlock()
				l.Release(src)
			}
		})
	}
	wg.Wait()
	if over != "" {
		t.Fatalf("limits exceeded: %s", over)
	}
	if n := l.Count(); n != 0 {
		t.Fatalf("Count = %d after every slot was released", n)
	}
}

// TestCanonTable checks what the greeting finds without a server: the
// server's spelling of values some client of the same pool sent before,
// under the same default, and nothing else.
func TestCanonTable(t *testing.T) {
	defaults := map[string]string{"DateStyle": "ISO, MDY", "client_encoding": "UTF8", "TimeZone": "Etc/UTC"}
	var ct CanonTable
	if got, ok := ct.Lookup("db", "u", defaults, map[string]string{"client_encoding": "utf-8"}); ok {
		t.Fatalf("an empty table found %v", got)
	}
	// A client sent datestyle=iso, client_encoding=utf-8 and an
	// unreported work_mem; the server applied them and reported its own
	// spelling of the first two.
	startup := map[string]string{"datestyle": "iso", "client_encoding": "utf-8", "work_mem": "4MB"}
	desired := map[string]string{"DateStyle": "ISO, MDY", "client_encoding": "UTF8", "work_mem": "4MB"}
	ct.Learn("db", "u", defaults, startup, desired)

	for _, tc := range []struct {
		name           string
		database, user string
		defaults       map[string]string
		startup        map[string]string
		want           map[string]string // nil: not found
	}{
		{name: "as learnt", database: "db", user: "u", defaults: defaults, startup: startup,
			want: map[string]string{"DateStyle": "ISO, MDY", "client_encoding": "UTF8"}},
		{name: "the name in another case", database: "db", user: "u", defaults: defaults,
			startup: map[string]string{"DATESTYLE": "iso"}, want: map[string]string{"DateStyle": "ISO, MDY"}},
		{name: "an unreported value accepted before", database: "db", user: "u", defaults: defaults,
			startup: map[string]string{"work_mem": "4MB"}, want: map[string]string{}},
		{name: "an unreported value not seen", database: "db", user: "u", defaults: defaults,
			startup: map[string]string{"work_mem": "8MB"}},
		{name: "an unreported parameter not seen", database: "db", user: "u", defaults: defaults,
			startup: map[string]string{"replication": "database"}},
		{name: "another value", database: "db", user: "u", defaults: defaults,
			startup: map[string]string{"client_encoding": "LATIN1"}},
		{name: "one value unknown", database: "db", user: "u", defaults: defaults,
			startup: map[string]string{"client_encoding": "utf-8", "TimeZone": "utc"}},
		{name: "another default", database: "db", user: "u",
			defaults: map[string]string{"DateStyle": "ISO, DMY"}, startup: map[string]string{"datestyle": "iso"}},
		{name: "another database", database: "db2", user: "u", defaults: defaults,
			startup: map[string]string{"client_encoding": "utf-8"}},
		{name: "another user", database: "db", user: "v", defaults: defaults,
			startup: map[string]string{"client_encoding": "utf-8"}},
		{name: "names are not run together", database: "db\x00u", user: "", defaults: defaults,
			startup: map[string]string{"client_encoding": "utf-8"}},
	} {
		got, ok := ct.Lookup(tc.database, tc.user, tc.defaults, tc.startup)
		if ok != (tc.want != nil) || !maps.Equal(got, tc.want) {
			t.Errorf("%s: Lookup = %v, %v; want %v", tc.name, got, ok, tc.want)
		}
	}
}

// TestCanonTableLimit: a pool keeps at most canonLimit (1,024) values; the
// Learn that finds it full starts it again from empty, and other pools
// keep theirs.
func TestCanonTableLimit(t *testing.T) {
	if canonLimit != 1024 {
		t.Fatalf("canonLimit = %d, the README says 1,024", canonLimit)
	}
	var ct CanonTable
	app := func(i int) map[string]string { return map[string]string{"application_name": fmt.Sprint("app", i)} }
	ct.Learn("other", "u", nil, app(0), app(0))
	for i := range canonLimit {
		ct.Learn("db", "u", nil, app(i), app(i))
	}
	for _, i := range []int{0, canonLimit - 1} {
		if _, ok := ct.Lookup("db", "u", nil, app(i)); !ok {
			t.Fatalf("value %d of %d not found", i, canonLimit)
		}
	}
	ct.Learn("db", "u", nil, app(canonLimit), app(canonLimit))
	if _, ok := ct.Lookup("db", "u", nil, app(0)); ok {
		t.Fatalf("a full table was not emptied: value 0 still found")
	}
	if got, ok := ct.Lookup("db", "u", nil, app(canonLimit)); !ok || got["application_name"] != fmt.Sprint("app", canonLimit) {
		t.Fatalf("the value learnt into an emptied table: Lookup = %v, %v", got, ok)
	}
	if n := len(ct.m[canonPoolKey("db", "u")]); n != 1 {
		t.Fatalf("%d values kept after emptying, want 1", n)
	}
	if _, ok := ct.Lookup("other", "u", nil, app(0)); !ok {
		t.Fatalf("emptying one pool's table emptied another's")
	}
}

// TestCanonTableConcurrent: sessions of one pool learn and look up at once
// (run with -race).
func TestCanonTableConcurrent(t *testing.T) {
	var ct CanonTable
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				v := map[string]string{"application_name": fmt.Sprint(g, "-", i)}
				ct.Learn("db", "u", nil, v, v)
				// Another goroutine may have emptied a full table since,
				// so a miss is no error; the race detector is the check.
				ct.Lookup("db", "u", nil, v)
			}
		})
	}
	wg.Wait()
}

// TestCompareFoldASCII checks the order of the greeting's ParameterStatus
// messages: PostgreSQL 15's, by name with ASCII case folded.
func TestCompareFoldASCII(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		sign int
	}{
		{"a", "B", -1},
		{"B", "a", 1},
		{"DateStyle", "datestyle", 0},
		{"TimeZone", "timezone_abbreviations", -1},
		{"_x", "A", -1}, // '_' comes before the letters once they are folded
		{"", "a", -1},
		{"\xc3\x89", "\xc3\xa9", -1}, // only ASCII is folded
	} {
		got := CompareFoldASCII(tc.a, tc.b)
		if (got > 0) != (tc.sign > 0) || (got < 0) != (tc.sign < 0) {
			t.Errorf("CompareFoldASCII(%q, %q) = %d, want sign %d", tc.a, tc.b, got, tc.sign)
		}
	}
	names := []string{
		"TimeZone", "standard_conforming_strings", "session_authorization", "server_version",
		"server_encoding", "is_superuser", "IntervalStyle", "integer_datetimes", "in_hot_standby",
		"default_transaction_read_only", "DateStyle", "client_encoding", "application_name",
	}
	want := slices.Clone(names)
	slices.Reverse(want)
	slices.SortFunc(names, CompareFoldASCII)
	if !slices.Equal(names, want) {
		t.Fatalf("sorted: %s\nwant:   %s", strings.Join(names, " "), strings.Join(want, " "))
	}
	if n := testing.AllocsPerRun(100, func() { CompareFoldASCII("DateStyle", "datestyle") }); n != 0 {
		t.Fatalf("CompareFoldASCII allocates %v times", n)
	}
}
