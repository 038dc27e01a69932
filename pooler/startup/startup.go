// Package startup holds the parts of a client's startup that need no
// session: the decoding of its StartupMessage, the refusal a client of
// protocol 2 or older can read, the limiter that bounds how many clients
// may be authenticating at once, and the per-pool table of the server's
// spelling of startup values that lets the pooler greet a client without
// asking a server.
//
// They are kept apart from the session so that each can be read and
// tested on its own, without a server or a connection: what a startup
// packet may contain, and what PostgreSQL answers to a bad one, is
// decided here, and the session only reads the packet and writes the
// answer. The package imports nothing of the pooler's but params (which
// parameters the server reports, and their names' spelling).
package startup

import (
	"fmt"
	"strings"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/wire"
)

// Params is what a StartupMessage asked for, once decoded. The session
// keeps it only until it is logged in: the user and database choose its
// pool, and Settings become its desired parameter values.
type Params struct {
	// Minor is the minor protocol version the client asked for; the
	// session negotiates a newer one down. Parse leaves it zero, as it
	// comes from the packet's version word, which the session reads
	// first.
	Minor uint16
	// User is the user name, never empty (Parse refuses a packet
	// without one, as PostgreSQL does).
	User string
	// Database is the database name, the user name when the packet
	// named none, as PostgreSQL defaults it.
	Database string
	// Settings are the run-time parameters (GUCs) to apply, those the
	// packet names and those its options parameter sets with -c or --,
	// in the client's spelling.
	Settings map[string]string
	// Unknown are the _pq_ protocol options the client asked for, none
	// of which the pooler supports; the session names them in its
	// NegotiateProtocolVersion.
	Unknown []string
}

// Error is a startup packet's refusal: the SQLSTATE and message the
// client is told, always with severity FATAL since the session ends. It
// is a plain value rather than the pooler's PGError so that this package
// need not import the pooler; the session turns it into one, and the
// code and text are PostgreSQL's own, which tests compare frame by frame
// (TestFramesBadStartup).
type Error struct {
	Code    string // SQLSTATE, a Code constant of internal/pgproto
	Message string
}

// Error formats the refusal for logs as its SQLSTATE and message.
func (e *Error) Error() string { return e.Code + ": " + e.Message }

func refuse(code, msg string) *Error { return &Error{Code: code, Message: msg} }

// Parse decodes the name/value pairs of a StartupMessage, b being the
// packet after its length and version words. It refuses what PostgreSQL
// refuses (a malformed list with 08P01, no user with 28000) and what the
// pooler cannot serve: a replication connection and options other than
// -c and -- with 0A000. The refusal is returned as a concrete *Error,
// nil on success, so the session can turn it into its own error type
// without a type assertion.
func Parse(b []byte) (*Params, *Error) {
	sp := &Params{Settings: make(map[string]string)}
	var opts map[string]string // from options, which the packet's own parameters override
	for {
		name, rest, ok := wire.CString(b)
		if !ok {
			return nil, refuse(pgproto.CodeProtocolViolation, "invalid startup packet layout: expected terminator as last byte")
		}
		if len(name) == 0 {
			if len(rest) != 0 {
				return nil, refuse(pgproto.CodeProtocolViolation, "invalid startup packet layout: expected terminator as last byte")
			}
			break
		}
		val, rest2, ok := wire.CString(rest)
		if !ok {
			return nil, refuse(pgproto.CodeProtocolViolation, "invalid startup packet layout: missing value")
		}
		b = rest2
		k, v := string(name), string(val)
		switch {
		case k == "user":
			sp.User = v
		case k == "database":
			sp.Database = v
		case k == "replication":
			if v != "false" && v != "0" && v != "off" && v != "no" {
				return nil, refuse(pgproto.CodeFeatureNotSupported, "replication connections are not supported by the pooler")
			}
		case k == "options":
			opts = make(map[string]string)
			if err := parseOptions(v, opts); err != nil {
				return nil, err
			}
		case strings.HasPrefix(k, "_pq_."):
			sp.Unknown = append(sp.Unknown, k)
		default:
			setFold(sp.Settings, k, v)
		}
	}
	for k, v := range opts {
		// PostgreSQL applies options first and the packet's parameters
		// after them, so a name given in both takes the packet's value.
		if !hasFold(sp.Settings, k) {
			sp.Settings[k] = v
		}
	}
	if sp.User == "" {
		return nil, refuse(pgproto.CodeInvalidAuthSpec, "no PostgreSQL user name specified in startup packet")
	}
	if sp.Database == "" {
		sp.Database = sp.User
	}
	return sp, nil
}

// parseOptions reads the "-c name=value" and "--name=value" switches libpq
// sends in the options parameter (PGOPTIONS). Backslash escapes a space.
// It reads bytes, not runes, so a value that is not UTF-8 reaches the
// server as sent (the server checks the encoding). A name given twice, in
// any case, takes the later value, as PostgreSQL's GUC names ignore case.
func parseOptions(opts string, into map[string]string) *Error {
	var words []string
	var cur strings.Builder
	esc := false
	for i := 0; i < len(opts); i++ {
		switch c := opts[i]; {
		case esc:
			cur.WriteByte(c)
			esc = false
		case c == '\\':
			esc = true
		case c == ' ' || c == '\t':
			if cur.Len() > 0 {
				words = append(words, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteByte(c)
		}
	}
	if cur.Len() > 0 {
		words = append(words, cur.String())
	}
	for i := 0; i < len(words); i++ {
		w := words[i]
		var kv string
		switch {
		case w == "-c" && i+1 < len(words):
			i++
			kv = words[i]
		case strings.HasPrefix(w, "-c"):
			kv = w[2:]
		case strings.HasPrefix(w, "--"):
			kv = w[2:]
		case !strings.HasPrefix(w, "-"):
			// As PostgreSQL words it, for a stray word after the switches.
			return refuse(pgproto.CodeSyntaxError, fmt.Sprintf("invalid command-line argument for server process: %s", w))
		default:
			return refuse(pgproto.CodeFeatureNotSupported, fmt.Sprintf("unsupported startup option %q: only -c name=value is supported", w))
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return refuse(pgproto.CodeProtocolViolation, fmt.Sprintf("invalid startup option %q", kv))
		}
		setFold(into, strings.ReplaceAll(k, "-", "_"), v)
	}
	return nil
}

// setFold sets m[k] to v, dropping any key that differs from k only in
// ASCII case: PostgreSQL's parameter names ignore case, so of two
// spellings of one name the later is the one in force.
func setFold(m map[string]string, k, v string) {
	for old := range m {
		if old != k && strings.EqualFold(old, k) {
			delete(m, old)
		}
	}
	m[k] = v
}

// hasFold reports whether m has k in any ASCII case.
func hasFold(m map[string]string, k string) bool {
	if _, ok := m[k]; ok {
		return true
	}
	for old := range m {
		if strings.EqualFold(old, k) {
			return true
		}
	}
	return false
}

// AppendV2Error appends a FATAL error in the format of protocol 2 ('E' and
// a NUL-terminated text). A client that asked for protocol 2 or older
// reads errors only in that format, and this is how PostgreSQL refuses
// it, so the client can show why it was refused.
func AppendV2Error(dst []byte, msg string) []byte {
	dst = append(dst, 'E')
	dst = append(dst, "FATAL:  "...)
	dst = append(dst, msg...)
	return append(dst, '\n', 0)
}
