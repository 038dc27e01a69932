package pooler

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/wire"
)

// 0-RTT: a resumed QUIC client may send its startup and first request in
// its first flight, before the handshake is confirmed. Those bytes can be
// captured and sent again by anyone, to this server or to a replica
// sharing its ticket keys, so the pooler treats them as replayable until
// the front closes Peer.HandshakeConfirmed. Before that it reads the
// startup and authenticates (trust, an edge's certificate; a password
// exchange needs the client's answer, which comes after the client
// finished its handshake anyway) and answers the startup at once. A
// request is run before the confirmation only when all of these hold:
//
//   - Config.ZeroRTT allows it for the session's database and user
//     (zero_rtt: read-only), in transaction mode, the session not pinned;
//   - it is a simple Query, the last message the client sent so far;
//   - the lexer finds nothing but plain statements in it (sqlInfo.pipe:
//     no transaction control, no SET or set_config, no COPY, no session
//     state, no function but the harmless built-ins; what may share a
//     server connection with other clients), and it names none of the
//     built-ins that act even in a READ ONLY transaction (actsInReadOnly).
//
// It then runs between BEGIN READ ONLY and COMMIT, both the pooler's own
// (their replies swallowed), on a server connection of its own (never a
// shared lane), and its replies are held until its ReadyForQuery: if
// PostgreSQL refused a write (25006, read_only_sql_transaction: INSERT,
// nextval, CREATE...), the client sees none of them and the request runs
// again, normally, once the handshake is confirmed; otherwise the client
// gets them with ReadyForQuery 'I', as autocommit would have given.
// Every other request, and any request of a session whose database does
// not allow it, waits for the confirmation. A replayed flight never gets
// it (the replayer cannot finish the handshake), so what it may run is at
// most that read-only request; the session ends when the front reports
// the connection gone.

// ZeroRTTPolicy says which sessions may run a request before their
// handshake is confirmed (Config.ZeroRTT).
type ZeroRTTPolicy interface {
	// ZeroRTTReadOnly reports whether a session of user on database may
	// run a 0-RTT request read-only before the confirmation.
	ZeroRTTReadOnly(database, user string) bool
}

// codeReadOnlyTransaction is the SQLSTATE of a write refused in a READ
// ONLY transaction.
const codeReadOnlyTransaction = "25006"

// earlyRun is a session's 0-RTT request: run read-only, its replies held,
// or waiting to run once the handshake is confirmed. Its fields after
// frame are guarded by the session's mu (the relay writes them).
type earlyRun struct {
	frame  []byte // the request's Query message
	held   []byte // its replies so far
	denied bool   // PostgreSQL refused a write in it (25006)
	done   bool   // its ReadyForQuery came: delivered, or denied
	retry  bool   // run it normally once confirmed

	streaming bool // its replies outgrew maxEarlyHeld: delivered as they come
}

// confirmPoll is how often a session waiting for its handshake's
// confirmation asks the front whether the client is still there.
const confirmPoll = 20 * time.Millisecond

// gateEarly handles a client message that arrived before the handshake
// was confirmed: it runs it read-only when allowed (see above), or waits
// for the confirmation. handled reports that the message was consumed
// (run, or put back to be read again once confirmed); otherwise the
// confirmation came and the caller handles it as usual.
func (s *session) gateEarly(ctx context.Context, typ byte) (handled bool, err error) {
	select {
	case <-s.peer.HandshakeConfirmed:
		s.peer.HandshakeConfirmed = nil
		return false, nil
	default:
	}
	if typ != 'Q' || !s.mayRunEarly() {
		return false, s.awaitConfirmed(ctx)
	}
	body, err := s.cr.Body()
	if err != nil {
		return true, err
	}
	frame := bytes.Clone(s.frame('Q', body))
	if sql, _, ok := wire.CString(body); ok && s.cr.Buffered() == 0 && inspectSQL(sql).pipe && !actsWhenReadOnly(sql) {
		return true, s.runEarly(ctx, frame)
	}
	if err := s.awaitConfirmed(ctx); err != nil {
		return true, err
	}
	s.cr.Unread(frame)
	return true, nil
}

// actsInReadOnly names built-in functions that act even inside a READ
// ONLY transaction (a notification sent at commit, statistics reset, a
// transaction ID assigned, large objects, advisory locks held while the
// request runs, another server reached; NOTIFY itself is allowed in a
// READ ONLY transaction too): a request naming any of them
// waits for the confirmation. A name matched inside an identifier or a
// string only makes a request wait.
var actsInReadOnly = []string{
	"notify", "pg_stat_reset", "txid_current", "pg_current_xact_id", "pg_advisory", "pg_try_advisory",
	"dblink", "lo_", "lowrite", "loread", "pg_logical_emit_message", "pg_replication_", "pg_create_",
	"pg_drop_replication", "pg_switch_wal", "pg_log_backend_memory_contexts", "pg_promote", "pg_rotate_logfile",
}

// actsWhenReadOnly reports whether sql names a function of actsInReadOnly,
// ignoring case.
func actsWhenReadOnly(sql []byte) bool {
	low := bytes.ToLower(sql)
	for _, name := range actsInReadOnly {
		if bytes.Contains(low, []byte(name)) {
			return true
		}
	}
	return false
}

// mayRunEarly reports whether the session may run a 0-RTT request
// read-only, before looking at the request.
func (s *session) mayRunEarly() bool {
	if s.p.cfg.ZeroRTT == nil || s.p.cfg.Mode != ModeTransaction || s.pinned || s.early != nil {
		return false
	}
	s.mu.Lock()
	attached := s.currentLocked() != nil
	s.mu.Unlock()
	return !attached && s.p.cfg.ZeroRTT.ZeroRTTReadOnly(s.database, s.user)
}

// runEarly stages frame, a Query, between BEGIN READ ONLY and COMMIT on a
// server connection of the session's own; the relay holds its replies
// (holdEarlyLocked).
func (s *session) runEarly(ctx context.Context, frame []byte) error {
	s.early = &earlyRun{frame: frame}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.attachLocked(ctx) // s.pipeTyp unset: never a shared lane
	if err != nil {
		s.early = nil
		return s.raise(err, true)
	}
	if a.status != 'I' || a.rider != nil || a.pending() > 0 {
		s.early.retry, s.early.done = true, true // not a clean connection to wrap: hold it
		return nil
	}
	a.st.stmts.DropUnnamed() // a simple Query destroys the unnamed statement
	s.push(a, entry{kind: eQuery, quiet: true})
	if err := s.writeServer(a, appendQuery(nil, "BEGIN READ ONLY")); err != nil {
		return err
	}
	s.push(a, entry{kind: eQuery, early: true})
	if err := s.writeServer(a, frame); err != nil {
		return err
	}
	s.push(a, entry{kind: eQuery, quiet: true})
	return s.writeServer(a, appendQuery(nil, "COMMIT"))
}

// holdEarlyLocked keeps a reply of the 0-RTT request instead of
// delivering it; at its ReadyForQuery it writes them all, with status 'I',
// unless PostgreSQL refused a write, which makes the request run again
// once confirmed. Past maxEarlyHeld bytes of replies it stops holding
// them (a request that long is let through as it is: a write refused
// after that is the client's error, as it would be in a READ ONLY
// transaction of its own). s.mu must be held.
func (s *session) holdEarlyLocked(a *attachment, m *reply) {
	e := s.early
	forward := m.forward
	m.forward = false
	if e == nil {
		return
	}
	if m.typ == 'E' && errorCode(m.body) == codeReadOnlyTransaction {
		e.denied = true
	}
	if m.typ != 'Z' {
		switch {
		case !forward:
		case e.streaming:
			m.forward = true
		default:
			e.held = wire.AppendHeader(e.held, m.typ, len(m.body))
			e.held = append(e.held, m.body...)
			if len(e.held) > maxEarlyHeld {
				e.streaming = true
				s.writeHeldLocked(a, e.held)
				e.held = nil
			}
		}
		return
	}
	e.done = true
	if e.denied && !e.streaming {
		e.held, e.retry = nil, true
		return
	}
	s.p.m.zeroRTT.WithLabelValues("accepted").Inc()
	s.writeHeldLocked(a, append(e.held, readyForQuery('I')...))
	e.held = nil
}

// maxEarlyHeld bounds the replies of a 0-RTT request held back.
const maxEarlyHeld = 1 << 20

// writeHeldLocked writes b, whole messages, to the client. s.mu must be
// held.
func (s *session) writeHeldLocked(a *attachment, b []byte) {
	if a.clientGone.Load() {
		return
	}
	s.cwMu.Lock()
	_, err := s.clientWriter().Write(b)
	s.cwMu.Unlock()
	if err != nil {
		s.relayWriteFailed(a, err)
	}
}

// earlyDone is the owner's look at its 0-RTT request between messages:
// once answered it is forgotten; once denied it is put back to be read
// again when the handshake is confirmed.
func (s *session) earlyDone(ctx context.Context) error {
	s.mu.Lock()
	e := *s.early
	s.mu.Unlock()
	if !e.done {
		return nil
	}
	s.early = nil
	if !e.retry {
		return nil
	}
	if s.peer.HandshakeConfirmed != nil {
		if err := s.awaitConfirmed(ctx); err != nil {
			return err
		}
	}
	s.cr.Unread(e.frame)
	return nil
}

// awaitConfirmed holds the session's next request until the transport's
// handshake is confirmed (it returns nil at once when it is). It flushes
// what the session owes the client first, so the startup's answer is not
// held with the request. It returns an error when the client is gone or
// the session ends before the confirmation: the request is then never
// run.
func (s *session) awaitConfirmed(ctx context.Context) error {
	confirmed := s.peer.HandshakeConfirmed
	select {
	case <-confirmed:
		s.peer.HandshakeConfirmed = nil
		return nil
	default:
	}
	s.p.m.zeroRTT.WithLabelValues("deferred").Inc()
	if err := s.flushAll(false); err != nil {
		return err
	}
	t := time.NewTicker(confirmPoll)
	defer t.Stop()
	for {
		select {
		case <-confirmed:
			s.peer.HandshakeConfirmed = nil
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if s.peer.Probe != nil {
				if err := s.peer.Probe(); err != nil {
					return fmt.Errorf("client gone before its handshake was confirmed: %w", err)
				}
			}
			if s.isKilled() {
				return ErrShuttingDown
			}
		}
	}
}

// newZeroRTTCounter counts the requests that arrived before their
// handshake was confirmed, by outcome: "accepted" (run read-only and
// answered before the confirmation) or "deferred" (held until the
// confirmation, then run as usual; a request PostgreSQL refused to run
// read-only counts here too).
func newZeroRTTCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "pgquic", Subsystem: "pooler", Name: "zero_rtt_requests_total",
		Help: "Client requests received before the transport's handshake was confirmed (0-RTT), by outcome.",
	}, []string{"outcome"})
}
