package wan

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
)

// udpLoop reads datagrams from clients and queues each on its client's flow.
func (r *Relay) udpLoop() {
	buf := make([]byte, maxRead)
	oob := make([]byte, stampOOB)
	for {
		n, from, age, err := readUDPStamped(r.udp, buf, oob)
		if err != nil {
			if r.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			r.logger.Debug("wan: udp read failed", "err", err)
			continue
		}
		r.c.udpUp.received.Add(1)
		if r.lose() {
			r.c.udpUp.lost.Add(1)
			continue
		}
		now := r.now()
		at := now - int64(age) + r.delay()
		for {
			f := r.flow(from)
			if f == nil || !f.push(buf[:n], at, false, now) {
				break
			}
			// The flow closed for idleness between lookup and push: the
			// next lookup opens a fresh one.
		}
	}
}

// flow returns the mapping of a client address, opening it if needed; nil
// when the datagram must be dropped (relay closing, too many flows, socket
// error).
func (r *Relay) flow(from netip.AddrPort) *udpFlow {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := r.flows[from]; f != nil {
		return f
	}
	if r.closed {
		return nil
	}
	if len(r.flows) >= r.cfg.MaxUDPFlows {
		r.c.udpFlowDrops.Add(1)
		return nil
	}
	up, err := net.DialUDP("udp", nil, r.upUDP)
	if err != nil {
		r.c.udpFlowDrops.Add(1)
		r.logger.Warn("wan: cannot open an upstream UDP socket", "client", from.String(), "err", err)
		return nil
	}
	_ = up.SetReadBuffer(udpSocketBuffer)
	_ = up.SetWriteBuffer(udpSocketBuffer)
	enableRxStamps(up)
	f := &udpFlow{r: r, client: from, up: up, wake: make(chan struct{}, 1), lastActive: r.now()}
	r.flows[from] = f
	r.c.udpFlows.Add(1)
	r.c.udpFlowsTotal.Add(1)
	r.wg.Go(f.readUpstream)
	r.wg.Go(f.schedule)
	return f
}

// udpFlow is the mapping of one client address to its own upstream socket,
// as a NAT keeps it: the upstream sees one peer per client. Two goroutines
// serve it: readUpstream, and schedule, the flow's only timer, which
// delivers both directions' datagrams from one heap ordered by delivery
// time (jitter may therefore reorder datagrams, as on a real path).
type udpFlow struct {
	r      *Relay
	client netip.AddrPort
	up     *net.UDPConn
	wake   chan struct{} // a datagram became the earliest

	mu         sync.Mutex
	closed     bool
	h          datagramHeap
	bytes      int
	seq        uint64
	lastActive int64 // relay clock of the last datagram either way
}

// readUpstream queues what the upstream sends back to the client.
func (f *udpFlow) readUpstream() {
	r := f.r
	buf := make([]byte, maxRead)
	oob := make([]byte, stampOOB)
	for {
		n, _, age, err := readUDPStamped(f.up, buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A connected UDP socket reports ICMP errors from earlier
			// sends (ECONNREFUSED when the upstream port is closed); the
			// socket stays usable.
			if !errors.Is(err, syscall.ECONNREFUSED) {
				r.logger.Debug("wan: upstream udp read failed", "client", f.client.String(), "err", err)
			}
			continue
		}
		r.c.udpDown.received.Add(1)
		if r.lose() {
			r.c.udpDown.lost.Add(1)
			continue
		}
		now := r.now()
		if f.push(buf[:n], now-int64(age)+r.delay(), true, now) {
			return // closed
		}
	}
}

// push queues a copy of one datagram for delivery at at. It returns true if
// the flow is closed (nothing queued); a full queue drops the datagram and
// counts it.
func (f *udpFlow) push(data []byte, at int64, down bool, now int64) (closed bool) {
	cnt := &f.r.c.udpUp
	if down {
		cnt = &f.r.c.udpDown
	}
	b := getBuf(len(data))
	copy(*b, data)
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		putBuf(b)
		return true
	}
	f.lastActive = now
	if f.bytes > 0 && f.bytes+len(data) > f.r.cfg.MaxQueueBytes {
		f.mu.Unlock()
		putBuf(b)
		cnt.queueDrops.Add(1)
		return false
	}
	f.seq++
	f.h.push(datagram{at: at, seq: f.seq, buf: b, down: down})
	f.bytes += len(data)
	earliest := f.h[0].seq == f.seq
	f.mu.Unlock()
	if earliest {
		notify(f.wake)
	}
	return false
}

// schedule delivers each datagram at its time and ends the flow once it has
// been idle for UDPIdleTimeout or the relay closes.
func (f *udpFlow) schedule() {
	r := f.r
	idle := int64(r.cfg.UDPIdleTimeout)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []datagram
	for {
		f.mu.Lock()
		now := r.now()
		for len(f.h) > 0 && f.h[0].at <= now {
			d := f.h.pop()
			f.bytes -= len(*d.buf)
			due = append(due, d)
		}
		wait := f.lastActive + idle - now
		if len(f.h) > 0 {
			wait = min(wait, f.h[0].at-now)
		} else if wait <= 0 && len(due) == 0 {
			f.closeLocked()
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		for i := range due {
			f.send(&due[i], now)
			putBuf(due[i].buf)
			due[i] = datagram{}
		}
		if len(due) > 0 {
			due = due[:0]
			continue // sending took time: look again before sleeping
		}
		timer.Reset(time.Duration(wait))
		select {
		case <-timer.C:
		case <-f.wake:
		case <-r.ctx.Done():
			f.mu.Lock()
			f.closeLocked()
			f.mu.Unlock()
			return
		}
	}
}

// closeLocked ends the flow: no more pushes, queued datagrams discarded, the
// upstream socket closed (which ends readUpstream) and the mapping removed.
// f.mu must be held; it takes r.mu after f.mu, the only place both are held.
func (f *udpFlow) closeLocked() {
	r := f.r
	f.closed = true
	for _, d := range f.h {
		putBuf(d.buf)
	}
	f.h, f.bytes = nil, 0
	_ = f.up.Close()
	r.mu.Lock()
	if r.flows[f.client] == f {
		delete(r.flows, f.client)
	}
	r.mu.Unlock()
	r.c.udpFlows.Add(-1)
}

// send writes one due datagram to its destination; now is when it was
// found due, for the lateness count.
func (f *udpFlow) send(d *datagram, now int64) {
	var err error
	cnt := &f.r.c.udpUp
	if d.down {
		cnt = &f.r.c.udpDown
		_, err = f.r.udp.WriteToUDPAddrPort(*d.buf, f.client)
	} else {
		_, err = f.up.Write(*d.buf)
	}
	if err != nil {
		cnt.writeErrors.Add(1)
		return
	}
	cnt.packets.Add(1)
	cnt.bytes.Add(uint64(len(*d.buf)))
	cnt.late.add(now-d.at, now-d.at)
}
