package pooler

import (
	"context"
	"time"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
)

// Ending a session: draining at the next safe point, killing it at once,
// and cleaning up its server connection after the owner loop returned.

// cancelOnServer asks the server to cancel what conn runs; used when a
// connection is dropped mid-request, since closing it does not stop the
// query on the server (a multi-statement Query ending in COMMIT would even
// commit once its statement finished). Shutdown waits for these cancels,
// so a forced exit does not leave such queries running.
func (p *Pooler) cancelOnServer(conn *backend.Conn) {
	p.cancelWG.Add(1)
	go func() {
		defer p.cancelWG.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Pool().Cancel(ctx, conn.PID, conn.SecretKey)
	}()
}

func (s *session) isKilled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killed
}

// drain asks the session to end at its next safe point: now if idle,
// after the current transaction otherwise.
func (s *session) drain() {
	s.mu.Lock()
	s.draining = true
	idle := (s.att == nil || s.att.released) && !s.closing
	s.mu.Unlock()
	if idle {
		// What PostgreSQL says to idle sessions at a fast shutdown.
		pe := fatal(pgproto.CodeAdminShutdown, "terminating connection because the pooler is shutting down", ErrShuttingDown)
		_ = s.writeRaw(pe.encode(nil))
		s.closeClient()
	}
}

// kill ends the session at once. A server connection in use is closed, so it
// is destroyed rather than returned to the pool in an unknown state.
func (s *session) kill() {
	s.mu.Lock()
	s.killed = true
	a := s.att
	if a != nil && !a.released {
		if a.pending() > 0 {
			s.p.cancelOnServer(a.conn)
		}
		_ = a.conn.NetConn().Close()
	}
	s.mu.Unlock()
	s.closeClient()
}

// closeClient closes the client stream once. It may run on any goroutine
// (the startup timer, a shutdown), hence rwc is read under s.mu.
func (s *session) closeClient() {
	s.mu.Lock()
	already := s.closing
	s.closing = true
	rwc := s.rwc
	s.mu.Unlock()
	if !already {
		_ = rwc.Close()
	}
}

// closeRiderLocked ends the session's part in a request on a shared server
// connection (pipeline.go) when its client leaves: a request cut short
// before its Sync is ended with a failing message and a Sync, so it rolls
// back without touching the requests behind it; its replies are read in
// turn and dropped by the relay, and the connection is left to the other
// clients on it. It reports false when the session was killed: the caller
// then drops the connection as for any request still running. s.mu must be
// held.
func (s *session) closeRiderLocked(a *attachment) bool {
	rd := a.rider
	a.clientGone.Store(true)
	a.closing = true
	if rd.Writing() {
		if n := len(a.queue); !s.killed && a.pending() > 0 && a.queue[n-1].kind != eSync && a.queue[n-1].kind != eQuery {
			s.abortWriteLocked(a)
		}
		if err := a.conn.W.Flush(); err != nil {
			_ = a.conn.NetConn().Close() // the reader finds out and fails the lane
		}
		rd.EndWrite()
		rd.DoneWriting(s.p.laneLimits())
	}
	if s.killed {
		return false
	}
	if s.pinned {
		// The client's identity moved while its request was on the lane,
		// and the client left before the answer took the connection off
		// the lane (riderLeftOpen): a reset could not go ahead of the
		// requests behind, so the connection is dropped once they have
		// been failed, never lent on under that identity.
		a.destroy = true
	}
	if a.pending() == 0 {
		// Nothing of this client's is on the connection: step off the
		// lane once the clients ahead have read their replies.
		a.released = true
		s.busy.Store(false)
		go s.releaseConn(a.conn, rd, s.pinned)
		return true
	}
	if !a.relaying {
		s.startRelayLocked(a)
	}
	return true
}

// close ends the session after the owner loop returned: any attached server
// connection is cleaned up (rolled back, or destroyed when that is not
// possible), the relay is waited for and the client stream is closed.
func (s *session) close() {
	// From here on the session cancels nothing; in session mode its server's
	// process ID may be handed to the next client of that server at once.
	s.p.dropKey(s)
	if s.wlocked {
		_ = s.wconn.W.Flush()
		s.wlocked = false
		s.wconn = nil
		s.wmu.Unlock()
	}
	s.mu.Lock()
	a := s.att
	if a != nil && a.released && !a.relaying {
		a = nil // returned inline; no goroutine to wait for
	}
	if a != nil && !a.released && a.rider != nil && s.closeRiderLocked(a) {
		if a.released {
			a = nil
		}
	} else if a != nil && !a.released {
		s.abandonLocked(a)
	}
	s.mu.Unlock()
	if a != nil {
		s.awaitRelayEnd(a)
	}
	s.closeClient()
	s.endPins()
	if s.counted {
		s.p.active.Add(-1)
		s.p.m.clients.Dec()
	}
}

// abandonLocked lets go of a's server connection for a client that left
// while it was attached: a request still running is cancelled and the
// connection dropped; otherwise the relay (started if need be) returns it
// once undoLocked's queries have run. s.mu must be held.
func (s *session) abandonLocked(a *attachment) {
	a.clientGone.Store(true)
	a.closing = true
	if !a.relaying {
		s.startRelayLocked(a)
	}
	sessionLike := s.p.cfg.Mode == ModeSession || s.pinned
	if s.pinned {
		a.identity = true
	}
	switch {
	case a.pending() > 0 || s.killed || (sessionLike && a.status != 'I') || !a.syncPoint:
		// A request is still running: cancel it and drop the connection.
		// A session-mode client that left inside a transaction loses
		// its server connection too (as with PgBouncer): whatever it
		// built up is not worth untangling on an abnormal exit. So does
		// a client that left inside an extended-protocol request, all
		// of it answered but no Sync sent (Execute and Flush, a
		// suspended portal): its implicit transaction is open, which a
		// ROLLBACK cannot end and the next borrower's Sync would
		// commit; closing the connection rolls it back, as PostgreSQL
		// does for a client that disconnects.
		conn := a.conn
		if a.pending() > 0 {
			s.p.cancelOnServer(conn)
		}
		a.destroy = true
		_ = conn.NetConn().Close()
	case s.processBound:
		// A call whose effect stays with the server process ran
		// (setseed, pg_backup_start, a temporary replication slot,
		// dblink_connect): no reset query undoes it, and closing the
		// connection ends the process with all of it.
		a.destroy = true
		_ = a.conn.NetConn().Close()
	default:
		s.undoLocked(a, sessionLike)
	}
}

// undoLocked rolls back (and, in session mode or when pinned, resets)
// quietly what the leaving client left on a's server, which is idle, in
// a transaction, or in session mode; the relay returns the connection
// once the server says it is idle. s.mu must be held.
func (s *session) undoLocked(a *attachment, sessionLike bool) {
	a.st.stmts.DropUnnamed() // simple queries destroy the unnamed statement
	var q []byte
	if a.skipping {
		// The server ignores everything but Sync after an error
		// in a pipeline: end that state first.
		q = append(q, 'S', 0, 0, 0, 4)
		s.push(a, entry{kind: eSync, quiet: true})
	}
	if a.status != 'I' {
		q = appendQuery(q, "ROLLBACK")
		s.push(a, entry{kind: eQuery, quiet: true})
	}
	if sessionLike {
		q = appendQuery(q, s.p.cfg.ResetQuery)
		s.push(a, entry{kind: eQuery, quiet: true, reset: true})
		q = s.appendStateReset(a, q, s.p.cfg.ResetQuery)
	}
	if len(q) == 0 {
		// Nothing to undo: wake the relay so it returns the connection.
		_ = a.conn.NetConn().SetReadDeadline(time.Now())
	} else {
		_ = a.conn.NetConn().SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, err := a.conn.W.Write(q)
		if err == nil {
			err = a.conn.W.Flush()
		}
		_ = a.conn.NetConn().SetWriteDeadline(time.Time{}) // the next borrower must not inherit it
		if err != nil {
			a.destroy = true
			_ = a.conn.NetConn().Close()
		}
	}
}

// awaitRelayEnd waits for a's relay to give the connection back, at most
// 10 s, after which the connection is closed (unless other clients share
// it, which is not this client's to close) and the relay then ends.
func (s *session) awaitRelayEnd(a *attachment) {
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		if a.rider == nil { // a shared connection is not this client's to close
			s.mu.Lock()
			a.destroy = true
			s.mu.Unlock()
			_ = a.conn.NetConn().Close()
		}
		<-a.done
	}
}
