package wan

import (
	"container/heap"
	"math/rand/v2"
	"sort"
	"sync"
	"time"
)

// maxPacket is the largest IP packet the TUN devices carry (their MTU).
const maxPacket = 1500

// link is one direction of the packet-mode path: what a packet meets
// between the TUN device it left and the one it enters, in the order a real
// path applies it (as Mahimahi stacks its shells): random loss, burst loss
// (a Gilbert-Elliott chain), the bottleneck (a drop-tail queue of Queue
// bytes drained at Bandwidth), then the propagation delay RTT/2 ± jitter,
// then an optional reordering hold. Jitter never reorders: a packet's
// delivery time is at least its predecessor's (a real path's queues are
// FIFO); only Reorder lets later packets overtake.
//
// enqueue runs on the reading goroutine and run on the writing one; they
// share the heap under mu.
type link struct {
	cfg   Config
	write func([]byte) error
	rng   *rand.Rand // owned by enqueue's goroutine

	gilbertBad bool    // the burst chain's state
	enterBad   float64 // P(good -> bad) per packet
	leaveBad   float64 // P(bad -> good) per packet

	busyUntil time.Time // when the bottleneck finishes its current packet

	trace      []time.Duration // delivery opportunities of one period, or nil
	traceStart time.Time       // when the trace began: the first arrival
	nextOpp    int64           // index of the first opportunity not yet used
	inQueue    []queued        // packets waiting for or on the bottleneck, FIFO
	queued     int             // their bytes
	lastDue    time.Time       // latest in-order delivery time, for FIFO jitter

	mu     sync.Mutex
	due    dueHeap
	seq    uint64
	wake   chan struct{}
	free   [][]byte
	closed bool

	st LinkStats
}

// queued is a packet on the bottleneck: it leaves at done.
type queued struct {
	done time.Time
	size int
}

// LinkStats counts one direction of the packet-mode path. Received =
// Delivered + Lost + BurstLost + QueueDrops + those still on their way.
type LinkStats struct {
	Received   uint64 `json:"received"`
	Delivered  uint64 `json:"delivered"`
	Bytes      uint64 `json:"bytes"`
	Lost       uint64 `json:"lost"`
	BurstLost  uint64 `json:"burst_lost"`
	QueueDrops uint64 `json:"queue_drops"`
	Reordered  uint64 `json:"reordered"`
	// WriteErrors counts packets the receiving TUN device refused.
	WriteErrors uint64 `json:"write_errors"`
	// QueueDelay sums and bounds the time packets waited for the
	// bottleneck (transmission time included), Total/Delivered the mean.
	QueueDelay Lateness `json:"queue_delay"`
	// Late is the emulator's own timing error, as in relay mode.
	Late Lateness `json:"late"`
}

func newLink(cfg Config, seed uint64, trace []time.Duration, write func([]byte) error) *link {
	l := &link{cfg: cfg, write: write, trace: trace, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		wake: make(chan struct{}, 1)}
	if cfg.BurstLoss > 0 {
		// Stationary P(bad) = enter/(enter+leave) = BurstLoss, mean time in
		// bad = 1/leave = BurstLen packets.
		l.leaveBad = 1 / cfg.BurstLen
		l.enterBad = min(cfg.BurstLoss*l.leaveBad/(1-cfg.BurstLoss), 1)
	}
	return l
}

// buf returns a packet buffer, reusing delivered ones.
func (l *link) buf() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.free); n > 0 {
		b := l.free[n-1]
		l.free = l.free[:n-1]
		return b[:cap(b)]
	}
	return make([]byte, maxPacket+64)
}

func (l *link) recycleLocked(b []byte) {
	if len(l.free) < 4096 {
		l.free = append(l.free, b)
	}
}

// enqueue decides p's fate at arrival time now: dropped, or scheduled for
// delivery. It takes ownership of p (a buffer from buf).
func (l *link) enqueue(p []byte, now time.Time) {
	cfg := &l.cfg
	drop := func(counter *uint64) {
		l.mu.Lock()
		*counter++
		l.recycleLocked(p)
		l.mu.Unlock()
	}
	l.mu.Lock()
	l.st.Received++
	l.mu.Unlock()
	if cfg.Loss > 0 && l.rng.Float64() < cfg.Loss {
		drop(&l.st.Lost)
		return
	}
	if cfg.BurstLoss > 0 {
		if l.gilbertBad {
			l.gilbertBad = l.rng.Float64() >= l.leaveBad
		} else {
			l.gilbertBad = l.rng.Float64() < l.enterBad
		}
		if l.gilbertBad {
			drop(&l.st.BurstLost)
			return
		}
	}
	leave := now
	if cfg.Bandwidth > 0 || l.trace != nil {
		for len(l.inQueue) > 0 && !l.inQueue[0].done.After(now) {
			l.queued -= l.inQueue[0].size
			l.inQueue = l.inQueue[1:]
		}
		if l.queued+len(p) > cfg.Queue {
			drop(&l.st.QueueDrops)
			return
		}
		if l.trace != nil {
			leave = l.opportunity(now)
		} else {
			start := now
			if l.busyUntil.After(now) {
				start = l.busyUntil
			}
			leave = start.Add(time.Duration(int64(len(p)) * 8 * int64(time.Second) / cfg.Bandwidth))
			l.busyUntil = leave
		}
		l.inQueue = append(l.inQueue, queued{done: leave, size: len(p)})
		l.queued += len(p)
	}
	oneWay := cfg.RTT / 2
	if cfg.Jitter > 0 {
		oneWay += time.Duration(l.rng.Int64N(int64(2*cfg.Jitter)+1)) - cfg.Jitter
	}
	due := leave.Add(oneWay)
	if due.Before(l.lastDue) {
		due = l.lastDue
	}
	l.lastDue = due
	reordered := cfg.Reorder > 0 && l.rng.Float64() < cfg.Reorder
	if reordered {
		due = due.Add(cfg.ReorderDelay)
	}
	wait := leave.Sub(now)
	l.mu.Lock()
	if reordered {
		l.st.Reordered++
	}
	l.st.QueueDelay.Total += wait
	l.st.QueueDelay.Max = max(l.st.QueueDelay.Max, wait)
	l.seq++
	heap.Push(&l.due, duePacket{at: due, seq: l.seq, p: p})
	first := l.due[0].seq == l.seq
	l.mu.Unlock()
	if first {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// opportunity takes the first unused delivery opportunity of the trace at
// or after now (opportunities nobody used pass unused, as on a cellular
// link) and returns its time.
func (l *link) opportunity(now time.Time) time.Time {
	if l.traceStart.IsZero() {
		l.traceStart = now
	}
	n := int64(len(l.trace))
	period := l.trace[n-1]
	at := func(k int64) time.Time {
		return l.traceStart.Add(time.Duration(k/n)*period + l.trace[k%n])
	}
	since := now.Sub(l.traceStart)
	cycles := int64(since / period)
	within := since - time.Duration(cycles)*period
	i := int64(sort.Search(int(n), func(i int) bool { return l.trace[i] >= within }))
	k := max(cycles*n+i, l.nextOpp)
	l.nextOpp = k + 1
	return at(k)
}

// run delivers packets when they are due until stop is closed. It sleeps on
// one timer until the earliest and then writes every packet due.
func (l *link) run(stop <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var batch []duePacket
	for {
		l.mu.Lock()
		now := time.Now()
		batch = batch[:0]
		for len(l.due) > 0 && !l.due[0].at.After(now) {
			batch = append(batch, heap.Pop(&l.due).(duePacket))
		}
		next := time.Duration(-1)
		if len(l.due) > 0 {
			next = l.due[0].at.Sub(now)
		}
		l.mu.Unlock()
		for _, d := range batch {
			err := l.write(d.p)
			late := now.Sub(d.at)
			l.mu.Lock()
			if err != nil {
				l.st.WriteErrors++
			} else {
				l.st.Delivered++
				l.st.Bytes += uint64(len(d.p))
				l.st.Late.Total += late
				l.st.Late.Max = max(l.st.Late.Max, late)
			}
			l.recycleLocked(d.p)
			l.mu.Unlock()
		}
		if len(batch) > 0 {
			continue // time passed while writing: look again
		}
		if next >= 0 {
			timer.Reset(next)
		}
		select {
		case <-stop:
			return
		case <-l.wake: // Go 1.23 timers: Reset needs no drained channel
		case <-timer.C:
		}
	}
}

// stats returns a snapshot of the counters.
func (l *link) stats() LinkStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}

// duePacket is a packet waiting for its delivery time; seq breaks ties in
// arrival order.
type duePacket struct {
	at  time.Time
	seq uint64
	p   []byte
}

type dueHeap []duePacket

func (h dueHeap) Len() int { return len(h) }
func (h dueHeap) Less(i, j int) bool {
	if h[i].at.Equal(h[j].at) {
		return h[i].seq < h[j].seq
	}
	return h[i].at.Before(h[j].at)
}
func (h dueHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)   { *h = append(*h, x.(duePacket)) }
func (h *dueHeap) Pop() any {
	old := *h
	n := len(old)
	x := old[n-1]
	old[n-1] = duePacket{}
	*h = old[:n-1]
	return x
}
