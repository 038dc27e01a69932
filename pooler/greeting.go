package pooler

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"sync"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/pooler/params"
)

// The greeting a client gets after authenticating: ParameterStatus for every
// parameter the server reports, as PostgreSQL itself would send them.
//
// PostgreSQL reports a parameter's value in its own spelling, not the
// client's: a startup packet with client_encoding=utf-8 gets "UTF8",
// DateStyle=iso gets "ISO, MDY", TimeZone=utc gets "UTC". In transaction mode
// the pooler greets a client without asking a server, so the spelling of each
// (parameter, value) a client sends is learnt once from a server connection
// (set_config, then the ParameterStatus the server answers with) and kept in
// a small per-pool table, canonTable.

// canonLimit bounds the entries kept per pool: application_name in
// particular can take any value, and a client that sends a new one each time
// must not grow the table without bound. A full table is emptied.
const canonLimit = 1024

// canonTable maps a startup value of a reported parameter to the spelling the
// server reports for it, per server database and user, as learnt from
// servers. Its zero value is ready to use.
type canonTable struct {
	mu sync.Mutex
	m  map[string]map[string]string // pool key -> canonKey -> server's value
}

func canonPoolKey(pool *backend.Pool) string { return pool.Database() + "\x00" + pool.User() }

// canonKey identifies a client's value for a parameter. The default in force
// is part of it: a partial DateStyle such as "ISO" keeps the default's order
// (MDY or DMY).
func canonKey(name, value, def string) string { return name + "\x00" + value + "\x00" + def }

// lookup returns the server's spelling of every reported parameter in
// startup, or false when one of them has not been learnt yet.
func (t *canonTable) lookup(pool *backend.Pool, defaults, startup map[string]string) (map[string]string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	known := t.m[canonPoolKey(pool)]
	out := make(map[string]string, len(startup))
	for k, v := range startup {
		k = params.Canonical(k)
		if !params.Reported(k) {
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

// learn records the server's spelling of the client's startup values of
// reported parameters, read from desired once a server applied them.
func (t *canonTable) learn(pool *backend.Pool, defaults, startup, desired map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[string]map[string]string)
	}
	pk := canonPoolKey(pool)
	known := t.m[pk]
	if known == nil || len(known) >= canonLimit {
		known = make(map[string]string)
		t.m[pk] = known
	}
	for k, v := range startup {
		k = params.Canonical(k)
		if c, ok := desired[k]; ok && params.Reported(k) {
			known[canonKey(k, v, defaults[k])] = c
		}
	}
}

// canonicalStartup applies the client's startup parameters in transaction
// mode, where no server connection is kept at login: it fills s.desired
// with the server's spelling of each value. When one has not been learnt
// yet, a server connection is borrowed and the values applied to it (which
// also checks them, so a value the server refuses ends the startup with the
// server's error, as it would directly).
func (s *session) canonicalStartup(ctx context.Context, defaults map[string]string, sp *startupParams) error {
	p := s.p
	if canon, ok := p.canon.lookup(s.pool, defaults, sp.params); ok {
		s.initDesired(defaults, sp.params)
		for k, v := range canon {
			s.desired[k] = v
		}
		s.paramKey = ""
		return nil
	}
	conn, _, err := s.acquireConn(ctx, pipeBatch{})
	if err != nil {
		return err
	}
	s.initDesired(defaults, sp.params)
	if _, err := s.syncParams(ctx, conn); err != nil {
		var pe *PGError
		if errors.As(err, &pe) && pe.Code != pgproto.CodeConnectionFailure {
			conn.Release() // the server refused a value; the connection is at rest
		} else {
			conn.Destroy()
		}
		return err
	}
	conn.Release()
	p.canon.learn(s.pool, defaults, sp.params, s.desired)
	return nil
}

// appendGreeting appends to buf the ParameterStatus messages of the
// greeting: every parameter in defaults, with the client's own values where
// it has them, in the order PostgreSQL sends them (by name, ignoring ASCII
// case, as its GUC table is sorted with pg_strcasecmp). It encodes them
// directly, in a buffer sized once, so that a login leaves little garbage
// behind: thousands of sessions logging in at once otherwise leave
// kilobytes each in the heap until the next collection.
func (s *session) appendGreeting(buf []byte, defaults map[string]string) []byte {
	names := make([]string, 0, len(defaults))
	for k := range defaults {
		names = append(names, k)
	}
	slices.SortFunc(names, compareFoldASCII)
	size := 1 + 4 + 4 + len(s.secret) + 6 // BackendKeyData and ReadyForQuery, which follow
	for _, k := range names {
		size += 1 + 4 + len(k) + 1 + len(s.greetingValue(defaults, k)) + 1
	}
	buf = slices.Grow(buf, size)
	for _, k := range names {
		v := s.greetingValue(defaults, k)
		buf = append(buf, 'S')
		buf = binary.BigEndian.AppendUint32(buf, uint32(4+len(k)+1+len(v)+1))
		buf = append(buf, k...)
		buf = append(buf, 0)
		buf = append(buf, v...)
		buf = append(buf, 0)
	}
	return buf
}

// greetingValue is the value the greeting reports for parameter k: the
// client's own where it has one, the configured server_version, else the
// server's.
func (s *session) greetingValue(defaults map[string]string, k string) string {
	if d, ok := s.desired[k]; ok {
		return d
	}
	if k == "server_version" && s.p.cfg.ServerVersion != "" {
		return s.p.cfg.ServerVersion
	}
	return defaults[k]
}

// compareFoldASCII orders parameter names as PostgreSQL's pg_strcasecmp
// does: byte by byte, with ASCII letters folded to lower case. It allocates
// nothing, unlike comparing strings.ToLower copies.
func compareFoldASCII(a, b string) int {
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
