package quicclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/quicwire"
)

// retiredSocket is a UDP socket and its transport that Migrate moved the
// connections away from. It stays open until Close: quic-go keeps a
// migrated connection's IDs registered with the transport that dialed it,
// and closing that transport would end the connection.
type retiredSocket struct {
	tr  *quic.Transport
	udp *net.UDPConn
}

// Migrate moves every live connection to a new UDP socket bound to local
// (nil: DialerConfig.LocalAddr, or any address; a new ephemeral port
// either way), as a client does when its network changed: for each
// connection quic-go probes the new path (PATH_CHALLENGE, answered by the
// pooler with PATH_RESPONSE) and, once validated, switches to it. The
// sessions on them go on without noticing; connections dialed afterwards
// use the new socket too. It returns when every connection switched or
// failed to; a connection that could not (the pooler disabled active
// migration, the probe was not answered before ctx ended) stays on its old
// path and is named in the error. A connection still being dialed while
// Migrate runs stays on the old socket.
//
// Behind several replicas the new path must reach the same replica: a
// balancer hashing the 4-tuple sends it elsewhere, one routing by
// connection ID (the replicas' ServerID, internal/quiclb) does not.
func (d *Dialer) Migrate(ctx context.Context, local *net.UDPAddr) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return ErrDialerClosed
	}
	if d.tr == nil {
		d.mu.Unlock()
		return nil // nothing dialed yet: the first dial binds a socket anyway
	}
	if local == nil {
		local = d.cfg.LocalAddr
	}
	udp, err := d.bindUDP(local)
	if err != nil {
		d.mu.Unlock()
		return err
	}
	tr := &quic.Transport{Conn: quicwire.PacketConn(udp)}
	d.retired = append(d.retired, retiredSocket{d.tr, d.udp})
	d.tr, d.udp = tr, udp
	var conns []*quic.Conn
	for _, cc := range d.slots {
		if cc != nil && cc.conn.Context().Err() == nil {
			conns = append(conns, cc.conn)
		}
	}
	d.mu.Unlock()

	// The connections probe at once: the move takes one round trip, not
	// one per connection.
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			if err := movePath(ctx, c, tr); err != nil {
				errs[i] = fmt.Errorf("quicclient: migrate the connection from %s: %w", c.LocalAddr(), err)
			}
		})
	}
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	d.log.Info("QUIC connections migrated to a new local address", "local", udp.LocalAddr().String(),
		"conns", len(conns), "failed", failed)
	return errors.Join(errs...)
}

// movePath probes a path of c over tr and switches c to it.
func movePath(ctx context.Context, c *quic.Conn, tr *quic.Transport) error {
	p, err := c.AddPath(tr)
	if err != nil {
		return err
	}
	if err := p.Probe(ctx); err != nil {
		_ = p.Close()
		return fmt.Errorf("probe: %w", err)
	}
	if err := p.Switch(); err != nil {
		_ = p.Close()
		return fmt.Errorf("switch: %w", err)
	}
	return nil
}

// closeRetired closes the sockets Migrate left, at Close after every
// connection was closed.
func (d *Dialer) closeRetired() {
	d.mu.Lock()
	retired := d.retired
	d.retired = nil
	d.mu.Unlock()
	for _, r := range retired {
		_ = r.tr.Close()
		_ = r.udp.Close()
	}
}
