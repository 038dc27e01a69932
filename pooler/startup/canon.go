package startup

import (
	"sync"

	"github.com/pgquic/pgquic/pooler/params"
)

// The greeting a client gets after authenticating reports every parameter
// the server reports, as PostgreSQL itself would send them.
//
// PostgreSQL reports a parameter's value in its own spelling, not the
// client's: a startup packet with client_encoding=utf-8 gets "UTF8",
// DateStyle=iso gets "ISO, MDY", TimeZone=utc gets "UTC". In transaction
// mode the pooler greets a client without asking a server, so the spelling
// of each (parameter, value) a client sends is learnt once from a server
// connection (set_config, then the ParameterStatus the server answers
// with) and kept in a small per-pool table, CanonTable.

// canonLimit bounds the entries kept per pool: application_name in
// particular can take any value, and a client that sends a new one each
// time must not grow the table without bound. A full table is emptied
// rather than pruned: relearning costs one borrowed connection per value.
const canonLimit = 1024

// CanonTable maps a startup value of a reported parameter to the spelling
// the server reports for it (and keeps the unreported values a server
// accepted), per server database and user, as learnt from
// servers. It lets the pooler greet a client in transaction mode, where no
// server connection is kept at login, with the values a server would have
// reported, borrowing a server connection only for values it has not seen.
// Once a pool has 1,024 values, the next Learn for it starts again from
// empty, so a client sending a new application_name each time costs a
// bounded table and, now and then, one more borrowed connection.
// Its zero value is ready to use, and it is safe for concurrent use.
type CanonTable struct {
	mu sync.Mutex
	m  map[string]map[string]string // pool key -> canonKey -> server's value
}

// canonPoolKey identifies a pool by its server database and user, the
// two things that can give a parameter another default (ALTER DATABASE
// or ALTER ROLE ... SET) and so another spelling.
func canonPoolKey(database, user string) string { return database + "\x00" + user }

// canonKey identifies a client's value for a parameter. The default in force
// is part of it: a partial DateStyle such as "ISO" keeps the default's order
// (MDY or DMY).
func canonKey(name, value, def string) string { return name + "\x00" + value + "\x00" + def }

// Lookup returns the server's spelling of every reported parameter in
// startup (a client's startup settings, in its spelling of the names),
// keyed by the server's name, for the pool of database and user with the
// server's defaults. It returns false when one of them has not been learnt
// yet, or a value of an unreported parameter has not been accepted by a
// server of the pool before: the greeting must then ask a server (which
// refuses the login as PostgreSQL would, for an unknown parameter or a bad
// value), and Learn what it said. Unreported values are learnt too, though
// nothing of theirs is greeted: else a client sending only those (options
// -c work_mem=banana, -c replication=database) would be greeted without a
// server and then fail every statement.
func (t *CanonTable) Lookup(database, user string, defaults, startup map[string]string) (map[string]string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	known := t.m[canonPoolKey(database, user)]
	out := make(map[string]string, len(startup))
	for k, v := range startup {
		k = params.Canonical(k)
		if !params.Reported(k) {
			if _, ok := known[canonKey(k, v, "")]; !ok {
				return nil, false
			}
			continue
		}
		c, ok := known[canonKey(k, v, defaults[k])]
		if !ok {
			return nil, false
		}
		out[k] = c
	}
	return out, true
}

// Learn records the server's spelling of the client's startup values of
// reported parameters, read from desired (keyed by the server's names)
// once a server applied them, so the next client of the pool sending the
// same values is greeted without a server.
func (t *CanonTable) Learn(database, user string, defaults, startup, desired map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[string]map[string]string)
	}
	pk := canonPoolKey(database, user)
	known := t.m[pk]
	if known == nil || len(known) >= canonLimit {
		known = make(map[string]string)
		t.m[pk] = known
	}
	for k, v := range startup {
		k = params.Canonical(k)
		switch c, ok := desired[k]; {
		case !ok:
		case params.Reported(k):
			known[canonKey(k, v, defaults[k])] = c
		default:
			known[canonKey(k, v, "")] = v // accepted: nothing to spell
		}
	}
}

// CompareFoldASCII orders parameter names as PostgreSQL's pg_strcasecmp
// does: byte by byte, with ASCII letters folded to lower case. The
// greeting sends its ParameterStatus messages in this order because
// PostgreSQL's GUC table is sorted so, and clients compared with
// PostgreSQL see the same frames. It allocates nothing, unlike comparing
// strings.ToLower copies, as it runs for every name of every login.
func CompareFoldASCII(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ca, cb := lowerASCII(a[i]), lowerASCII(b[i])
		if ca != cb {
			return int(ca) - int(cb)
		}
	}
	return len(a) - len(b)
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
