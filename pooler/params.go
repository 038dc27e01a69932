package pooler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/backend"
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
	return s.paramKey
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
	if key := s.desiredKey(); st.syncedKey == key {
		return nil
	}
	// set_config takes the value exactly as a startup packet would, which a
	// SET literal does not for list parameters such as search_path.
	var sets, resets strings.Builder
	var setUnreported map[string]string
	for k, v := range s.desired {
		if trackedReported[k] {
			if conn.Params[k] == v {
				continue
			}
		} else if cur, ok := st.set[k]; ok && cur == v {
			continue
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
		fmt.Fprintf(&sets, "pg_catalog.set_config(%s, %s, false)", quoteLiteral(k), quoteLiteral(v))
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
	st.unnamedOK = false // a simple Query destroys the unnamed statement
	nc := conn.NetConn()
	deadline := time.Now().Add(s.p.cfg.AcquireTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = nc.SetDeadline(deadline)
	defer func() { _ = nc.SetDeadline(time.Time{}) }()

	if _, err := conn.W.Write(appendQuery(nil, q)); err != nil {
		return fatal(codeConnectionFailure, "server connection lost", err)
	}
	if err := conn.W.Flush(); err != nil {
		return fatal(codeConnectionFailure, "server connection lost", err)
	}
	var serverErr *PGError
	for {
		typ, _, err := conn.R.Next()
		if err != nil {
			return fatal(codeConnectionFailure, "server connection lost", err)
		}
		switch typ {
		case 'S':
			body, err := conn.R.Body()
			if err != nil {
				return fatal(codeConnectionFailure, "server connection lost", err)
			}
			var ps pgproto3.ParameterStatus
			if ps.Decode(body) == nil {
				if conn.Params == nil {
					conn.Params = make(map[string]string)
				}
				conn.Params[ps.Name] = ps.Value
				if cur, ok := s.desired[ps.Name]; ok && cur != ps.Value {
					s.desired[ps.Name] = ps.Value
					s.paramKey = ""
				}
			}
		case 'E':
			body, err := conn.R.Body()
			if err != nil {
				return fatal(codeConnectionFailure, "server connection lost", err)
			}
			var er pgproto3.ErrorResponse
			if er.Decode(body) == nil {
				serverErr = &PGError{Severity: "ERROR", Code: er.Code, Message: er.Message, Detail: er.Detail, Hint: er.Hint}
				if er.Severity == "FATAL" || er.Severity == "PANIC" {
					serverErr.Severity = "FATAL"
				}
			}
		case 'Z':
			if err := conn.R.Skip(); err != nil {
				return fatal(codeConnectionFailure, "server connection lost", err)
			}
			if serverErr != nil {
				// The whole multi-statement query ran as one implicit
				// transaction and was rolled back: nothing changed.
				return serverErr
			}
			for k, v := range setUnreported {
				st.set[k] = v
			}
			for _, k := range resetUnreported {
				delete(st.set, k)
			}
			st.syncedKey = s.desiredKey()
			return nil
		default:
			if err := conn.R.Skip(); err != nil {
				return fatal(codeConnectionFailure, "server connection lost", err)
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
