package quicclient

import (
	"context"
	"net"
	"sync/atomic"
	"time"
)

// followMigrateTimeout bounds one move FollowRoute makes: a path
// validation is one round trip, retried by quic-go with backoff.
const followMigrateTimeout = 5 * time.Second

// MoveStats counts the moves FollowRoute made.
type MoveStats struct {
	// Moves counts moves every connection made; Failures moves at least
	// one connection could not make (it stays on its old path).
	Moves, Failures int64
	// LastDuration is how long the last move took, from noticing the new
	// address to every connection switched (or failed to).
	LastDuration time.Duration
}

// moveCounters is the Dialer's MoveStats, updated by FollowRoute.
type moveCounters struct {
	moves, failures atomic.Int64
	last            atomic.Int64 // nanoseconds
}

// MoveStats returns the moves FollowRoute made so far.
func (d *Dialer) MoveStats() MoveStats {
	return MoveStats{Moves: d.moves.moves.Load(), Failures: d.moves.failures.Load(),
		LastDuration: time.Duration(d.moves.last.Load())}
}

// FollowRoute keeps the Dialer's connections on the local address the
// kernel would pick to reach the pooler, until ctx ends: every period it
// asks the kernel for that address (connect(2) on a UDP socket, which sends
// nothing) and, when it is not the address the Dialer's socket is bound
// to, moves every connection there with Migrate, a validated move
// (PATH_CHALLENGE and PATH_RESPONSE before any data takes the new path).
// The first check after the first dial moves the connections from the
// socket bound to any address to one bound to the route's source, so each
// later change of that source is seen; it replaces LocalAddr's address.
//
// Without it a socket bound to any address lets the kernel pick the new
// source by itself, which the pooler sees as a NAT rebinding: it learns of
// the new address only from the client's next packet. With it, a move
// made before the old address disappears costs one round trip; an address
// removed before the next check makes the writes on the socket bound to it
// fail, and quic-go closes a connection whose write fails.
func (d *Dialer) FollowRoute(ctx context.Context, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		d.followOnce(ctx)
	}
}

// followOnce makes one FollowRoute check.
func (d *Dialer) followOnce(ctx context.Context) {
	d.mu.Lock()
	if d.closed || d.udp == nil {
		d.mu.Unlock()
		return
	}
	bound := d.udp.LocalAddr().(*net.UDPAddr)
	var remote *net.UDPAddr
	for _, cc := range d.slots {
		if cc != nil && cc.conn.Context().Err() == nil {
			remote, _ = cc.conn.RemoteAddr().(*net.UDPAddr)
			break
		}
	}
	d.mu.Unlock()
	if remote == nil {
		return // nothing live to move; the next dial uses the current socket
	}
	src, err := routeSource(remote)
	if err != nil {
		d.log.Debug("no route to the pooler for now", "pooler", remote.String(), "err", err)
		return
	}
	if src.Equal(bound.IP) {
		return
	}
	began := time.Now()
	mctx, cancel := context.WithTimeout(ctx, followMigrateTimeout)
	err = d.Migrate(mctx, &net.UDPAddr{IP: src})
	cancel()
	took := time.Since(began)
	d.moves.last.Store(int64(took))
	if err != nil {
		d.moves.failures.Add(1)
		d.log.Warn("the route to the pooler has a new source address; not every connection moved",
			"from", bound.IP.String(), "to", src.String(), "took", took, "err", err)
		return
	}
	d.moves.moves.Add(1)
	d.log.Info("the route to the pooler has a new source address; connections moved",
		"from", bound.IP.String(), "to", src.String(), "took", took)
}

// routeSource returns the source address the kernel would use to send to
// addr: a connected UDP socket's local address (connecting sends nothing).
func routeSource(addr *net.UDPAddr) (net.IP, error) {
	c, err := net.DialUDP("udp", nil, addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP, nil
}
