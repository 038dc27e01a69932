package wan

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// tcpReadSize is how much one read of a TCP connection takes at most; what a
// read returns is one chunk, delayed as a unit.
const tcpReadSize = 16 << 10

// smallChunk is the size below which a chunk is copied out of the read
// buffer into a smaller pooled one, so that a queue of small messages does
// not pin 16 KiB each.
const smallChunk = 2 << 10

// acceptLoop accepts TCP clients until the listener closes.
func (r *Relay) acceptLoop() {
	for {
		c, err := r.ln.AcceptTCP()
		if err != nil {
			if r.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			r.logger.Warn("wan: accept failed", "err", err)
			if !r.sleepUntil(r.now() + int64(acceptRetry)) {
				return
			}
			continue
		}
		accepted := r.now()
		r.c.tcpConnsTotal.Add(1)
		r.wg.Go(func() { r.handleTCP(c, accepted) })
	}
}

// handleTCP dials the upstream for one accepted client and relays both
// directions until both have ended.
//
// The handshake: the relay accepts at once, but a real client's connect
// returns only after one round trip (SYN, SYN-ACK), and the server accepts
// half a round trip later (ACK). So client bytes count as sent no earlier
// than accepted+RTT and server bytes no earlier than accepted+1.5·RTT, each
// then delayed by the one-way delay: a client that writes as soon as it is
// connected sees its first bytes arrive one full RTT later than on an
// established connection.
func (r *Relay) handleTCP(client *net.TCPConn, accepted int64) {
	r.c.tcpConns.Add(1)
	defer r.c.tcpConns.Add(-1)
	var d net.Dialer
	c, err := d.DialContext(r.ctx, "tcp", r.cfg.Upstream)
	if err != nil {
		r.c.tcpDialErrors.Add(1)
		r.logger.Debug("wan: upstream dial failed", "client", client.RemoteAddr().String(), "err", err)
		// The client learns of the refusal when its handshake would have.
		r.sleepUntil(accepted + r.rtt)
		_ = client.SetLinger(0)
		_ = client.Close()
		return
	}
	upstream := c.(*net.TCPConn)
	tc := &tcpConn{client: client, upstream: upstream, done: make(chan struct{})}
	if !r.track(tc) {
		tc.abort()
		return
	}
	defer r.untrack(tc)
	up := newPipe(r, tc, client, upstream, accepted+r.rtt, &r.c.tcpUp)
	down := newPipe(r, tc, upstream, client, accepted+r.rtt+r.oneWay, &r.c.tcpDown)
	var wg sync.WaitGroup
	wg.Go(up.read)
	wg.Go(up.write)
	wg.Go(down.read)
	down.write()
	wg.Wait()
	tc.abort()
}

// track registers a connection so that Close can cut it; false means the
// relay is closing.
func (r *Relay) track(tc *tcpConn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[tc] = struct{}{}
	return true
}

func (r *Relay) untrack(tc *tcpConn) {
	r.mu.Lock()
	delete(r.conns, tc)
	r.mu.Unlock()
}

// tcpConn is one relayed connection: the accepted client and the dialed
// upstream. Four goroutines serve it, a reader and a writer per direction;
// the connection ends when both directions delivered their end of stream,
// or at once on any error or when the relay closes.
type tcpConn struct {
	client, upstream *net.TCPConn
	done             chan struct{} // closed by abort
	abortOnce        sync.Once
	eofs             atomic.Int32 // directions whose end of stream was delivered
}

// abort closes both sockets, which ends every goroutine of the connection.
func (tc *tcpConn) abort() {
	tc.abortOnce.Do(func() {
		close(tc.done)
		_ = tc.client.Close()
		_ = tc.upstream.Close()
	})
}

// chunk is one read's worth of bytes waiting for its delivery time, or the
// end of the stream (buf nil).
type chunk struct {
	at  int64
	buf *[]byte
}

// pipe is one direction of a connection: the reader queues each chunk with
// its delivery time, the writer (the direction's only timer) writes chunks
// when they are due. Delivery times never decrease, so a FIFO is the whole
// scheduler and jitter can delay bytes but never reorder them.
type pipe struct {
	r         *Relay
	tc        *tcpConn
	src, dst  *net.TCPConn
	readSrc   func([]byte) (int, time.Duration, error) // src.Read, with the kernel's receive age
	notBefore int64                                    // end of the emulated handshake for this direction
	cnt       *tcpCounters

	mu    sync.Mutex
	q     []chunk
	head  int
	bytes int   // bytes queued
	last  int64 // delivery time of the last chunk queued

	ready chan struct{} // the queue became non-empty
	space chan struct{} // the queue shrank
}

func newPipe(r *Relay, tc *tcpConn, src, dst *net.TCPConn, notBefore int64, cnt *tcpCounters) *pipe {
	return &pipe{
		r: r, tc: tc, src: src, dst: dst, notBefore: notBefore, cnt: cnt,
		readSrc: stampedTCPReader(src),
		ready:   make(chan struct{}, 1),
		space:   make(chan struct{}, 1),
	}
}

// read queues what src sends. An end of stream is queued too, so that the
// half-close reaches dst after the same delay; any other error aborts the
// connection.
func (p *pipe) read() {
	buf := getBuf(tcpReadSize)
	defer func() {
		if buf != nil {
			putBuf(buf)
		}
	}()
	for {
		n, age, err := p.readSrc((*buf)[:tcpReadSize])
		if n > 0 {
			var c *[]byte
			if n <= smallChunk {
				c = getBuf(n)
				copy(*c, (*buf)[:n])
			} else {
				c, buf = buf, getBuf(tcpReadSize)
				*c = (*c)[:n]
			}
			if !p.push(c, age) {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				p.push(nil, 0)
			} else {
				p.tc.abort()
			}
			return
		}
	}
}

// push queues one chunk (nil: end of stream) that the kernel received age
// ago, waiting while the direction already holds MaxQueueBytes. False means
// the connection was aborted.
func (p *pipe) push(c *[]byte, age time.Duration) bool {
	n := 0
	if c != nil {
		n = len(*c)
	}
	stalled := false
	for {
		p.mu.Lock()
		if p.bytes == 0 || p.bytes+n <= p.r.cfg.MaxQueueBytes {
			break
		}
		p.mu.Unlock()
		if !stalled {
			stalled = true
			p.cnt.stalls.Add(1)
		}
		select {
		case <-p.space:
		case <-p.tc.done:
			if c != nil {
				putBuf(c)
			}
			return false
		}
	}
	at := max(p.r.now()-int64(age), p.notBefore) + p.r.delay()
	at = max(at, p.last)
	p.last = at
	wasEmpty := p.head == len(p.q)
	p.q = append(p.q, chunk{at: at, buf: c})
	p.bytes += n
	p.mu.Unlock()
	if wasEmpty {
		notify(p.ready)
	}
	return true
}

// write delivers chunks when due, all due chunks in one writev.
func (p *pipe) write() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var (
		due  []*[]byte
		bufs net.Buffers
	)
	defer func() {
		// Aborted: give back what is still queued.
		p.mu.Lock()
		for _, c := range p.q[p.head:] {
			if c.buf != nil {
				putBuf(c.buf)
			}
		}
		p.q, p.head, p.bytes = nil, 0, 0
		p.mu.Unlock()
	}()
	for {
		p.mu.Lock()
		if p.head == len(p.q) {
			p.mu.Unlock()
			select {
			case <-p.ready:
				continue
			case <-p.tc.done:
				return
			}
		}
		now := p.r.now()
		if wait := p.q[p.head].at - now; wait > 0 {
			p.mu.Unlock()
			timer.Reset(time.Duration(wait))
			select {
			case <-timer.C:
				continue
			case <-p.tc.done:
				return
			}
		}
		eof := false
		size := 0
		var lateSum, lateMax int64
		for p.head < len(p.q) && p.q[p.head].at <= now {
			c := p.q[p.head]
			p.q[p.head] = chunk{}
			p.head++
			if c.buf == nil {
				eof = true
				break
			}
			due = append(due, c.buf)
			size += len(*c.buf)
			lateSum += now - c.at
			lateMax = max(lateMax, now-c.at)
		}
		if p.head == len(p.q) {
			p.q, p.head = p.q[:0], 0
		} else if p.head > 64 && p.head > len(p.q)/2 {
			p.q = p.q[:copy(p.q, p.q[p.head:])]
			p.head = 0
		}
		p.bytes -= size
		p.mu.Unlock()
		notify(p.space)

		var err error
		if len(due) == 1 {
			_, err = p.dst.Write(*due[0])
		} else if len(due) > 1 {
			bufs = bufs[:0]
			for _, b := range due {
				bufs = append(bufs, *b)
			}
			w := bufs
			_, err = w.WriteTo(p.dst) // one writev
		}
		if len(due) > 0 {
			p.cnt.chunks.Add(uint64(len(due)))
			p.cnt.bytes.Add(uint64(size))
			p.cnt.late.add(lateSum, lateMax)
			for i, b := range due {
				putBuf(b)
				due[i] = nil
			}
			due = due[:0]
		}
		if err != nil {
			p.tc.abort()
			return
		}
		if eof {
			_ = p.dst.CloseWrite()
			if p.tc.eofs.Add(1) == 2 {
				p.tc.abort()
			}
			return
		}
	}
}

// notify wakes the receiver of a one-slot channel without blocking; a wake-up
// already pending is enough.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
