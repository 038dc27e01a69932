package pooler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
)

// trackedReported are the run-time parameters the server reports with
// ParameterStatus that a client may set and that change how results look.
// In transaction mode consecutive transactions of one client may run on
// different server connections, so before lending a connection the pooler
// sets these to the client's values when they differ (as PgBouncer does for
// its track_extra_parameters).
var trackedReported = map[string]bool{
	"application_name":            true,
	"client_encoding":             true,
	"DateStyle":                   true,
	"IntervalStyle":               true,
	"TimeZone":                    true,
	"standard_conforming_strings": true,
}

// canonicalParam maps a startup parameter name to the spelling the server
// reports, so "datestyle" and "DateStyle" are one parameter.
func canonicalParam(k string) string {
	for t := range trackedReported {
		if strings.EqualFold(t, k) {
			return t
		}
	}
	return k
}

// unreported reports whether the server keeps a parameter to itself: a
// change to it, by a client's SET, set_config or a function, produces no
// ParameterStatus, so the pooler cannot see that it drifted.
func unreported(k string) bool { return !trackedReported[k] }

// initDesired records the parameter values the client expects: the server's
// defaults for tracked parameters, overridden by the client's startup
// parameters (tracked or not).
func (s *session) initDesired(defaults, startup map[string]string) {
	s.desired = make(map[string]string, len(trackedReported)+len(startup))
	for k := range trackedReported {
		if v, ok := defaults[k]; ok {
			s.desired[k] = v
		}
	}
	for k, v := range startup {
		s.desired[canonicalParam(k)] = v
	}
	s.paramKey = ""
}

// desiredKey serialises the desired parameters, so a server connection last
// synced for identical settings (the usual case: many clients of one
// application) needs no comparison at all.
func (s *session) desiredKey() string {
	if s.paramKey != "" {
		return s.paramKey
	}
	keys := make([]string, 0, len(s.desired))
	for k := range s.desired {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(s.desired[k])
		b.WriteByte(0)
	}
	s.paramKey = b.String()
	s.reapply = s.reapply[:0]
	for _, k := range keys {
		if !unreported(k) {
			continue
		}
		if len(s.reapply) == 0 {
			s.reapply = append(s.reapply, "SELECT "...)
		} else {
			s.reapply = append(s.reapply, ", "...)
		}
		s.reapply = append(s.reapply, "pg_catalog.set_config("+quoteLiteral(k)+", "+quoteValue(s.desired[k])+", false)"...)
	}
	if len(s.reapply) > 0 {
		s.reapply = appendQuery(nil, string(s.reapply))
	}
	return s.paramKey
}

// reapplyParams stages, ahead of the client's first message of a
// transaction, a quiet query that sets the client's unreported startup
// parameters again, unless this session was the connection's last borrower.
// An earlier client may have changed them with SET or set_config, and the
// server would not have said so (search_path, for one). Pipelined with the
// client's own message it costs no round trip. s.mu must be held.
func (s *session) reapplyParams(a *attachment) error {
	s.desiredKey()
	last := a.st.lastUser
	a.st.lastUser = s.id
	if last == s.id || len(s.reapply) == 0 {
		return nil
	}
	s.push(a, entry{kind: eQuery, quiet: true})
	a.st.unnamedOK = false // a simple Query destroys the unnamed statement
	return s.writeServer(a, s.reapply)
}

// syncParams brings conn's parameters in line with what the client expects,
// in one round trip, before the connection is lent to it. Replies are
// swallowed, except that the server's canonical spelling of each value is
// remembered. A value the server rejects is returned as the server's error.
func (s *session) syncParams(ctx context.Context, conn *backend.Conn) error {
	st, _ := conn.State.(*serverState)
	if st == nil {
		st = newServerState()
		conn.State = st
	}
	if st.lastUser == s.id {
		// Nothing but this session touched the connection since it last
		// synced it: what is in force is what the client made it, its own
		// SETs included, and reported parameters were followed.
		return nil
	}
	if key := s.desiredKey(); st.syncedKey == key && !st.dirtyAll {
		s.adoptReported(conn)
		return nil
	}
	// set_config takes the value exactly as a startup packet would, which a
	// SET literal does not for list parameters such as search_path.
	var sets, resets strings.Builder
	var setUnreported map[string]string
	for k, v := range s.desired {
		if trackedReported[k] {
			if conn.Params[k] == v && !st.dirtyAll {
				continue
			}
		} else {
			if setUnreported == nil {
				setUnreported = make(map[string]string)
			}
			setUnreported[k] = v
		}
		if sets.Len() == 0 {
			sets.WriteString("SELECT ")
		} else {
			sets.WriteString(", ")
		}
		fmt.Fprintf(&sets, "pg_catalog.set_config(%s, %s, false)", quoteLiteral(k), quoteValue(v))
	}
	var resetUnreported []string
	for k := range st.set {
		if _, ok := s.desired[k]; !ok {
			fmt.Fprintf(&resets, "RESET %s;", quoteIdent(k))
			resetUnreported = append(resetUnreported, k)
		}
	}
	if sets.Len() == 0 && resets.Len() == 0 {
		st.syncedKey = s.desiredKey()
		return nil
	}
	q := sets.String()
	if q != "" {
		q += ";"
	}
	q += resets.String()
	if st.dirtyAll {
		// An earlier client ran RESET ALL or set_config of a parameter we
		// cannot name: start from the defaults again.
		q = "RESET ALL;" + q
	}
	st.unnamedOK = false // a simple Query destroys the unnamed statement
	deadline := time.Now().Add(s.p.cfg.AcquireTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	err := exchange(conn, q, deadline, func(name, value string) {
		if cur, ok := s.desired[name]; ok && cur != value {
			s.desired[name] = value
			s.paramKey = ""
		}
	})
	if err != nil {
		// On a server error the whole multi-statement query ran as one
		// implicit transaction and was rolled back: nothing changed.
		return err
	}
	s.adoptReported(conn)
	for k, v := range setUnreported {
		st.set[k] = v
	}
	for _, k := range resetUnreported {
		delete(st.set, k)
	}
	st.dirtyAll = false
	st.syncedKey = s.desiredKey()
	st.lastUser = s.id
	return nil
}

// adoptReported makes the client's reported parameters the server's
// spelling of them once conn has applied them (UTF8 for utf-8, "ISO, MDY"
// for iso), as PostgreSQL reports them. A value the server already had
// produced no ParameterStatus, so they are read back from what conn last
// reported.
func (s *session) adoptReported(conn *backend.Conn) {
	for k, want := range s.desired {
		if v, ok := conn.Params[k]; ok && trackedReported[k] && want != v {
			s.desired[k] = v
			s.paramKey = ""
		}
	}
}

// paramUnknown stands, in serverState.set, for a value a client gave a
// parameter with its own SET: no startup packet can ask for it, so the next
// session either resets the parameter or sets its own value.
const paramUnknown = "\x00"

// clientSet records that a client changed run-time parameters for the
// session (SET, RESET, RESET ALL, set_config): the next session to borrow
// the connection brings them back to what it expects.
func (st *serverState) clientSet(names []string, all bool) {
	if all {
		st.dirtyAll = true
	}
	for _, k := range names {
		if k = canonicalParam(k); unreported(k) {
			st.set[k] = paramUnknown
		}
	}
	st.syncedKey = ""
}

// exchange runs one simple Query of the pooler's own on an idle server
// connection that no client is using, and reads its replies up to
// ReadyForQuery, all before deadline. Each ParameterStatus updates the
// connection's parameters and is passed to onParam (which may be nil). It
// returns the server's error as a *PGError (FATAL if the server said so), or
// a FATAL 08006 when the connection failed, in which case it must be
// destroyed.
func exchange(conn *backend.Conn, sql string, deadline time.Time, onParam func(name, value string)) error {
	nc := conn.NetConn()
	_ = nc.SetDeadline(deadline)
	defer func() { _ = nc.SetDeadline(time.Time{}) }()
	lost := func(err error) error { return fatal(pgproto.CodeConnectionFailure, "server connection lost", err) }
	if _, err := conn.W.Write(appendQuery(nil, sql)); err != nil {
		return lost(err)
	}
	if err := conn.W.Flush(); err != nil {
		return lost(err)
	}
	var serverErr *PGError
	for {
		typ, _, err := conn.R.Next()
		if err != nil {
			return lost(err)
		}
		switch typ {
		case 'S':
			body, err := conn.R.Body()
			if err != nil {
				return lost(err)
			}
			var ps pgproto3.ParameterStatus
			if ps.Decode(body) == nil {
				if conn.Params == nil {
					conn.Params = make(map[string]string)
				}
				conn.Params[ps.Name] = ps.Value
				if onParam != nil {
					onParam(ps.Name, ps.Value)
				}
			}
		case 'E':
			body, err := conn.R.Body()
			if err != nil {
				return lost(err)
			}
			var er pgproto3.ErrorResponse
			if serverErr == nil && er.Decode(body) == nil {
				serverErr = &PGError{Severity: "ERROR", Code: er.Code, Message: er.Message, Detail: er.Detail, Hint: er.Hint}
				if er.Severity == "FATAL" || er.Severity == "PANIC" {
					serverErr.Severity = "FATAL"
				}
			}
		case 'Z':
			if err := conn.R.Skip(); err != nil {
				return lost(err)
			}
			if serverErr != nil {
				return serverErr
			}
			return nil
		default:
			if err := conn.R.Skip(); err != nil {
				return lost(err)
			}
		}
	}
}

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

func quoteLiteral(s string) string {
	return `'` + strings.ReplaceAll(s, `'`, `''`) + `'`
}
