package quicwire

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// coalesceAfterRead is how soon after a stream last read data a Write of it
// is queued for the Coalescer. A session answering what it just read (a
// client sending its next query on the reply to the last one) writes while
// the sessions woken by the same packet do, and their messages can share a
// packet; a write after a pause (a client sending at its own pace) has no
// company to wait for and goes to quic-go at once, saving the hand-off.
const coalesceAfterRead = time.Millisecond

// coalesceMax is the most a stream holds back for its connection's
// Coalescer: a query or two. A larger write (COPY data, a big batch) goes to
// quic-go at once, where it fills whole packets anyway.
const coalesceMax = 4 << 10

// Coalescer makes one QUIC connection's packets carry several streams'
// messages. Without it every session's Write wakes quic-go's send loop on
// its own, and with many sessions over few connections each query still
// leaves in a packet of its own: the peer then pays its per-packet cost
// (receive, decrypt, acknowledge, wake the connection's goroutine) once per
// query. With it, a small Write is queued; one goroutine per connection
// hands every queued stream's bytes to quic-go together, after letting the
// other runnable goroutines (the sessions that the same incoming packet
// woke up) queue theirs. The delay is one turn of the scheduler, not a
// timer, and only a Write soon after the stream read something waits for it
// (coalesceAfterRead).
type Coalescer struct {
	ctx     context.Context
	epoch   time.Time // streams' read times are monotonic durations since it
	wake    chan struct{}
	mu      sync.Mutex
	pending []*Conn // streams with queued bytes, in the order they queued
	spare   []*Conn // the previous batch's slice, reused; only run touches it
}

// NewCoalescer starts the goroutine that flushes the queued writes of one
// QUIC connection's streams; it ends with ctx, normally the connection's
// context. Streams get it through NewCoalescingConn.
func NewCoalescer(ctx context.Context) *Coalescer {
	co := &Coalescer{ctx: ctx, epoch: time.Now(), wake: make(chan struct{}, 1)}
	go co.run()
	return co
}

func (co *Coalescer) run() {
	for {
		select {
		case <-co.wake:
		case <-co.ctx.Done():
			return
		}
		// Let the goroutines made runnable with this one (typically by the
		// packet that carried several replies) queue their writes too.
		runtime.Gosched()
		co.mu.Lock()
		batch := co.pending
		co.pending = co.spare[:0]
		co.mu.Unlock()
		for _, c := range batch {
			c.flushQueued()
		}
		clear(batch)
		co.spare = batch
	}
}

// add queues c for the next flush; c.queued was false and is now true.
func (co *Coalescer) add(c *Conn) {
	co.mu.Lock()
	co.pending = append(co.pending, c)
	co.mu.Unlock()
	select {
	case co.wake <- struct{}{}:
	default:
	}
}

// stopped reports whether the flushing goroutine has ended (or is about to).
func (co *Coalescer) stopped() bool { return co.ctx.Err() != nil }

// NewCoalescingConn wraps str like NewConn, except that small writes are
// handed to quic-go by co together with the other streams' (see
// Coalescer). Write returns once the bytes are queued, as a socket write
// returns once they are in the socket buffer; a failure to send them is
// returned by the next Write, and Close and CloseWrite send what is queued
// first.
func NewCoalescingConn(str *quic.Stream, conn *quic.Conn, co *Coalescer, onClose func()) *Conn {
	c := NewConn(str, conn, onClose)
	c.coalescing = &coalescing{co: co}
	return c
}

// coalescing is a stream's side of a Coalescer.
type coalescing struct {
	co       *Coalescer
	pmu      sync.Mutex   // guards the fields below; never held across a blocking call
	pend     []byte       // bytes written but not yet handed to quic-go
	queued   bool         // the stream is in co's pending list
	flushing bool         // a goroutine writes pend with a blocking Write
	werr     error        // a flush of pend failed; returned by Write
	lastRead atomic.Int64 // when Read last returned data, as time since co.epoch
}

// queue appends p to the bytes waiting for the coalescer; wmu is held and
// the send side is open. It reports false, queuing nothing, when p must be
// written at once instead.
func (c *Conn) queue(p []byte) bool {
	if c.coalescing == nil || c.co.stopped() {
		return false
	}
	if last := c.lastRead.Load(); last == 0 || time.Since(c.co.epoch) > time.Duration(last)+coalesceAfterRead {
		return false
	}
	c.pmu.Lock()
	if c.flushing || len(c.pend)+len(p) > coalesceMax {
		c.pmu.Unlock()
		return false
	}
	c.pend = append(c.pend, p...)
	enqueue := !c.queued
	c.queued = true
	c.pmu.Unlock()
	if enqueue {
		c.co.add(c)
	}
	return true
}

// takePending removes and returns the queued bytes; wmu is held, so no
// write of this stream can overtake them.
func (c *Conn) takePending() []byte {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if len(c.pend) == 0 {
		return nil
	}
	p := c.pend
	c.pend = nil
	return p
}

// pendingErr returns the error a flush of queued bytes met; it sticks,
// since those bytes are lost and the session cannot go on.
func (c *Conn) pendingErr() error {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return c.werr
}

// flushQueued runs on the coalescer's goroutine: it hands the stream's
// queued bytes to quic-go without blocking. When the stream cannot take them
// at once (flow control, or a large Write of the session under way), a
// goroutine of its own writes them, so the other streams never wait.
func (c *Conn) flushQueued() {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	c.queued = false
	if len(c.pend) == 0 || c.flushing {
		return
	}
	err := c.str.TryWriteAll(c.pend)
	switch {
	case err == nil:
		c.pend = c.pend[:0]
		if cap(c.pend) > coalesceMax {
			c.pend = nil
		}
	case errors.Is(err, quic.ErrWouldBlock):
		c.flushing = true
		go c.flushBlocking()
	default:
		c.werr = err
		c.pend = nil
	}
}

// flushBlocking writes the queued bytes that quic-go could not take at once,
// waiting for flow control like any Write, in the stream's write order.
func (c *Conn) flushBlocking() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	p := c.takePending()
	var err error
	if len(p) > 0 && !c.sendDone {
		_, err = c.str.Write(p)
	}
	c.pmu.Lock()
	c.flushing = false
	if err != nil && c.werr == nil {
		c.werr = err
	}
	c.pmu.Unlock()
}

// sendQueued hands the queued bytes to quic-go before Close sends FIN,
// without blocking (Close never waits for the peer); wmu is held. It reports
// false when quic-go could not take them at once or the stream failed: the
// send side is then reset, as when Close interrupts a Write.
func (c *Conn) sendQueued() bool {
	if c.coalescing == nil {
		return true
	}
	if c.pendingErr() != nil {
		return false
	}
	p := c.takePending()
	return len(p) == 0 || c.str.TryWriteAll(p) == nil
}
