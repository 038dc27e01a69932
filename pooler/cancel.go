package pooler

import (
	"context"
	"errors"
	"time"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/pooler/lanes"
)

// Bounds on forwarding a cancel to the server.
const (
	// cancelTimeout bounds one forwarded CancelRequest: dialing the server,
	// sending the request and waiting for the server to close the
	// connection, which it does once it has signalled the query's process.
	cancelTimeout = 5 * time.Second

	// cancelSettleTimeout bounds how long a server connection whose request
	// finished waits for cancels still in flight before it goes back to the
	// pool. After it the connection is destroyed instead: a cancel that may
	// still land must not hit the next client's query.
	cancelSettleTimeout = cancelTimeout + time.Second
)

// cancelGroup counts the cancels forwarded for one attachment that the
// server may not have processed yet. A connection goes back to the pool only
// once its group is empty and no forward failed (see cancelsSettled). The
// group is its own object, not a field of the attachment, because the owner
// reuses a released attachment's memory for the next connection while a
// cancel that timed out may still finish later. Fields are guarded by the
// session's mu.
type cancelGroup struct {
	n      int           // cancels in flight
	failed bool          // a forward failed: it may still reach the server
	done   chan struct{} // closed when n drops to zero; replaced when it rises again
	once   bool          // other clients' requests are on the connection behind it: cancel with one signal
}

// beginCancelLocked registers a cancel for the request the session's
// attachment is running and returns the connection to cancel, or nil when
// nothing runs on a server (no attachment, already released, or nothing
// pending). s.mu must be held: checking and registering under one lock is
// what keeps the connection from being released in between.
//
// On a connection shared with other clients' requests (pipeline.go) the
// cancel waits for the requests ahead to finish (awaitTurn), and, with
// requests behind, for the client's own to have run long enough that it
// cannot be a fast query about to end (lanes.Rider.Cancelable, deferCancel).
func (s *session) beginCancelLocked() (*backend.Conn, *cancelGroup) {
	a := s.att
	if a == nil || a.released || a.pending() == 0 {
		return nil, nil
	}
	shared := false
	if rd := a.rider; rd != nil {
		var ok bool
		var after time.Duration
		ok, shared, after = rd.Cancelable(s.p.laneLimits())
		if !ok {
			if after > 0 {
				s.deferCancelLocked(a, rd, after)
			}
			return nil, nil
		}
	}
	g := a.cancels
	if g == nil {
		g = &cancelGroup{}
		a.cancels = g
	}
	if shared && g.once {
		// This request had its one-signal cancel. Another, sent after the
		// first ended the query, would stop the request behind, which is
		// another client's; and each costs the server a session. So a
		// client repeating its CancelRequest gets no second one.
		return nil, nil
	}
	g.once = g.once || shared
	if g.n == 0 {
		g.done = make(chan struct{})
	}
	g.n++
	s.cancelsOut.Add(1)
	return a.conn, g
}

// forwardCancel sends the cancel registered in g to conn's server and waits
// until the server has processed it (backend.Pool.Cancel reads until the
// server closes the cancel connection), then ends the registration.
//
// On a connection shared with other clients' requests the next request is
// another client's, already written behind this one, and a CancelRequest's
// second signal (see awaitCancels) could stop it: there the cancel is sent
// with one signal instead (backend.Pool.CancelOnce), and only if that
// session cannot be had (the server full, say) as a CancelRequest, whose
// rare stray signal the lane reports as another client's cancel.
func (s *session) forwardCancel(ctx context.Context, conn *backend.Conn, g *cancelGroup) {
	s.mu.Lock()
	once := g.once
	s.mu.Unlock()
	ctx, done := context.WithTimeout(ctx, cancelTimeout)
	var err error
	if once {
		err = conn.Pool().CancelOnce(ctx, conn.PID)
		if errors.Is(err, backend.ErrCancelNotSent) {
			s.log.Warn("cancelling with one signal failed; sending a CancelRequest", "err", err)
		}
	}
	if !once || errors.Is(err, backend.ErrCancelNotSent) {
		err = conn.Pool().Cancel(ctx, conn.PID, conn.SecretKey)
	}
	done()
	if err != nil {
		s.log.Warn("forwarding cancel request failed", "err", err)
	}
	s.mu.Lock()
	if err != nil {
		g.failed = true
		if a := s.att; a != nil && a.cancels == g && !a.released && a.rider == nil {
			// The cancel may still land, on whatever the connection runs
			// next: the connection goes, and the request still on it
			// fails with 08006 through the relay's read. (A connection
			// shared with other clients' requests is not this client's to
			// close: it is destroyed when the client leaves it, by
			// finishRelease.)
			a.destroy = true
			_ = a.conn.NetConn().Close()
		}
	}
	g.n--
	if g.n == 0 {
		close(g.done)
	}
	s.cancelsOut.Add(-1)
	s.mu.Unlock()
}

// awaitCancels holds the owner's next write to a's server while a cancel
// forwarded for an earlier request of the session is still in flight.
// PostgreSQL signals the cancelled process twice, the process and then its
// process group (postmaster.c, signal_child), and closes the cancel
// connection only after both. On a busy machine the second signal can come
// after the first has ended the request, and it then stops whatever the
// connection runs next: libpq's PQcancel waits for that close before it
// returns for this reason. The pooler's own cancels (query_timeout, a
// client gone, a cancel deferred on a shared connection) have no client
// waiting for them, so the session waits here, before anything more of its
// reaches the server; s.cancelsOut keeps the common case to one atomic
// load. A cancel that does not complete within cancelSettleTimeout, or
// failed, ends the session's use of the connection: it is destroyed and the
// client is told with a FATAL 08006. A request on a connection shared with
// other clients' is left to the lane, which takes no new request while a
// cancel for one of its requests may land (lanes.Pool.cancelable). s.mu
// must not be held.
func (s *session) awaitCancels(ctx context.Context, a *attachment) error {
	s.mu.Lock()
	if a.rider != nil {
		s.mu.Unlock()
		return nil
	}
	g := a.cancels
	var wait chan struct{}
	if g != nil && g.n > 0 {
		wait = g.done
		s.holdQueryLocked()
	}
	s.mu.Unlock()
	if g == nil {
		return nil // the session's cancels are for a connection it released
	}
	if wait != nil {
		t := time.NewTimer(cancelSettleTimeout)
		select {
		case <-wait:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if wait != nil {
		s.resumeQueryLocked()
	}
	if g.n == 0 && !g.failed {
		return nil
	}
	a.destroy = true
	_ = a.conn.NetConn().Close()
	return fatal(pgproto.CodeConnectionFailure, "server connection closed: a cancel request sent to it could not be confirmed", ctx.Err())
}

// cancelsSettled waits until no cancel of g, the group of an attachment
// whose request has finished, is in flight, bounded by cancelSettleTimeout.
// It reports whether the connection may go back to the pool: false when a
// cancel is still pending after the bound or one failed, so it may still hit
// whatever the connection runs next.
func (s *session) cancelsSettled(g *cancelGroup) bool {
	s.mu.Lock()
	var wait chan struct{}
	if g.n > 0 {
		wait = g.done
	}
	s.mu.Unlock()
	if wait != nil {
		t := time.NewTimer(cancelSettleTimeout)
		select {
		case <-wait:
		case <-t.C:
		}
		t.Stop()
	}
	s.mu.Lock()
	ok := g.n == 0 && !g.failed
	s.mu.Unlock()
	if !ok {
		s.log.Warn("a cancel request for this server connection did not complete; closing the connection instead of reusing it")
	}
	return ok
}

// deferCancelLocked asks again after d for a cancel of rd's request, which
// has others behind it on a shared connection (lanes.Rider.Cancelable). If the
// request has ended by then, the cancel is dropped: it would stop nothing
// of this client's. s.mu must be held.
func (s *session) deferCancelLocked(a *attachment, rd *lanes.Rider, d time.Duration) {
	gen := a.gen
	time.AfterFunc(d, func() {
		s.mu.Lock()
		var conn *backend.Conn
		var g *cancelGroup
		if s.att == a && a.gen == gen && a.rider == rd && !a.released {
			conn, g = s.beginCancelLocked()
		}
		s.mu.Unlock()
		if conn != nil {
			s.forwardCancel(context.Background(), conn, g)
		}
	})
}
