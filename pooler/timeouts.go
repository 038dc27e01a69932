package pooler

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/pgquic/pgquic/internal/defaults"
	"github.com/pgquic/pgquic/internal/pgproto"
)

// Idle and query timeouts (Config.IdleTransactionTimeout, ClientIdleTimeout,
// QueryTimeout). Each session has at most one timer of each kind, created on
// first use and reset afterwards, so a session whose timeouts are all zero,
// the default, pays nothing.

// Kinds of idle wait, stored in session.idleKind while its timer runs.
const (
	idleNone int32 = iota
	idleSession
	idleInTransaction
)

// timeouts is a session's timer state. Fields are owner-only except the
// atomics, which the timers' goroutines read.
type timeouts struct {
	idleTimer *time.Timer
	idleKind  atomic.Int32
	idleDue   atomic.Int64            // when the armed idle wait expires, in UnixNano
	fired     atomic.Pointer[PGError] // the error a fired idle timer ended the session with

	queryTimer *time.Timer // guarded by s.mu
	queryArmed bool        // guarded by s.mu
	queryDue   time.Time   // when the armed request times out; guarded by s.mu
}

// A timer's function may already be running when the timer is stopped and
// armed again for the next wait: each expiry function therefore checks the
// due time of the wait now armed and leaves a wait that is not due yet to
// the rescheduled timer.

// armIdle starts the idle timer that applies now that the owner is about to
// wait for the client with nothing buffered: idle in a transaction (a server
// connection attached, nothing pending, status T or E), or idle outside
// one. While the server still owes replies nothing is armed: the client is
// waiting too, or sending COPY data.
func (s *session) armIdle() {
	idleTx, idleSess := s.p.timeout(&s.p.tmo.idleTx), s.p.timeout(&s.p.tmo.clientIdle)
	if idleTx == 0 && idleSess == 0 {
		return
	}
	s.mu.Lock()
	a := s.att
	kind, d := idleSession, idleSess
	if a != nil && !a.released {
		switch {
		case a.pending() > 0:
			kind = idleNone
		case a.status == 'T' || a.status == 'E':
			kind, d = idleInTransaction, idleTx
		}
	}
	s.mu.Unlock()
	if kind == idleNone || d == 0 {
		return
	}
	s.idleDue.Store(time.Now().Add(d).UnixNano())
	s.idleKind.Store(kind)
	if s.idleTimer == nil {
		s.idleTimer = time.AfterFunc(d, s.idleExpired)
		return
	}
	s.idleTimer.Reset(d)
}

// disarmIdle stops the idle timer once the client has sent something.
func (s *session) disarmIdle() {
	if s.idleKind.Swap(idleNone) != idleNone {
		s.idleTimer.Stop()
	}
}

// idleExpired runs on the timer's goroutine: it tells the client why, as
// PostgreSQL does, and closes its stream; the owner's read then fails and
// the session ends, rolling back a transaction left open.
func (s *session) idleExpired() {
	if time.Now().UnixNano() < s.idleDue.Load() {
		return // a stale expiry of an earlier wait
	}
	var pe *PGError
	switch s.idleKind.Swap(idleNone) {
	case idleInTransaction:
		pe = fatal(pgproto.CodeIdleInTransactionTimeout, "terminating connection due to idle-in-transaction timeout", nil)
	case idleSession:
		pe = fatal(pgproto.CodeIdleSessionTimeout, "terminating connection due to idle-session timeout", nil)
	default:
		return // disarmed meanwhile
	}
	s.fired.Store(pe)
	s.p.m.errors.WithLabelValues(pe.Code).Inc()
	s.log.Info("closing an idle client", "sqlstate", pe.Code, "reason", pe.Message)
	_ = s.writeRaw(pe.encode(nil))
	s.closeClient()
}

// armQueryLocked starts the query timer when a client request has been
// completed (its Sync, Query or FunctionCall pushed) and none is running.
// s.mu must be held.
func (s *session) armQueryLocked() {
	d := s.p.timeout(&s.p.tmo.query)
	if d == 0 || s.queryArmed {
		return
	}
	s.queryArmed = true
	s.queryDue = time.Now().Add(d)
	if s.queryTimer == nil {
		s.queryTimer = time.AfterFunc(d, s.queryExpired)
		return
	}
	s.queryTimer.Reset(d)
}

// queryAnsweredLocked stops the query timer at a ReadyForQuery that leaves
// nothing pending, or restarts it for the next pipelined request. s.mu must
// be held.
func (s *session) queryAnsweredLocked(a *attachment) {
	if !s.queryArmed {
		return
	}
	if a.pending() > 0 {
		d := s.p.timeout(&s.p.tmo.query)
		s.queryDue = time.Now().Add(d)
		s.queryTimer.Reset(d)
		return
	}
	s.queryArmed = false
	s.queryTimer.Stop()
}

// holdQueryLocked stops the query timer while the pooler itself holds the
// request back (awaitCancels): that time is not the server's. A stale
// expiry finds the request not due. s.mu must be held.
func (s *session) holdQueryLocked() {
	if !s.queryArmed {
		return
	}
	s.queryTimer.Stop()
	s.queryDue = time.Now().Add(time.Hour)
}

// resumeQueryLocked starts the held query timer afresh, as the request
// goes to the server. s.mu must be held.
func (s *session) resumeQueryLocked() {
	if !s.queryArmed {
		return
	}
	d := s.p.timeout(&s.p.tmo.query)
	s.queryDue = time.Now().Add(d)
	s.queryTimer.Reset(d)
}

// queryExpired cancels the request the server is running, through the same
// path as a client's CancelRequest, so the connection is not lent to anyone
// before the server has processed the cancel.
func (s *session) queryExpired() {
	s.mu.Lock()
	if !s.queryArmed || time.Now().Before(s.queryDue) {
		s.mu.Unlock()
		return // answered meanwhile, or a stale expiry of an earlier request
	}
	s.queryArmed = false
	conn, g := s.beginCancelLocked()
	s.mu.Unlock()
	if conn == nil {
		return
	}
	s.log.Info("cancelling a request that exceeded query_timeout", "timeout", s.p.timeout(&s.p.tmo.query))
	s.forwardCancel(context.Background(), conn, g)
}

// stopTimers stops every timer of a session that has ended.
func (s *session) stopTimers() {
	s.disarmIdle()
	s.mu.Lock()
	if s.queryArmed {
		s.queryArmed = false
		s.queryTimer.Stop()
	}
	s.mu.Unlock()
}

// liveTimeouts are the timeouts a running Pooler may be given anew
// (SetTimeouts), read by sessions at each use.
type liveTimeouts struct {
	acquire, idleTx, clientIdle, query atomic.Int64
}

// timeout reads one of p.tmo's durations.
func (p *Pooler) timeout(v *atomic.Int64) time.Duration { return time.Duration(v.Load()) }

// Timeouts are the Config durations a running Pooler can change: a
// configuration reload applies them to every session from its next wait on.
type Timeouts struct {
	// Acquire is Config.AcquireTimeout; zero keeps the default.
	Acquire time.Duration
	// IdleTransaction, ClientIdle and Query are the Config fields of the
	// same names; zero disables each.
	IdleTransaction, ClientIdle, Query time.Duration
}

// SetTimeouts replaces the pooler's timeouts. Sessions waiting now keep the
// timer they armed; their next wait uses the new values.
func (p *Pooler) SetTimeouts(t Timeouts) error {
	if t.Acquire < 0 || t.IdleTransaction < 0 || t.ClientIdle < 0 || t.Query < 0 {
		return errors.New("pooler: timeouts must not be negative")
	}
	if t.Acquire == 0 {
		t.Acquire = defaults.AcquireTimeout
	}
	p.tmo.acquire.Store(int64(t.Acquire))
	p.tmo.idleTx.Store(int64(t.IdleTransaction))
	p.tmo.clientIdle.Store(int64(t.ClientIdle))
	p.tmo.query.Store(int64(t.Query))
	return nil
}
