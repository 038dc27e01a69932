// Package lanes lets several clients' requests share one server
// connection (cross-client pipelining in transaction mode).
//
// The requests sharing a connection form a lane: riders in the order they
// were written. Each rider's session writes its request itself (one writer
// at a time: the rider holds the lane's state lock while it writes, see
// Rider.EndWrite), then waits for its turn to read (Rider.AwaitTurn): the
// rider ahead of it hands the connection's reader over once its own
// ReadyForQuery has been read (Rider.Leave), so each session reads exactly
// its own replies. The last rider returns the connection to the pool, or
// hands it straight to a session waiting for one. A lost connection fails
// every rider on it (Rider.Fail).
//
// A lane takes a rider only while every request on it is of a kind known
// to be fast (Latency, fed by Leave) and the one the server runs has not
// run longer than such a request could (Limits.CancelHold); a cancel for
// a request with others behind it is held that long (Rider.Cancelable), and
// a cancel error that may have been meant for another request on the
// connection is recognised (Rider.HitByOthers).
//
// The package knows backend connections and pools, and nothing of
// sessions, statements or the wire: which requests qualify, and what the
// state lock guards (the connection's statement cache and parameters), are
// the pooler's.
package lanes

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgquic/pgquic/backend"
)

// New returns the lanes of pool; lost is the error the riders behind a
// request whose connection Leave destroys fail with.
func New(pool *backend.Pool, lost error) *Pool {
	return &Pool{pool: pool, lost: lost}
}

// Pool holds the lanes of one backend pool. Its mutex guards every
// lane's fields but stMu.
type Pool struct {
	pool      *backend.Pool
	lost      error // what the riders of a lane destroyed by Leave fail with
	mu        sync.Mutex
	lanes     []*Lane   // lanes with riders
	waiters   []*Waiter // sessions with a qualifying request waiting for a connection, oldest first
	exclusive int       // sessions with another request waiting: lanes stop taking riders so connections come free

	// nwait is len(waiters), stored under mu whenever waiters changes,
	// so that ConnReleased, called at every release, takes no lock when
	// nobody waits (see there).
	nwait atomic.Int32
}

// Lane is the set of requests written on one server connection.
type Lane struct {
	lp        *Pool
	conn      *backend.Conn
	riders    []*Rider // in write order; riders[0] reads
	writing   bool     // the last rider is still writing its request
	seals     int      // riders that asked for a cancel: no new rider while any is on the lane
	solo      bool     // the first rider's request may be sent again (Solo): no rider behind it
	cancelled bool     // a cancel was sent while several requests were on the connection
	key       string   // run-time parameters every rider expects (SetKey)
	err       error    // the connection was lost

	// stMu guards the connection's state (statement cache,
	// parameters) while riders share it: a rider holds it while writing,
	// a reader while it handles a reply that may change that state.
	stMu sync.Mutex
}

// Rider is one session's request on a lane. Its memory is the session's
// own (Reset), reused for each request: a session has at most one
// request on a lane at a time, and it has left the lane before its next
// request needs a server connection.
type Rider struct {
	l      *Lane
	turn   chan struct{} // signalled when the rider may read (or the lane is lost): turnNow, or own
	own    chan struct{} // the session's turn channel, with room for one signal
	fp     uint64        // fingerprint of the request's statements
	fast   bool          // under lp.mu once on a lane: requests of this kind are known to be fast
	joined bool          // written behind others on a busy connection
	since  int64         // under lp.mu: when it became the request the server runs (Unix nanoseconds)

	// Owner-only.
	stLocked bool      // holds l.stMu (writing)
	myTurn   bool      // has waited for its turn
	start    time.Time // when its turn began, for the latency statistics

	wantCancel bool // under lp.mu: a cancel waits for the rider to be alone
	sealer     bool // under lp.mu: the rider sealed the lane
}

// Waiter is a session waiting for a server connection that may be
// handed a place on a lane instead. One waiting in the backend pool's
// Acquire is woken by cancelling that wait; one waiting on the lanes alone
// (the pool is full, so a connection comes free only from a release) is
// woken through ch, either with a place (got) or to try the pool again.
type Waiter struct {
	key    string
	rd     *Rider // the session's rider, placed on a lane when one is handed over
	cancel context.CancelCauseFunc
	ch     chan struct{}
	got    bool // set under lp.mu when a place was handed over
}

// wake tells w that it was handed a place or should look again. lp.mu must
// be held, and w already out of the waiters.
func (w *Waiter) wake() {
	if w.cancel != nil {
		w.cancel(errLaneSlot)
		return
	}
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// errLaneSlot cancels the wait of a session handed a place on a lane.
var errLaneSlot = errors.New("handed a place on a shared server connection")

// Limits is what decides whether a lane takes another rider: the
// depth, how fast the requests ahead must be known to be, and the table
// that knows it.
type Limits struct {
	Depth int           // riders a lane takes at most (Config.PipelineDepth)
	Fast  time.Duration // how fast every request ahead must be known to be (Config.PipelineFastThreshold)
	Lat   *Latency      // what knows it
}

// turnNow is the turn of a rider that reads first: already given.
var turnNow = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// signal gives rd its turn.
func (rd *Rider) signal() {
	select {
	case rd.turn <- struct{}{}:
	default:
	}
}

// Lead makes the session's request the first on conn, freshly borrowed.
func (lp *Pool) Lead(conn *backend.Conn, rd *Rider, key string, slot **Lane) *Rider {
	lp.mu.Lock()
	l := *slot
	if l == nil {
		l = &Lane{lp: lp, conn: conn}
		*slot = l
	}
	l.lp, l.err, l.seals, l.solo, l.key, l.cancelled = lp, nil, 0, false, key, false
	rd.l, rd.turn, rd.since = l, turnNow, time.Now().UnixNano()
	l.riders = append(l.riders[:0], rd)
	l.writing = true
	lp.lanes = append(lp.lanes, l)
	lp.mu.Unlock()
	l.stMu.Lock()
	rd.stLocked = true
	return rd
}

// Join writes the session's request behind others on the least loaded lane
// that takes it, or returns nil.
func (lp *Pool) Join(rd *Rider, key string, lim Limits) *Rider {
	lp.mu.Lock()
	var best *Lane
	now := time.Now().UnixNano()
	for _, l := range lp.lanes {
		if l.accepts(key, lim, now) && (best == nil || len(l.riders) < len(best.riders)) {
			best = l
		}
	}
	if best == nil || lp.exclusive != 0 || len(lp.waiters) != 0 || lp.pool.Closing() {
		lp.mu.Unlock()
		return nil
	}
	best.add(rd)
	lp.mu.Unlock()
	rd.l.stMu.Lock()
	rd.stLocked = true
	return rd
}

// accepts reports whether a request with parameters key may be written on
// l at now (Unix nanoseconds). Every request on it must be of a kind known
// to be fast, and the one the server runs must not have run longer than a
// query of such a kind could (a pg_sleep(3) after many pg_sleep(0)): it
// takes no one behind it from then on. lp.mu must be held.
func (l *Lane) accepts(key string, lim Limits, now int64) bool {
	if l.writing || l.seals > 0 || l.solo || l.err != nil || len(l.riders) == 0 || len(l.riders) >= lim.Depth || l.key != key {
		return false
	}
	for _, r := range l.riders {
		if !r.fast {
			return false
		}
	}
	// The bound is cancelHold, not the threshold itself: the time since
	// the head's turn began includes its session waiting for a CPU to read
	// the replies, which on a saturated machine alone exceeds a few
	// milliseconds. The head's own answer, when it comes, is observed.
	head := l.riders[0]
	if time.Duration(now-head.since) > lim.CancelHold() {
		head.fast = false
		return false
	}
	return true
}

// add appends a rider that starts writing behind others. lp.mu must be
// held.
func (l *Lane) add(rd *Rider) {
	rd.l, rd.turn, rd.joined = l, rd.own, true
	l.riders = append(l.riders, rd)
	l.writing = true
}

// Wait registers a session about to wait for a connection of the pool with
// a qualifying request, so that a place on a lane can be handed to it.
func (lp *Pool) Wait(rd *Rider, key string, cancel context.CancelCauseFunc) *Waiter {
	w := &Waiter{key: key, rd: rd, cancel: cancel}
	lp.mu.Lock()
	lp.waiters = append(lp.waiters, w)
	lp.nwait.Store(int32(len(lp.waiters)))
	lp.mu.Unlock()
	return w
}

// Unwait ends a wait registered with wait and returns the place handed
// over, if any; the caller then holds l.stMu.
func (lp *Pool) Unwait(w *Waiter) *Rider {
	lp.mu.Lock()
	for i, x := range lp.waiters {
		if x == w {
			lp.waiters = append(lp.waiters[:i], lp.waiters[i+1:]...)
			lp.nwait.Store(int32(len(lp.waiters)))
			break
		}
	}
	got := w.got
	lp.mu.Unlock()
	if !got {
		return nil
	}
	rd := w.rd
	rd.l.stMu.Lock()
	rd.stLocked = true
	return rd
}

// WaitExclusive counts a session waiting with a request that cannot share
// a connection; while any does, lanes take no new riders, so they drain and
// their connections come free.
func (lp *Pool) WaitExclusive(d int) {
	lp.mu.Lock()
	lp.exclusive += d
	if lp.exclusive == 0 {
		lp.pokeLocked()
	}
	lp.mu.Unlock()
}

// WaitLanes registers a session about to wait on the lanes alone (its pool
// is full), at the front of the queue when it had already waited; nil when
// no lane exists to hand it a place.
func (lp *Pool) WaitLanes(rd *Rider, key string, front bool) *Waiter {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if len(lp.lanes) == 0 {
		return nil
	}
	w := &Waiter{key: key, rd: rd, ch: make(chan struct{}, 1)}
	if front {
		lp.waiters = append(lp.waiters, nil)
		copy(lp.waiters[1:], lp.waiters)
		lp.waiters[0] = w
		lp.nwait.Store(int32(len(lp.waiters)))
	} else {
		lp.waiters = append(lp.waiters, w)
		lp.nwait.Store(int32(len(lp.waiters)))
	}
	return w
}

// ConnReleased wakes the first session waiting on the lanes alone when a
// connection of the pool came free (backend.ReleaseNotifier), unless a
// session that cannot share one waits for it.
//
// When the pool is closing (a configuration reload replaced it), every
// such session is woken: each goes on to the pool that replaced it.
func (lp *Pool) ConnReleased() {
	// With nobody waiting there is nothing to wake. A waiter registering
	// at the same moment stores nwait under mu before it waits: a release
	// that loads 0 is one that came before it, which under mu would have
	// found the queue empty too.
	if lp.nwait.Load() == 0 {
		return
	}
	lp.mu.Lock()
	if lp.pool.Closing() {
		for i := 0; i < len(lp.waiters); {
			if w := lp.waiters[i]; w.ch != nil {
				lp.waiters = append(lp.waiters[:i], lp.waiters[i+1:]...)
				lp.nwait.Store(int32(len(lp.waiters)))
				w.wake()
				continue
			}
			i++
		}
	} else if lp.exclusive == 0 {
		lp.pokeLocked()
	}
	lp.mu.Unlock()
}

// pokeLocked wakes the first session waiting on the lanes alone to try the
// pool again. lp.mu must be held.
func (lp *Pool) pokeLocked() {
	for i, w := range lp.waiters {
		if w.ch != nil {
			lp.waiters = append(lp.waiters[:i], lp.waiters[i+1:]...)
			lp.nwait.Store(int32(len(lp.waiters)))
			w.wake()
			return
		}
	}
}

// fillLocked hands a free place on l to the oldest waiter that fits.
// lp.mu must be held.
func (lp *Pool) fillLocked(l *Lane, lim Limits) {
	if lp.exclusive > 0 || lp.pool.Closing() || len(lp.waiters) == 0 || !l.accepts(l.key, lim, time.Now().UnixNano()) {
		return
	}
	for i, w := range lp.waiters {
		if w.key != l.key {
			continue
		}
		lp.waiters = append(lp.waiters[:i], lp.waiters[i+1:]...)
		lp.nwait.Store(int32(len(lp.waiters)))
		l.add(w.rd)
		w.got = true
		w.wake()
		return
	}
}

// doneWriting ends the writing of rd's request: the next rider may write.
func (lp *Pool) doneWriting(rd *Rider, lim Limits) {
	lp.mu.Lock()
	l := rd.l
	if l.writing && l.riders[len(l.riders)-1] == rd {
		l.writing = false
		lp.fillLocked(l, lim)
	}
	lp.mu.Unlock()
}

// Leave ends rd's turn once its request has been answered: the next rider
// reads, or, when rd was the last, the connection goes back to the pool
// (or is destroyed). The latency of rd's request feeds the statistics.
func (rd *Rider) Leave(destroy bool, lim Limits) { rd.LeaveAt(time.Now(), destroy, lim) }

// LeaveAt is Leave for a caller that has just read the clock (the pooler
// at the ReadyForQuery that answered rd's request): now, which must be no
// older than that, ends rd's latency, starts the next rider's turn and is
// the connection's release time, so leaving reads no clock of its own.
func (rd *Rider) LeaveAt(now time.Time, destroy bool, lim Limits) {
	l := rd.l
	lp := l.lp
	if !rd.start.IsZero() {
		lim.Lat.Observe(rd.fp, now.Sub(rd.start))
	}
	lp.mu.Lock()
	if len(l.riders) == 0 || l.riders[0] != rd {
		// The lane was failed and emptied meanwhile.
		lp.mu.Unlock()
		if destroy || l.err != nil {
			l.conn.Destroy()
		}
		return
	}
	if destroy && len(l.riders) > 1 {
		lp.failLocked(l, lp.lost)
		lp.mu.Unlock()
		l.conn.Destroy()
		return
	}
	if rd.sealer {
		l.seals--
	}
	copy(l.riders, l.riders[1:])
	l.riders[len(l.riders)-1] = nil
	l.riders = l.riders[:len(l.riders)-1]
	if len(l.riders) > 0 {
		l.riders[0].since = now.UnixNano()
		l.riders[0].signal()
		lp.fillLocked(l, lim)
		lp.mu.Unlock()
		return
	}
	if !destroy && lp.exclusive == 0 && len(lp.waiters) > 0 && !l.conn.Expired() && !lp.pool.Closing() {
		// Hand the connection straight to the first waiter, whose
		// request leads the lane now: no trip through the pool.
		w := lp.waiters[0]
		lp.waiters = append(lp.waiters[:0], lp.waiters[1:]...)
		lp.nwait.Store(int32(len(lp.waiters)))
		nr := w.rd
		nr.l, nr.turn, nr.joined, nr.since = l, turnNow, false, now.UnixNano()
		l.riders = append(l.riders, nr)
		l.writing, l.key, l.seals, l.solo, l.cancelled = true, w.key, 0, false, false
		w.got = true
		w.wake()
		lp.mu.Unlock()
		return
	}
	lp.dropLocked(l)
	lp.mu.Unlock()
	if destroy {
		l.conn.Destroy()
	} else {
		l.conn.ReleaseAt(now)
	}
}

// detach takes rd's connection out of lane mode when rd is its only rider
// (its request left a transaction open after all, which the lexer should
// have seen): the session keeps the connection as any transaction would. It
// reports false when others share it; the caller then fails them all.
func (lp *Pool) detach(rd *Rider) bool {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	l := rd.l
	if len(l.riders) != 1 || l.riders[0] != rd || l.writing {
		return false
	}
	l.riders = l.riders[:0]
	lp.dropLocked(l)
	return true
}

// fail marks rd's lane lost: every rider still on it fails.
func (lp *Pool) fail(rd *Rider, err error) {
	lp.mu.Lock()
	lp.failLocked(rd.l, err)
	lp.mu.Unlock()
}

// failLocked marks l lost and wakes every rider waiting for its turn.
// lp.mu must be held.
func (lp *Pool) failLocked(l *Lane, err error) {
	if l.err == nil {
		l.err = err
	}
	for i, r := range l.riders {
		if i > 0 {
			r.signal()
		}
	}
	clear(l.riders)
	l.riders = l.riders[:0]
	l.writing = false
	l.seals = 0
	lp.dropLocked(l)
}

// dropLocked removes l from the lanes taking riders. lp.mu must be held.
func (lp *Pool) dropLocked(l *Lane) {
	for i, x := range lp.lanes {
		if x == l {
			lp.lanes[i] = lp.lanes[len(lp.lanes)-1]
			lp.lanes[len(lp.lanes)-1] = nil
			lp.lanes = lp.lanes[:len(lp.lanes)-1]
			return
		}
	}
}

// solo keeps other clients' requests off rd's connection until rd leaves,
// so its request may be sent again (a statement found stale); it
// reports false when rd already has requests behind or ahead of it.
func (lp *Pool) solo(rd *Rider) bool {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	l := rd.l
	if len(l.riders) != 1 || l.riders[0] != rd {
		return false
	}
	l.solo = true
	return true
}

// cancelable reports whether a cancel for rd may go to the server now,
// and if not, how long to wait before asking again (0: until rd's turn).
//
// A cancel is a signal to the server process, not to a query: if rd's
// query ends just before it lands, it stops whatever request the server
// runs next. On a connection with requests behind rd, that is another
// client's. Those requests were written there because every request ahead
// of them, rd's included, is of a kind known to finish within the fast
// threshold. So a cancel for the request the server runs (the first on
// the connection) with others behind it is held until the request has run
// for cancelHold: a query of a fast kind has finished by then, and the
// cancel, which could only race it, is dropped, as PostgreSQL drops a
// cancel that comes after the query; one still running is overrunning its
// kind, and the cancel goes at once, so neither it nor the requests behind
// it are held up longer. The rare cancel that still lands behind (the
// query ended in the moment the signal was on its way) gives that request
// an error saying so (hitByOthers), never "due to user request". A request
// alone on the connection is cancelled at once; one waiting behind others
// when its turn comes. Either way the lane takes no new rider until rd
// leaves.
func (lp *Pool) cancelable(rd *Rider, lim Limits) (ok, shared bool, after time.Duration) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	l := rd.l
	if l.err != nil {
		return false, false, 0
	}
	if !rd.sealer {
		rd.sealer = true
		l.seals++
	}
	if l.riders[0] != rd {
		rd.wantCancel = true
		return false, false, 0
	}
	rd.wantCancel = false
	if len(l.riders) == 1 && !l.writing {
		return true, false, 0
	}
	if wait := lim.CancelHold() - time.Duration(time.Now().UnixNano()-rd.since); wait > 0 {
		return false, false, wait
	}
	l.cancelled = true
	return true, true, 0
}

// CancelHold is how long a request with others behind it must have run
// before a cancel for it is sent: four times the fast threshold, so a
// query of a fast kind has surely finished, within [20 ms, 1 s].
func (lim Limits) CancelHold() time.Duration {
	return min(max(4*lim.Fast, 20*time.Millisecond), time.Second)
}

// hitByOthers reports whether a cancel error reaching rd may have been
// meant for another request on its connection: one was sent while rd
// shared it, and rd's own client asked for none.
func (lp *Pool) hitByOthers(rd *Rider) bool {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return rd.l.cancelled && !rd.sealer
}

// Latency keeps, per query fingerprint, the slowest recent answer of the
// server, for the pipelining policy. A fingerprint leaves constants out, so
// one kind covers pg_sleep(0) and pg_sleep(3): the worst time counts, not
// the mean, and it falls back by a quarter of the distance per faster
// answer, so one very slow answer keeps a kind slow for a couple of dozen
// answers while a few milliseconds of scheduling delay on a busy machine
// pass after two or three. Fingerprints share slots by hash; a slow kind of query makes its
// slot slow for every kind sharing it, which only makes the pooler more
// careful.
type Latency struct {
	slot [4096]struct {
		worst atomic.Uint32 // microseconds
		n     atomic.Uint32 // observations, saturating
	}
}

// latMinSamples is how many answers make a kind of query known.
const latMinSamples = 4

func (t *Latency) Observe(fp uint64, d time.Duration) {
	e := &t.slot[fp%uint64(len(t.slot))]
	us := uint32(min(d.Microseconds(), 1<<31))
	n := e.n.Load()
	if old := e.worst.Load(); n == 0 || us >= old {
		e.worst.Store(us)
	} else {
		e.worst.Store(old - (old-us)/4)
	}
	if n < latMinSamples {
		e.n.Store(n + 1)
	}
}

func (t *Latency) Fast(fp uint64, threshold time.Duration) bool {
	e := &t.slot[fp%uint64(len(t.slot))]
	return e.n.Load() >= latMinSamples && time.Duration(e.worst.Load())*time.Microsecond <= threshold
}

// Reset readies rd, the session's own rider (its memory is reused for each
// request), for a request of fingerprint fp, fast when requests of its kind
// are known to be.
func (rd *Rider) Reset(fp uint64, fast bool) *Rider {
	own := rd.own
	if own == nil {
		own = make(chan struct{}, 1)
	}
	select {
	case <-own: // a signal the last request did not wait for
	default:
	}
	*rd = Rider{own: own, fp: fp, fast: fast}
	return rd
}

// Lane returns the lane rd is on.
func (rd *Rider) Lane() *Lane { return rd.l }

// Joined reports whether rd was written behind others on a busy
// connection.
func (rd *Rider) Joined() bool { return rd.joined }

// MyTurn reports whether rd has had its turn to read (AwaitTurn or
// TakeTurn). Owner-only.
func (rd *Rider) MyTurn() bool { return rd.myTurn }

// Leads reports whether rd reads first on its connection now: it leads the
// lane, or has had its turn, so AwaitTurn would not wait. A rider whose
// turn was signalled but not yet taken reports false. Owner-only.
func (rd *Rider) Leads() bool { return rd.myTurn || rd.turn == turnNow }

// AwaitTurn waits until the riders ahead of rd have read their replies.
// It returns the error that failed the lane, if any, and whether a cancel
// the client asked for while it waited is due now (its request is the one
// the server runs). Owner-only.
func (rd *Rider) AwaitTurn() (wantCancel bool, err error) {
	<-rd.turn
	rd.myTurn = true
	rd.start = time.Now()
	l := rd.l
	l.lp.mu.Lock()
	err = l.err
	want := rd.wantCancel
	l.lp.mu.Unlock()
	return want, err
}

// TakeTurn waits for rd's turn without starting its latency clock, for a
// rider that leaves without reading. Owner-only.
func (rd *Rider) TakeTurn() {
	if !rd.myTurn {
		<-rd.turn
		rd.myTurn = true
	}
}

// Writing reports whether rd is still writing its request, holding the
// lane's state lock. Owner-only.
func (rd *Rider) Writing() bool { return rd.stLocked }

// EndWrite releases the lane's state lock rd holds while it writes, and
// reports whether it held it. Owner-only.
func (rd *Rider) EndWrite() bool {
	if !rd.stLocked {
		return false
	}
	rd.stLocked = false
	rd.l.stMu.Unlock()
	return true
}

// DoneWriting ends the writing of rd's request: the next rider may write.
func (rd *Rider) DoneWriting(lim Limits) { rd.l.lp.doneWriting(rd, lim) }

// Detach takes rd's connection out of lane mode when rd is its only rider
// (see Pool.detach); false when others share it.
func (rd *Rider) Detach() bool { return rd.l.lp.detach(rd) }

// Fail marks rd's lane lost: every rider still on it fails with err.
func (rd *Rider) Fail(err error) { rd.l.lp.fail(rd, err) }

// Solo keeps other clients' requests off rd's connection until rd leaves
// (see Pool.solo); false when rd already shares it.
func (rd *Rider) Solo() bool { return rd.l.lp.solo(rd) }

// Cancelable reports whether a cancel for rd may go to the server now,
// whether other requests share the connection then, and if it may not, how
// long to wait before asking again (see Pool.cancelable).
func (rd *Rider) Cancelable(lim Limits) (ok, shared bool, after time.Duration) {
	return rd.l.lp.cancelable(rd, lim)
}

// HitByOthers reports whether a cancel error reaching rd may have been
// meant for another request on its connection (see Pool.hitByOthers).
func (rd *Rider) HitByOthers() bool { return rd.l.lp.hitByOthers(rd) }

// Conn returns the server connection l's requests share.
func (l *Lane) Conn() *backend.Conn { return l.conn }

// LockState takes the lock guarding the connection's state (statement
// cache, parameters) while riders share it, for a reader handling a reply
// that may change that state.
func (l *Lane) LockState() { l.stMu.Lock() }

// UnlockState releases the lock LockState took.
func (l *Lane) UnlockState() { l.stMu.Unlock() }

// SetKey records the run-time parameters every rider of l expects, once
// the first rider's session has brought the connection in line with them.
func (l *Lane) SetKey(key string) {
	l.lp.mu.Lock()
	l.key = key
	l.lp.mu.Unlock()
}

// C is signalled when a Waiter registered with WaitLanes was handed a
// place or should look again.
func (w *Waiter) C() <-chan struct{} { return w.ch }
