package pooler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgquic/pgquic/internal/pgproto"
)

// PAUSE, RESUME and KILL for the admin console. A hold on a database (or on
// every database) makes its logged-in sessions wait before they borrow a
// server connection, so no new transaction starts; transactions already
// running finish normally. A login is not held (it would meet the startup
// timeout): it may borrow a server connection to learn the server's
// parameters, and its first transaction then waits. The check on the hot
// path is one atomic load while nothing is held.

// ErrAlreadyPaused reports a PAUSE or KILL of what is already held.
var ErrAlreadyPaused = errors.New("already paused")

// ErrNotPaused reports a RESUME of what is not held.
var ErrNotPaused = errors.New("not paused")

// errKilledByAdmin is the cause of a wait ended by KILL.
var errKilledByAdmin = errors.New("killed by the admin console")

// pauseGate records which client databases are held. Its zero value holds
// nothing.
type pauseGate struct {
	on atomic.Bool // something is held, or the gate was opened for good

	mu     sync.Mutex
	all    bool
	dbs    map[string]bool
	closed bool          // the pooler is shutting down: nothing is held any more
	lifted chan struct{} // closed (and replaced) whenever a hold is lifted
}

// holds reports whether db is held now and, if so, a channel closed when a
// hold is next lifted.
func (g *pauseGate) holds(db string) (bool, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || (!g.all && !g.dbs[db]) {
		return false, nil
	}
	if g.lifted == nil {
		g.lifted = make(chan struct{})
	}
	return true, g.lifted
}

// hold holds db ("" for every database).
func (g *pauseGate) hold(db string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.closed:
		return ErrShuttingDown
	case g.all:
		return ErrAlreadyPaused
	case db == "":
		g.all = true
	case g.dbs[db]:
		return ErrAlreadyPaused
	default:
		if g.dbs == nil {
			g.dbs = make(map[string]bool)
		}
		g.dbs[db] = true
	}
	g.on.Store(true)
	return nil
}

// release lifts the hold on db, or every hold when db is "".
func (g *pauseGate) release(db string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case db == "" && (g.all || len(g.dbs) > 0):
		g.all, g.dbs = false, nil
	case db != "" && g.dbs[db]:
		delete(g.dbs, db)
	default:
		return ErrNotPaused
	}
	g.liftLocked()
	return nil
}

// close lifts every hold for good; the pooler is shutting down.
func (g *pauseGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	g.liftLocked()
}

func (g *pauseGate) liftLocked() {
	if g.lifted != nil {
		close(g.lifted)
		g.lifted = nil
	}
	g.on.Store(g.all || len(g.dbs) > 0)
}

// paused reports whether db is held.
func (g *pauseGate) paused(db string) bool {
	held, _ := g.holds(db)
	return held
}

// waitGate waits while the session's database is held. The session counts
// as waiting for a server connection meanwhile (SHOW POOLS cl_waiting), and
// a CancelRequest, a vanished client or KILL ends the wait as they end a
// wait for a server connection. AcquireTimeout does not apply: a paused
// database is held as long as the operator wants.
func (s *session) waitGate(ctx context.Context) error {
	held, lifted := s.p.gate.holds(s.database)
	if !held {
		return nil
	}
	wctx, cancelWait := context.WithCancelCause(ctx)
	defer cancelWait(nil)
	s.mu.Lock()
	s.waitCancel = cancelWait
	s.waitSince = time.Now()
	s.mu.Unlock()
	s.waiting.Store(true)
	if s.peer.Probe != nil {
		s.markStuck()
	}
	defer func() {
		s.waiting.Store(false)
		s.stuck.Store(0)
		s.mu.Lock()
		s.waitCancel = nil
		s.waitSince = time.Time{}
		s.mu.Unlock()
	}()
	for held {
		select {
		case <-lifted:
		case <-wctx.Done():
			switch cause := context.Cause(wctx); {
			case errors.Is(cause, errCanceledByClient):
				return pgerr(pgproto.CodeQueryCanceled, "canceling statement due to user request", cause)
			case errors.Is(cause, errKilledByAdmin):
				return fatal(pgproto.CodeAdminShutdown, "terminating connection due to administrator command", cause)
			}
			return fatal(pgproto.CodeAdminShutdown, "the pooler is shutting down", wctx.Err())
		}
		held, lifted = s.p.gate.holds(s.database)
	}
	s.mu.Lock()
	draining := s.draining
	s.mu.Unlock()
	if draining {
		return fatal(pgproto.CodeAdminShutdown, "the pooler is shutting down", ErrShuttingDown)
	}
	return nil
}

// pauseCheckEvery is how often Pause looks whether the transactions it
// waits for have ended.
const pauseCheckEvery = 10 * time.Millisecond

// Pause holds database (every database when it is ""): no session of it
// starts a new transaction until Resume. It returns once no session of it
// holds a server connection any more, i.e. running transactions have
// finished (in session mode: clients holding a connection have left), or
// with ctx's error, the hold staying in place. A database already held
// gives an error wrapping ErrAlreadyPaused.
func (p *Pooler) Pause(ctx context.Context, database string) error {
	if err := p.gate.hold(database); err != nil {
		if database == "" {
			return fmt.Errorf("pooler is %w", err)
		}
		return fmt.Errorf("database %s is %w", database, err)
	}
	t := time.NewTicker(pauseCheckEvery)
	defer t.Stop()
	for {
		if p.attached(database) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Resume lifts the hold of Pause or Kill on database, or every hold when it
// is "". Sessions waiting on it go on at once. Nothing held gives an error
// wrapping ErrNotPaused.
func (p *Pooler) Resume(database string) error {
	if err := p.gate.release(database); err != nil {
		if database == "" {
			return fmt.Errorf("pooler is %w", err)
		}
		return fmt.Errorf("database %s is %w", database, err)
	}
	return nil
}

// Paused reports whether database's new transactions are held.
func (p *Pooler) Paused(database string) bool { return p.gate.paused(database) }

// Kill holds database (every database when "") as Pause does, and ends all
// of its client sessions at once, console sessions excepted: their server
// connections are closed, never returned to the pool in an unknown state.
// It returns the number of sessions ended. The hold stays until Resume, as
// after PgBouncer's KILL.
func (p *Pooler) Kill(database string) int {
	_ = p.gate.hold(database) // already held is fine
	n := 0
	for _, s := range p.snapshotSessions() {
		if s.console != nil || (database != "" && s.database != database) {
			continue
		}
		s.mu.Lock()
		if s.waitCancel != nil {
			s.waitCancel(errKilledByAdmin)
		}
		s.mu.Unlock()
		s.kill()
		n++
	}
	return n
}

// attached counts the sessions of database ("" for all) holding a server
// connection.
func (p *Pooler) attached(database string) int {
	n := 0
	for _, s := range p.snapshotSessions() {
		if s.console != nil || (database != "" && s.database != database) {
			continue
		}
		s.mu.Lock()
		if s.currentLocked() != nil {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// snapshotSessions returns the sessions past login, those whose user,
// database and pool no longer change.
func (p *Pooler) snapshotSessions() []*session {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*session, 0, len(p.sessions))
	for _, s := range p.sessions {
		if s.listed.Load() {
			out = append(out, s)
		}
	}
	return out
}
