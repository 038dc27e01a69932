package pooler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/pooler/lanes"
)

// Lending a server connection to a session: the attachment (see relay.go)
// is made when a message needs a server and none is attached. A function
// named ...Locked is called with s.mu held and returns with it held; the
// caller takes and releases the lock, so both are visible where it is
// called.

// currentLocked returns the live attachment, or nil when no server
// connection is attached. s.mu must be held.
func (s *session) currentLocked() *attachment {
	if a := s.att; a != nil && !a.released {
		return a
	}
	return nil
}

// releaseConn gives back a connection borrowed by connect that the session
// will not use after all.
func (s *session) releaseConn(conn *backend.Conn, rd *lanes.Rider, destroy bool) {
	if rd == nil {
		if destroy {
			conn.Destroy()
		} else {
			conn.Release()
		}
		return
	}
	rd.EndWrite()
	rd.DoneWriting(s.p.laneLimits())
	rd.TakeTurn()
	rd.Leave(destroy, s.p.laneLimits())
}

// startRelayLocked starts the relay goroutine for a. s.mu must be held.
func (s *session) startRelayLocked(a *attachment) {
	a.relaying = true
	a.done = make(chan struct{})
	go s.relay(a)
}

// acquireConn borrows a server connection, bounded by AcquireTimeout. A
// request that may share one (b.ok) takes a free connection as the first
// of a lane, or, when none is free, a place on a busy connection's lane; the
// rider is returned with the connection.
func (s *session) acquireConn(ctx context.Context, b pipeBatch) (*backend.Conn, *lanes.Rider, error) {
	if s.p.gate.on.Load() && s.listed.Load() { // PAUSE or KILL holds some database (pause.go)
		if err := s.waitGate(ctx); err != nil {
			return nil, nil, err
		}
	}
	var lp *lanes.Pool
	if s.p.cfg.PipelineDepth > 1 && s.p.cfg.Mode == ModeTransaction {
		lp = lanesOf(s.pool)
	}
	// A free connection first, idle or not yet opened: a request written
	// behind another client's waits for it, however fast that one is
	// known to be. So a request shares a connection only on a full pool.
	if conn, err := s.pool.TryAcquire(ctx); err == nil {
		s.p.m.waitSeconds.ObserveZero()
		if b.ok && nearlyFull(s.pool) {
			return conn, lead(conn, s.newRider(b), b.key), nil
		}
		return conn, nil, nil
	}
	if b.ok && s.pool.Full() {
		if rd := lp.Join(s.newRider(b), b.key, s.p.laneLimits()); rd != nil {
			s.p.m.waitSeconds.ObserveZero()
			return rd.Lane().Conn(), rd, nil
		}
	}
	conn, rd, err := s.waitConn(ctx, lp, b)
	if err != nil {
		return nil, nil, err
	}
	if b.ok && rd == nil {
		rd = lead(conn, s.newRider(b), b.key)
	}
	return conn, rd, nil
}

// nearlyFull reports whether a connection just borrowed from pool should
// lead a lane, so that other clients' requests may be written behind its
// own once the pool is full: when a quarter of the pool (at least one
// connection) or less is left to lend. Only then can the pool fill before
// the request is answered. On a pool with room to spare a lane is
// bookkeeping every request pays (the lanes' lock four times, two clock
// reads, the turn's channel) for a place nobody is allowed to take: a
// request shares a connection only when none is free. Such a connection
// is attached as any request's that may not share one, and goes back to
// the pool at its release; as the pool fills, the connections borrowed
// from then on lead lanes, and at saturation every one does.
func nearlyFull(pool *backend.Pool) bool {
	return pool.Spare() <= laneSpare(pool)
}

// laneSpare is how many connections left to lend, or fewer, make pool
// nearly full (nearlyFull).
func laneSpare(pool *backend.Pool) int { return max(1, pool.Size()/4) }

// waitConn waits for a server connection, or a place on a lane, when none
// is free at once: bounded by AcquireTimeout, cancelled by a
// CancelRequest (cancelWait) or a vanished client, and counted as waiting
// meanwhile (Clients, the watcher).
func (s *session) waitConn(ctx context.Context, lp *lanes.Pool, b pipeBatch) (*backend.Conn, *lanes.Rider, error) {
	start := time.Now()
	tctx, cancel := context.WithTimeout(ctx, s.p.timeout(&s.p.tmo.acquire))
	defer cancel()
	actx, cancelWait := context.WithCancelCause(tctx)
	s.mu.Lock()
	s.waitCancel = cancelWait
	s.waitSince = start
	s.mu.Unlock()
	s.waiting.Store(true)
	if s.peer.Probe != nil {
		s.markStuck()
	}
	conn, rd, err := s.waitConnOrLane(actx, lp, b, cancelWait)
	if rd == nil && errors.Is(err, backend.ErrPoolClosed) && ctx.Err() == nil {
		// The pool source replaced its pools (a configuration reload)
		// since this session looked its pool up: use the new one.
		if np, perr := s.p.pools.Pool(ctx, s.database, s.user); perr == nil && np != s.pool {
			s.mu.Lock() // Clients reads it under mu
			s.pool = np
			s.mu.Unlock()
			conn, err = np.Acquire(actx)
		}
	}
	s.waiting.Store(false)
	s.stuck.Store(0)
	s.mu.Lock()
	s.waitCancel = nil
	s.waitSince = time.Time{}
	s.mu.Unlock()
	cancelWait(nil)
	s.p.m.waitSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		return nil, nil, s.acquireError(ctx, actx, err)
	}
	return conn, rd, nil
}

// waitConnOrLane waits for whichever comes first: a place on a busy
// connection's lane (a request that may share one, on a full pool) or a
// connection of the session's own.
func (s *session) waitConnOrLane(actx context.Context, lp *lanes.Pool, b pipeBatch, cancelWait context.CancelCauseFunc) (*backend.Conn, *lanes.Rider, error) {
	var conn *backend.Conn
	var rd *lanes.Rider
	var err error
	if b.ok && s.pool.Full() {
		rd, conn, err = s.waitOnLanes(actx, lp, b)
	}
	if rd == nil && err == nil {
		var w *lanes.Waiter
		switch {
		case b.ok:
			w = lp.Wait(s.newRider(b), b.key, cancelWait)
		case lp != nil:
			lp.WaitExclusive(1)
		}
		conn, err = s.pool.Acquire(actx)
		switch {
		case w != nil:
			if rd = lp.Unwait(w); rd != nil {
				if err == nil {
					conn.Release() // the place on the lane came first
				}
				conn, err = rd.Lane().Conn(), nil
			}
		case lp != nil:
			lp.WaitExclusive(-1)
		}
	}
	return conn, rd, err
}

// acquireError turns a failed wait for a server connection into what the
// client is told: 57014 for a CancelRequest, 53300 for AcquireTimeout or
// too many pools, 57P01 at shutdown, the server's own error for a refused
// login, 08006 otherwise.
func (s *session) acquireError(ctx, actx context.Context, err error) error {
	if errors.Is(context.Cause(actx), errCanceledByClient) {
		return pgerr(pgproto.CodeQueryCanceled, "canceling statement due to user request", err)
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		st := s.pool.Stat()
		return pgerr(pgproto.CodeTooManyConnections,
			fmt.Sprintf("no server connection became free within %s (pool of %d for database %q, user %q is busy)",
				s.p.timeout(&s.p.tmo.acquire), st.Total, s.database, s.user), err)
	}
	if ctx.Err() != nil {
		return fatal(pgproto.CodeAdminShutdown, "the pooler is shutting down", err)
	}
	var se *pgconn.PgError
	if errors.As(err, &se) {
		// The server refused the login (unknown role, database, too
		// many connections...): pass its own error on.
		return &PGError{Severity: "ERROR", Code: se.Code, Message: se.Message, Detail: se.Detail, Hint: se.Hint, Err: err}
	}
	if errors.Is(err, backend.ErrTooManyPools) {
		// The session's pool was retired while it idled and no new
		// one may be opened now.
		return pgerr(pgproto.CodeTooManyConnections, fmt.Sprintf("sorry, too many pools already: no pool for database %q user %q (max_pools)", s.database, s.user), err)
	}
	return pgerr(pgproto.CodeConnectionFailure, "could not connect to the server", err)
}

// startAttachmentLocked makes conn the session's server connection, shared
// with other clients' requests when rd is not nil, and, in session mode,
// starts its relay, which reads the attachment from then on. s.mu must be
// held.
func (s *session) startAttachmentLocked(conn *backend.Conn, rd *lanes.Rider) *attachment {
	st := stateOf(conn)
	a := s.att
	if a != nil && a.released && !a.relaying {
		// Reuse the previous transaction's attachment (and its queue's
		// memory): only the owner ever referenced it.
		*a = attachment{queue: a.queue[:0]}
	} else {
		a = &attachment{}
	}
	s.attGen++
	a.conn, a.st, a.status, a.gen, a.rider = conn, st, 'I', s.attGen, rd
	a.catalogAt = s.catalogAt // the catalog its first request was read by
	if !s.catalogRead && s.p.cfg.Mode == ModeTransaction {
		// The first message was not read by the catalog (a Sync, a
		// Describe, a Close): DDL before now cannot have misled its
		// reading, so it counts from now. s.catalogAt is an earlier
		// request's, maybe from before DDL long over, and would close a
		// connection for nothing (every new session's first Parse after
		// any DDL did, failing the requests behind it on a lane).
		a.catalogAt = s.p.catalogOf(conn.Pool()).mark()
	}
	a.syncPoint = true // an idle server, between requests
	s.att = a
	a.stampAttach = true // s.lastRequest: the clock read of the request it serves (noteRequest)
	if s.p.cfg.Mode == ModeSession {
		// The server may speak at any time (NOTIFY, a FATAL on shutdown):
		// in session mode a relay goroutine always listens.
		s.startRelayLocked(a)
	}
	s.busy.Store(true)
	return a
}

// errCanceledByClient is the cause of a wait cancelled by a CancelRequest.
var errCanceledByClient = errors.New("canceled by client request")

// cancelWait aborts a wait for a server connection (a CancelRequest that
// arrived while the request was still queued).
func (s *session) cancelWait() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waitCancel != nil {
		s.waitCancel(errCanceledByClient)
	}
}
