package pooler

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/sqllex"
	"github.com/pgquic/pgquic/internal/wire"
	"github.com/pgquic/pgquic/pooler/params"
)

// initDesired records the parameter values the client expects: the server's
// defaults for tracked parameters, overridden by the client's startup
// parameters (tracked or not).
func (s *session) initDesired(defaults, startup map[string]string) {
	s.desired = make(map[string]string, params.Count()+len(startup))
	for k := range params.All() {
		if v, ok := defaults[k]; ok {
			s.desired[k] = v
		}
	}
	s.startupParams = make(map[string]string, len(startup))
	for k, v := range startup {
		s.desired[params.Canonical(k)] = v
		s.startupParams[params.Canonical(k)] = v
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
	s.paramKey, s.reapply = params.Key(s.desired, s.reapply)
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
	mine := s.lastBorrower(a.st)
	a.st.lastUser, s.lastConn = s.id, a.st
	if mine || len(s.reapply) == 0 {
		return nil
	}
	s.push(a, entry{kind: eQuery, quiet: true})
	a.st.stmts.DropUnnamed() // a simple Query destroys the unnamed statement
	return s.writeServer(a, s.reapply)
}

// syncParams brings conn's parameters in line with what the client expects
// before the connection is lent to it. The first time in a session it takes
// one round trip: replies are swallowed, except that the server's canonical
// spelling of each value is remembered, and a value the server rejects is
// returned as the server's error. Once a server has accepted the client's
// values, later syncs cost no round trip: the query is returned instead,
// for the caller to pipeline ahead of the client's message (a failure is
// then only logged, see paramQueryDone).
func (s *session) syncParams(ctx context.Context, conn *backend.Conn) (pipelined string, err error) {
	st := stateOf(conn)
	if s.lastBorrower(st) {
		// Nothing but this session touched the connection since it last
		// synced it, and the session used no other one meanwhile: what is
		// in force is what the client made it, its own SETs included, and
		// reported parameters were followed.
		return "", nil
	}
	if key := s.desiredKey(); st.syncedKey == key && !st.dirtyAll {
		// Sessions with one key desire the same values, so once a pass
		// found conn agreeing with them, it need not be repeated until
		// conn's parameters change.
		if (st.agreedKey != key || st.agreedGen != conn.ParamsGen()) && !s.adoptReported(conn) {
			st.agreedKey, st.agreedGen = key, conn.ParamsGen()
		}
		return "", nil
	}
	q, setUnreported, all := s.syncQuery(conn, st)
	if q == "" {
		st.syncedKey = s.desiredKey()
		return "", nil
	}
	st.stmts.DropUnnamed() // a simple Query destroys the unnamed statement
	if s.proven && pipelinable(setUnreported) {
		st.synced(s, setUnreported, all)
		return q, nil
	}
	deadline := time.Now().Add(s.p.cfg.AcquireTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	err = exchange(conn, q, deadline, func(name, value string) {
		if cur, ok := s.desired[name]; ok && cur != value {
			s.desired[name] = value
			s.paramKey = ""
		}
	})
	if err != nil {
		// On a server error the whole multi-statement query ran as one
		// implicit transaction and was rolled back: nothing changed.
		return "", err
	}
	s.adoptReported(conn)
	st.synced(s, setUnreported, all)
	s.proven = true
	return "", nil
}

// syncQuery returns the query that brings conn's parameters (st) in line
// with the client's, "" when they are already, the unreported parameters
// it sets (for synced), and whether it starts with RESET ALL.
//
// A parameter an earlier client set that this one does not want goes back
// to its default with RESET ALL, never with RESET of its name: the name
// came from the earlier client's statement as the pooler read it, and the
// server may have refused that statement (SET no_such_variable, a custom
// name the server calls invalid) or may refuse the name now (a placeholder
// whose prefix an extension reserved since). A RESET of it would fail, and
// with it the whole sync, so this client's next statement would run with
// the earlier client's values. RESET ALL cannot fail; everything this
// client wants is then set again.
func (s *session) syncQuery(conn *backend.Conn, st *serverState) (q string, setUnreported map[string]string, all bool) {
	all = st.dirtyAll
	for k := range st.set {
		if _, ok := s.desired[k]; !ok {
			all = true
			break
		}
	}
	// set_config takes the value exactly as a startup packet would, which a
	// SET literal does not for list parameters such as search_path.
	var sets strings.Builder
	for k, v := range s.desired {
		if params.Reported(k) {
			if conn.Params[k] == v && !all {
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
		fmt.Fprintf(&sets, "pg_catalog.set_config(%s, %s, false)", params.QuoteLiteral(k), params.QuoteValue(v))
	}
	if sets.Len() == 0 && !all {
		return "", nil, false
	}
	q = sets.String()
	if q != "" {
		q += ";"
	}
	if all {
		// An earlier client ran RESET ALL, set_config of a parameter we
		// cannot name, or set one this client does not: start from the
		// defaults again. RESET ALL leaves role and session_authorization
		// alone (GUC_NO_RESET_ALL), which an earlier client's startup
		// options may have set (-c role=...): they are reset first.
		q = "RESET SESSION AUTHORIZATION;RESET ROLE;RESET ALL;" + q
	}
	return q, setUnreported, all
}

// pipelinable reports whether a parameter sync that sets these unreported
// parameters may go ahead of the client's message without waiting for the
// server's answer: only when no server process can refuse a value another
// accepted (params.ValueChecked). A refused sync is rolled back whole,
// and the client's statement behind it would run with the values an
// earlier client left; waiting costs one round trip to the server, and a
// refusal then reaches the client as the server's error.
func pipelinable(unreported map[string]string) bool {
	for k := range unreported {
		if !params.ValueChecked(k) {
			return false
		}
	}
	return true
}

// synced records that s's parameters were set on the connection, after a
// RESET ALL when all is set.
func (st *serverState) synced(s *session, set map[string]string, all bool) {
	if all {
		clear(st.set)
	}
	for k, v := range set {
		st.set[k] = v
	}
	st.dirtyAll = false
	st.syncedKey = s.desiredKey()
	st.lastUser, s.lastConn = s.id, st
}

// lastBorrower reports whether st's parameters are as this session left
// them: it borrowed the connection last, and has borrowed no other since.
// The second half matters: a client whose SET ran on another connection
// while this one sat idle in the pool would otherwise come back to the old
// value (the next statement after SET timezone ran with the previous one).
// Owner only.
func (s *session) lastBorrower(st *serverState) bool {
	return st.lastUser == s.id && s.lastConn == st
}

// syncedParameter records a ParameterStatus answering a pipelined sync:
// the value the client expects, so the connection's synced key stays
// valid. s.mu must be held.
func (s *session) syncedParameter(a *attachment, body []byte) {
	var ps pgproto3.ParameterStatus
	if ps.Decode(body) != nil {
		return
	}
	a.conn.SetParam(ps.Name, ps.Value)
}

// adoptReported makes the client's reported parameters the server's
// spelling of them once conn has applied them (UTF8 for utf-8, "ISO, MDY"
// for iso), as PostgreSQL reports them. A value the server already had
// produced no ParameterStatus, so they are read back from what conn last
// reported.
// It reports whether it changed anything.
func (s *session) adoptReported(conn *backend.Conn) bool {
	changed := false
	for k, want := range s.desired {
		if v, ok := conn.Params[k]; ok && params.Reported(k) && want != v {
			s.desired[k] = v
			s.paramKey = ""
			changed = true
		}
	}
	return changed
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
		if k = params.Canonical(k); !params.Reported(k) {
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
				conn.SetParam(ps.Name, ps.Value)
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

// A client's own session-level parameter changes.
//
// PostgreSQL returns a parameter to its startup-packet value on RESET, but
// the pooler applies startup parameters with set_config (PostgreSQL's
// RESET would fall back to the server default), and in transaction mode a
// client's next transaction may run on another server connection, which
// knows nothing of the client's SETs. So after a client's synchronisation
// message (Query or Sync) whose statements changed parameters, the pooler
// pipelines one quiet query of its own (followLocked): set_config of the
// startup values a RESET or RESET ALL took away, then, in transaction mode,
// the session's parameters as the server now has them (pg_settings rows
// whose source is the session), which replace the client's unreported
// desired values. Reported parameters follow ParameterStatus as before.
// The next server connection the client lands on gets them with the rest
// of its parameters, pipelined ahead of its first message.

// paramQuery tracks the replies of a quiet parameter query.
type paramQuery struct {
	follow   bool              // after a client's statement: its ParameterStatus reports reach the client
	sync     bool              // a pipelined parameter sync ahead of the client's first message
	snapshot int               // ordinal of the RowDescription of the session's parameters; 0 for none
	results  int               // RowDescriptions seen
	rows     map[string]string // the session's parameters read so far
	failed   bool              // the server answered with an error
}

// row records one DataRow of the session's parameters.
func (q *paramQuery) row(body []byte) {
	if q.snapshot == 0 || q.results != q.snapshot {
		return
	}
	cols, ok := dataRowColumns(body, 2)
	if !ok || cols[0] == nil || cols[1] == nil {
		return
	}
	if q.rows == nil {
		q.rows = make(map[string]string)
	}
	if _, dup := q.rows[string(cols[0])]; dup {
		return // a custom parameter pg_settings listed too
	}
	q.rows[string(cols[0])] = string(cols[1])
}

// dataRowColumns splits a DataRow body with n columns; a NULL is nil.
func dataRowColumns(body []byte, n int) ([][]byte, bool) {
	if len(body) < 2 || int(body[0])<<8|int(body[1]) != n {
		return nil, false
	}
	body = body[2:]
	cols := make([][]byte, n)
	for i := range n {
		if len(body) < 4 {
			return nil, false
		}
		l := int32(uint32(body[0])<<24 | uint32(body[1])<<16 | uint32(body[2])<<8 | uint32(body[3]))
		body = body[4:]
		if l < 0 {
			continue
		}
		if int(l) > len(body) {
			return nil, false
		}
		cols[i] = body[:l]
		body = body[l:]
	}
	return cols, true
}

// paramQueryDone handles the ReadyForQuery of a quiet parameter query.
// s.mu must be held.
func (s *session) paramQueryDone(a *attachment, q *paramQuery) {
	if q.sync {
		a.st.syncPend = max(a.st.syncPend-1, 0)
	}
	if q.sync && q.failed {
		// Values a server accepted before were refused: start this
		// connection from its defaults next time, and let the operator know.
		s.log.Warn("setting the client's parameters on a server connection failed", "server_pid", a.conn.PID)
		a.st.syncedKey, a.st.lastUser, a.st.dirtyAll = "", 0, true
	}
	if q.snapshot == 0 {
		return
	}
	if q.failed || a.status != 'I' {
		// Inside a transaction block the values may still be rolled
		// back: read them again after the client's next message.
		s.snapshot = true
		return
	}
	s.snapshot = false
	for k := range s.desired {
		if !params.Reported(k) {
			delete(s.desired, k)
		}
	}
	for k, v := range q.rows {
		if !params.Reported(k) && params.Carried(k) {
			s.desired[k] = v
			a.st.set[k] = v
		}
	}
	s.paramKey = ""
}

// clientParamsLocked records what a client's statement does to run-time
// parameters for the rest of its session: a RESET of a parameter it gave a
// startup value, or RESET ALL, is followed by set_config of that value;
// with track (transaction mode) any change makes the pooler read the
// session's parameters back. s.mu must be held.
func (s *session) clientParamsLocked(info sqlInfo, track bool) {
	for _, k := range info.resets {
		for sk, v := range s.startupParams {
			if strings.EqualFold(sk, k) {
				s.setRestore(sk, v)
			}
		}
	}
	if info.resetAll {
		for k, v := range s.startupParams {
			s.setRestore(k, v)
		}
	}
	if !track || s.snapshot {
		return
	}
	// Reported parameters follow ParameterStatus: a statement that
	// changes only those needs no read-back.
	s.snapshot = info.paramsAll
	for _, k := range append(info.params, info.resets...) {
		s.snapshot = s.snapshot || !params.Reported(params.Canonical(k))
		if strings.Contains(k, ".") && len(s.custom) < maxCustomParams {
			if s.custom == nil {
				s.custom = make(map[string]bool)
			}
			s.custom[k] = true
		}
	}
}

// maxCustomParams bounds the custom (dotted) parameter names the pooler
// reads back for one client.
const maxCustomParams = 1000

func (s *session) setRestore(k, v string) {
	if s.restore == nil {
		s.restore = make(map[string]string)
	}
	s.restore[k] = v
}

// followLocked stages, right behind the client's synchronisation message,
// the quiet query described above, when one is due. It costs no round trip:
// the connection goes back to the pool once its ReadyForQuery arrives,
// which follows the client's own at once. s.mu must be held.
//
// Nothing follows a COPY whose data the client has not ended (CopyDone,
// CopyFail): a Query arriving while the server waits for copy data would
// fail the COPY, and until its reply the pooler cannot tell a COPY FROM
// STDIN from a COPY TO or one that fails to start. The query is then owed
// (a.followOwed): the connection stays the session's, not released at its
// ReadyForQuery, until the owner sends the query once the COPY's
// ReadyForQuery has come (followAtRest), or the client's next
// synchronisation message does; the client's settings are only on this
// server until they are read back. When a relay goroutine reads the
// COPY's replies, the owner waits for that ReadyForQuery
// (awaitOwedRest) rather than for its client, which may say nothing for
// a long time while every other client waits for the connection.
func (s *session) followLocked(a *attachment) error {
	if a.followOwed && !a.copyOpen && s.p.cfg.Mode == ModeTransaction {
		// Read what was owed now, whatever read-back of an earlier
		// request was answered meanwhile (its answer cleared s.snapshot,
		// but was read before the owed request ran).
		s.snapshot = true
	}
	if len(s.restore) == 0 && !s.snapshot {
		a.followOwed, s.followDue = false, false
		return nil
	}
	if a.copyOpen {
		a.followOwed, s.followDue = true, true
		if a.owedRest == nil {
			a.owedRest = make(chan struct{})
		}
		return nil
	}
	a.followOwed, s.followDue = false, false
	q := &paramQuery{follow: true}
	var b strings.Builder
	if len(s.restore) > 0 {
		b.WriteString("SELECT ")
		first := true
		for k, v := range s.restore {
			if !first {
				b.WriteString(", ")
			}
			first = false
			fmt.Fprintf(&b, "pg_catalog.set_config(%s, %s, false)", params.QuoteLiteral(k), params.QuoteValue(v))
		}
		b.WriteString(";")
		q.snapshot++ // its RowDescription comes first
		clear(s.restore)
	}
	if s.snapshot {
		b.WriteString(params.SessionSQL)
		if len(s.custom) > 0 {
			// pg_settings leaves out custom parameters (myapp.tenant):
			// read those the client named by name.
			b.WriteString(" UNION ALL SELECT n, pg_catalog.current_setting(n, true) FROM pg_catalog.unnest(ARRAY[")
			first := true
			for k := range s.custom {
				if !first {
					b.WriteString(", ")
				}
				first = false
				b.WriteString(params.QuoteLiteral(k))
			}
			b.WriteString("]::text[]) n")
		}
		q.snapshot++
	} else {
		q.snapshot = 0
	}
	s.push(a, entry{kind: eQuery, quiet: true, params: q})
	a.st.stmts.DropUnnamed() // a simple Query destroys the unnamed statement
	return s.writeServer(a, appendQuery(nil, b.String()))
}

// followAtRest sends the parameter query a COPY held back (followLocked)
// once the connection is at rest, so it can go back to the pool: the owner
// calls it before it waits for the client, and reports whether it staged
// the query (its replies are then read like any others). Only while one
// is owed (s.followDue, which only the owner touches) does it take s.mu:
// the common request pays one field test.
func (s *session) followAtRest(ctx context.Context) (bool, error) {
	if !s.followDue {
		return false, nil
	}
	s.mu.Lock()
	a := s.att
	if a == nil || a.released || !a.followOwed {
		s.followDue = false // the attachment that owed it is gone
		s.mu.Unlock()
		return false, nil
	}
	if a.closing || a.copyOpen || a.pending() != 0 || a.status != 'I' {
		s.mu.Unlock()
		return false, nil
	}
	err := s.followLocked(a)
	staged := a.pending() != 0
	s.mu.Unlock()
	if err == nil {
		err = s.sendOut(ctx)
	}
	return staged, err
}

// awaitOwedRest is for the owner about to wait for its client while a
// parameter query is owed behind a COPY whose data the client has ended
// and a relay goroutine reads the replies: it waits instead for the
// ReadyForQuery that leaves the connection at rest (a.owedRest, closed in
// atRestLocked) or for the relay's end, and reports true when the owner
// should look again (followAtRest then sends the query). Waiting for the
// client would leave the connection held until the client spoke again:
// one that stays silent after its COPY would keep it from every other
// client. It reports false, and the owner waits for its client, when
// nothing is owed, the client's COPY data has not ended (another COPY of
// the same Query that asks for data sets copyOpen again and wakes the
// owner, interpretLocked), the ReadyForQuery needs a Sync the client has
// not sent, or a transaction block holds the connection anyway.
func (s *session) awaitOwedRest(ctx context.Context) bool {
	s.mu.Lock()
	a := s.att
	if a == nil || a.released || !a.followOwed || a.copyOpen || a.closing || !a.relaying {
		s.mu.Unlock()
		return false
	}
	if a.pending() == 0 {
		rested := a.status == 'I'
		s.mu.Unlock()
		return rested // at rest already: followAtRest sends it now
	}
	if n := len(a.queue); a.queue[n-1].kind != eSync && a.queue[n-1].kind != eQuery {
		// No Sync or Query is sent: its ReadyForQuery needs more from
		// the client (an extended COPY whose client waits for the
		// CommandComplete before its Sync).
		s.mu.Unlock()
		return false
	}
	ch, done := a.owedRest, a.done
	s.mu.Unlock()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
	case <-done:
	case <-ctx.Done():
		return false
	}
	return true
}

// sessionQuery forwards a simple Query in session mode, where the server
// connection is the client's alone and only RESET needs the pooler: a
// RESET of a startup parameter, or RESET ALL, is followed by set_config
// of the startup values.
func (s *session) sessionQuery(ctx context.Context) error {
	if len(s.startupParams) == 0 && s.sessionTextRead(false) {
		return s.forward(ctx, eQuery)
	}
	body, err := s.cr.Body()
	if err != nil {
		return err
	}
	sql, _, ok := wire.CString(body)
	if !ok {
		return fatal(pgproto.CodeProtocolViolation, "invalid Query message", nil)
	}
	s.noteProcessText(sql)
	info := inspectSQL(sql)
	s.mu.Lock()
	a, err := s.attachLocked(ctx)
	if err != nil {
		s.mu.Unlock()
		return s.raise(err, true)
	}
	defer s.mu.Unlock()
	s.push(a, entry{kind: eQuery})
	if err := s.writeServer(a, s.frame('Q', body)); err != nil {
		return err
	}
	s.clientParamsLocked(info, false)
	a.copy = a.copy || info.copy
	a.copyOpen = a.copyOpen || info.copy
	return s.followLocked(a)
}

// sessionTextRead reads, in session mode, the text of the current Query
// (or Parse, after its statement name) for noteProcessText when the whole
// message is already buffered, without consuming it, and reports whether
// it did; a message not buffered whole is left to the caller's Body path.
func (s *session) sessionTextRead(parse bool) bool {
	if s.processBound {
		return true // the connection is to be closed anyway
	}
	f := s.cr.Frames()
	if len(f) < s.msgLen {
		return false
	}
	text := f[wire.HeaderLen:s.msgLen]
	if parse {
		if _, rest, ok := wire.CString(text); ok {
			text = rest
		}
	}
	sql, _, _ := wire.CString(text)
	s.noteProcessText(sql)
	return true
}

// noteProcessText marks, in session mode, a client whose text calls a
// function whose effect stays with the server process
// (sqllex.MayHoldProcessState: setseed, pg_backup_start, a temporary
// replication slot, dblink_connect): DISCARD ALL would leave it for the
// next client of the process, so the connection is closed when this one
// leaves (abandonLocked). Transaction mode reads it with the rest of the
// text's flags (noteState).
func (s *session) noteProcessText(sql []byte) {
	if !s.processBound && sqllex.MayHoldProcessState(bytesString(sql)) {
		s.mu.Lock()
		s.processBound = true
		s.mu.Unlock()
	}
}

// sessionForward forwards a Parse or Bind in session mode. With startup
// parameters to return to, it notes which of the client's statements RESET
// parameters, and when one of them is bound, the startup values are set
// again behind the client's next Sync (see followLocked).
func (s *session) sessionForward(ctx context.Context, k entryKind) error {
	if len(s.startupParams) == 0 && (k != eParse || s.sessionTextRead(true)) {
		return s.forward(ctx, k)
	}
	body, err := s.cr.Body()
	if err != nil {
		return err
	}
	name, rest, ok := wire.CString(body) // Parse: statement name; Bind: portal
	if ok && k == eBind {
		name, _, ok = wire.CString(rest)
	}
	if !ok {
		return fatal(pgproto.CodeProtocolViolation, "invalid message", nil)
	}
	s.mu.Lock()
	a, err := s.attachLocked(ctx)
	if err != nil {
		s.mu.Unlock()
		return s.raise(err, false)
	}
	defer s.mu.Unlock()
	switch k {
	case eParse:
		sql, _, _ := wire.CString(rest)
		s.noteProcessText(sql)
		info := inspectSQL(sql)
		if info.resetAll || len(info.resets) > 0 {
			if s.resetStmts == nil {
				s.resetStmts = make(map[string]sqlInfo)
			}
			if len(s.resetStmts) < maxCustomParams {
				s.resetStmts[string(name)] = info
			}
		} else if s.resetStmts != nil {
			delete(s.resetStmts, string(name))
		}
	case eBind:
		if info, ok := s.resetStmts[string(name)]; ok {
			s.clientParamsLocked(info, false)
		}
	}
	typ := byte('P')
	if k == eBind {
		typ = 'B'
	}
	s.push(a, entry{kind: k})
	return s.writeServer(a, s.frame(typ, body))
}
