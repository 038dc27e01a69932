package pooler

import (
	"context"
	"time"

	"github.com/pgquic/pgquic/backend"
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
	if rd := a.rider; rd != nil {
		ok, after := rd.Cancelable(s.p.laneLimits())
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
	if g.n == 0 {
		g.done = make(chan struct{})
	}
	g.n++
	return a.conn, g
}

// forwardCancel sends the cancel registered in g to conn's server and waits
// until the server has processed it (backend.Pool.Cancel reads until the
// server closes the cancel connection), then ends the registration.
func (s *session) forwardCancel(ctx context.Context, conn *backend.Conn, g *cancelGroup) {
	ctx, done := context.WithTimeout(ctx, cancelTimeout)
	err := conn.Pool().Cancel(ctx, conn.PID, conn.SecretKey)
	done()
	if err != nil {
		s.log.Warn("forwarding cancel request failed", "err", err)
	}
	s.mu.Lock()
	if err != nil {
		g.failed = true
	}
	g.n--
	if g.n == 0 {
		close(g.done)
	}
	s.mu.Unlock()
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
