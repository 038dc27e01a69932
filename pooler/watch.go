package pooler

import (
	"context"
	"time"

	"github.com/pgquic/pgquic/backend"
)

// watchInterval is the watcher's tick. A session waiting on the server is
// probed once it has waited through a whole tick, so a client that left is
// noticed between one and two ticks after its request started, or after it
// left, whichever is later.
const watchInterval = 250 * time.Millisecond

// While a session's owner goroutine waits on the server (reading a query's
// replies inline, or waiting for a server connection) it does not read the
// client and cannot see it leave: without help a client that vanished during
// pg_sleep(30) would keep its server connection for the whole 30 seconds.
//
// One watcher goroutine per Pooler, running only while some session's peer
// has a Probe, helps. The owner marks itself stuck with the current epoch (a
// counter the watcher bumps at every tick) when it starts waiting and clears
// the mark when it stops: two atomic stores per request, no timer and no
// deadline on the hot path. At each tick the watcher probes the sessions
// whose mark is at least two epochs old, and for a client that is gone does
// what the session's own cleanup does for a running request: it marks the
// client gone, cancels the query on the server (registered like a client's
// CancelRequest, so the connection goes back to the pool only once the
// server has processed it), ends a wait for a server connection, and closes
// the client stream. The owner then reads the query's error and
// ReadyForQuery, and the connection goes back to the pool idle, or is rolled
// back by the session's cleanup inside a transaction. A session still waiting
// at a tick at least half an interval after that has its server connection
// closed (and so destroyed): the query did not stop.

// markStuck records that the owner is about to wait on the server.
func (s *session) markStuck() {
	s.stuck.Store(s.p.epoch.Load())
}

// startWatchLocked counts a session with a Probe and starts the watcher if
// none runs. p.mu must be held.
func (p *Pooler) startWatchLocked() {
	p.probed++
	if p.watchStop == nil {
		p.watchStop = make(chan struct{})
		go p.watch(p.watchStop)
	}
}

// stopWatchLocked uncounts a session with a Probe and stops the watcher when
// it was the last one. p.mu must be held.
func (p *Pooler) stopWatchLocked() {
	p.probed--
	if p.probed == 0 && p.watchStop != nil {
		close(p.watchStop)
		p.watchStop = nil
	}
}

// watch runs the watcher until stop is closed.
func (p *Pooler) watch(stop <-chan struct{}) {
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	var due []*session
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := p.epoch.Add(1)
		due = due[:0]
		p.mu.Lock()
		for _, s := range p.sessions {
			if s.peer.Probe == nil {
				continue
			}
			if m := s.stuck.Load(); m != 0 && now-m >= 2 {
				due = append(due, s)
			}
		}
		p.mu.Unlock()
		for i, s := range due {
			if err := s.peer.Probe(); err != nil {
				s.abandon(err)
			}
			due[i] = nil
		}
	}
}

// abandon frees what a session whose client is gone holds while its owner
// waits on the server; see the comment at the top of this file.
func (s *session) abandon(cause error) {
	s.cancelWait()
	s.mu.Lock()
	var conn *backend.Conn
	var g *cancelGroup
	if a := s.att; a != nil && !a.released {
		switch {
		case s.abandoned != a:
			s.abandoned, s.abandonAt = a, time.Now()
			a.clientGone.Store(true)
			conn, g = s.beginCancelLocked()
		case time.Since(s.abandonAt) >= watchInterval/2 && a.rider == nil:
			// (A request on a shared connection is left to finish: the
			// connection is not this client's to close.)
			// Still waiting a tick after the cancel: the request did not
			// stop. Drop the connection, as the session's cleanup does
			// for a request that is still running.
			a.destroy = true
			_ = a.conn.NetConn().Close()
		}
	}
	s.mu.Unlock()
	s.log.Debug("client gone while waiting on the server; cancelling its request", "err", cause)
	s.closeClient()
	if conn != nil {
		go s.forwardCancel(context.Background(), conn, g)
	}
}
