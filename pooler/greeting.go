package pooler

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/pooler/startup"
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
// a small per-pool table, startup.CanonTable (the Pooler's canon).

// canonicalStartup applies the client's startup parameters in transaction
// mode, where no server connection is kept at login: it fills s.desired
// with the server's spelling of each value. When one has not been learnt
// yet, a server connection is borrowed and the values applied to it (which
// also checks them, so a value the server refuses ends the startup with the
// server's error, as it would directly).
func (s *session) canonicalStartup(ctx context.Context, defaults map[string]string, sp *startup.Params) error {
	p := s.p
	if canon, ok := p.canon.Lookup(s.pool.Database(), s.pool.User(), defaults, sp.Settings); ok {
		s.initDesired(defaults, sp.Settings)
		for k, v := range canon {
			s.desired[k] = v
		}
		s.paramKey = ""
		s.ignoreStartupAuthorization(defaults)
		return nil
	}
	conn, _, err := s.acquireConn(ctx, pipeBatch{})
	if err != nil {
		return err
	}
	s.initDesired(defaults, sp.Settings)
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
	p.canon.Learn(s.pool.Database(), s.pool.User(), defaults, sp.Settings, s.desired)
	s.ignoreStartupAuthorization(defaults)
	return nil
}

// ignoreStartupAuthorization does with a session_authorization among the
// startup parameters what PostgreSQL does: the value is checked (the
// server refused it above if the login role may not take it), and then
// the login role's own is in force, for PostgreSQL sets it at login over
// the client's (InitializeSessionUserId). Applied, it would make the
// client another user than PostgreSQL would.
func (s *session) ignoreStartupAuthorization(defaults map[string]string) {
	const name = "session_authorization"
	if _, ok := s.startupParams[name]; !ok {
		return
	}
	delete(s.startupParams, name)
	if v, ok := defaults[name]; ok {
		s.desired[name] = v
	} else {
		delete(s.desired, name)
	}
	s.paramKey = ""
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
	slices.SortFunc(names, startup.CompareFoldASCII)
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
