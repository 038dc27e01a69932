package pooler

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/sqllex"
	"github.com/pgquic/pgquic/internal/wire"
)

// Cross-client pipelining (transaction mode).
//
// PostgreSQL answers requests written back to back on one connection far
// more cheaply than the same requests one round trip at a time. When every
// server connection of a pool is busy, a client whose whole request has
// arrived and is a complete implicit transaction (one simple Query, or
// extended-protocol messages ending in Sync, whose statements the lexer
// proves cannot open a transaction block or change session state) is
// written onto a busy connection behind the requests already there, instead
// of waiting for a connection to come free. Its own Sync keeps it a
// transaction of its own: an error in it ends only it, and an error in the
// request ahead of it ends only that one.
//
// The requests sharing a connection form a lane: riders in the order they
// were written. Each rider's session writes its request itself (one writer
// at a time), then waits for its turn to read: the rider ahead of it hands
// the connection's reader over once its own ReadyForQuery has been read, so
// each session reads exactly its own replies with its usual machinery, and
// the pooler's own messages in a request (a replayed Parse, a parameter
// query) stay invisible to everyone. The last rider returns the connection
// to the pool. A lost connection fails every rider on it.
//
// Against head-of-line blocking: an idle connection is always taken
// first; a lane takes at most PipelineDepth riders, and a client is
// written behind others only when every request ahead of it is known to be
// fast (its kind of query, by lexer fingerprint, was answered within
// PipelineFastThreshold every recent time) and the one running has not yet
// taken longer. A cancel for the request the server runs is sent at once,
// so the requests behind it are not held up; the lane takes no new rider
// until that client leaves, and a request behind that the cancel hits
// instead is told so (cancelable).

// lanePool holds the lanes of one backend pool. Its mutex guards every
// lane's fields but stMu.
type lanePool struct {
	pool      *backend.Pool
	mu        sync.Mutex
	lanes     []*lane       // lanes with riders
	waiters   []*laneWaiter // sessions with a qualifying request waiting for a connection, oldest first
	exclusive int           // sessions with another request waiting: lanes stop taking riders so connections come free
}

// lane is the set of requests written on one server connection.
type lane struct {
	lp        *lanePool
	conn      *backend.Conn
	riders    []*rider // in write order; riders[0] reads
	writing   bool     // the last rider is still writing its request
	seals     int      // riders that asked for a cancel: no new rider while any is on the lane
	solo      bool     // the first rider's request may be sent again (stale.go): no rider behind it
	cancelled bool     // a cancel was sent while several requests were on the connection
	key       string   // run-time parameters every rider expects (session.desiredKey)
	err       error    // the connection was lost

	// stMu guards the connection's serverState (statement cache,
	// parameters) while riders share it: a rider holds it while writing,
	// a reader while it handles a reply that may change that state.
	stMu sync.Mutex
}

// rider is one session's request on a lane. Its memory is the session's
// own (session.rider), reused for each request: a session has at most one
// request on a lane at a time, and it has left the lane before its next
// request needs a server connection.
type rider struct {
	l      *lane
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

// laneWaiter is a session waiting for a server connection that may be
// handed a place on a lane instead. One waiting in the backend pool's
// Acquire is woken by cancelling that wait; one waiting on the lanes alone
// (the pool is full, so a connection comes free only from a release) is
// woken through ch, either with a place (got) or to try the pool again.
type laneWaiter struct {
	key    string
	rd     *rider // the session's rider, placed on a lane when one is handed over
	cancel context.CancelCauseFunc
	ch     chan struct{}
	got    bool // set under lp.mu when a place was handed over
}

// wake tells w that it was handed a place or should look again. lp.mu must
// be held, and w already out of the waiters.
func (w *laneWaiter) wake() {
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

// errLeftOpen fails a lane whose rider left a transaction block open.
var errLeftOpen = errors.New("a request pipelined on a shared server connection left a transaction open")

// laneLimits is what decides whether a lane takes another rider: the
// depth, how fast the requests ahead must be known to be, and the table
// that knows it.
type laneLimits struct {
	depth int
	fast  time.Duration
	lat   *latTable
}

// laneLimits returns the pooler's limits for lanes.
func (p *Pooler) laneLimits() laneLimits {
	return laneLimits{depth: p.cfg.PipelineDepth, fast: p.cfg.PipelineFastThreshold, lat: &p.lat}
}

// lanesOf returns the lanes of pool.
func lanesOf(pool *backend.Pool) *lanePool {
	return pool.Shared(func() any { return &lanePool{pool: pool} }).(*lanePool)
}

// pipeBatch is what the pooler knows of a client's request when it needs a
// server connection for it.
type pipeBatch struct {
	ok   bool   // the request qualifies for a shared connection
	fp   uint64 // fingerprint of its statements
	fast bool   // its kind is known to be fast
	key  string // the client's run-time parameters
}

// maxPipeBatch bounds a request written on a shared connection, so that
// writing it never blocks on a server busy sending others' replies.
const maxPipeBatch = 16 << 10

// pipelineCheckLocked reports whether the client's request, which starts
// with the message of type typ whose body has just been read and continues
// with what is already buffered, may share a server connection. s.mu must
// be held.
func (s *session) pipelineCheckLocked(typ byte, body []byte) pipeBatch {
	if typ == 0 || s.p.cfg.PipelineDepth < 2 || s.p.cfg.Mode != ModeTransaction || s.pinned ||
		s.pin.probe || s.snapshot || len(s.restore) > 0 || s.skipping {
		return pipeBatch{}
	}
	rest := s.cr.Peek()
	fp, ok := scanBatch(typ, body, rest, s.stmts, s.unnamed, &s.pipeText)
	if !ok {
		return pipeBatch{}
	}
	return pipeBatch{ok: true, fp: fp, fast: s.p.lat.fast(fp, s.p.cfg.PipelineFastThreshold), key: s.desiredKey()}
}

// scanBatch reads a client's request: the message of type typ whose body
// has been read, then the bytes buffered after it. It reports whether the
// request is complete (ends in Sync, or is one Query, with nothing after
// it), small, and made of messages and statements that qualify, and its
// fingerprint. stmts and unnamed are the client's prepared statements.
//
// first is what the lexer found in the first message's statement text:
// when known, the handler had it already and the text is not lexed again;
// when not, scanBatch fills it in when it lexes that text, so the handler
// need not either.
func scanBatch(typ byte, body, rest []byte, stmts map[string]*stmt, unnamed *stmt, first *lexedText) (uint64, bool) {
	if len(body)+len(rest) > maxPipeBatch {
		return 0, false
	}
	c := batchScan{stmts: stmts, unnamed: unnamed, first: first}
	ok := c.msg(typ, body)
	c.first = nil
	if !ok {
		return 0, false
	}
	for !c.synced {
		if len(rest) < wire.HeaderLen {
			return 0, false
		}
		n := int(binary.BigEndian.Uint32(rest[1:]))
		if n < 4 || n > len(rest)-1 {
			return 0, false
		}
		if !c.msg(rest[0], rest[wire.HeaderLen:1+n]) {
			return 0, false
		}
		rest = rest[1+n:]
	}
	if len(rest) > 0 {
		return 0, false // more follows: the client pipelines on its own
	}
	return c.fp, true
}

// batchScan reads the messages of a request for pipelineCheckLocked.
type batchScan struct {
	stmts     map[string]*stmt
	unnamed   *stmt
	fp        uint64
	synced    bool
	unnamedOK bool              // the unnamed statement is one the request parses, and qualifies
	unnamedFP uint64            // its fingerprint
	parsed    map[string]uint64 // named statements the request parses, by fingerprint
	first     *lexedText        // while the first message is read: what is known of its text
}

// lexedText is what the lexer found in one statement text, kept so the
// pipelining check and the message's handler lex a text once between them.
// text identifies the bytes it was found in (the same slice of the client's
// read buffer), so it is never taken for another text.
type lexedText struct {
	text  []byte
	plain bool   // sqllex found nothing at all (pipeSafeSQL)
	fp    uint64 // sqllex.Fingerprint, when plain
}

// of reports whether l describes exactly q.
func (l *lexedText) of(q []byte) bool {
	return l != nil && len(q) > 0 && len(l.text) == len(q) && &l.text[0] == &q[0]
}

// plainSQL reports whether q is plain, and its fingerprint when it is,
// from what the lexer found before (known) or by lexing it now.
func (c *batchScan) plainSQL(q []byte) (bool, uint64) {
	if c.first.of(q) {
		return c.first.plain, c.first.fp
	}
	if !pipeSafeSQL(q) {
		if c.first != nil {
			*c.first = lexedText{text: q}
		}
		return false, 0
	}
	fp := sqllex.Fingerprint(bytesString(q))
	if c.first != nil {
		*c.first = lexedText{text: q, plain: true, fp: fp}
	}
	return true, fp
}

// mix adds a statement's fingerprint to the request's.
func (c *batchScan) mix(fp uint64) {
	c.fp = (c.fp^fp)*1099511628211 + 1
}

// msg takes one message; false means the request does not qualify.
func (c *batchScan) msg(typ byte, body []byte) bool {
	switch typ {
	case 'Q':
		q, _, ok := wire.CString(body)
		if !ok {
			return false
		}
		plain, fp := c.plainSQL(q)
		if !plain {
			return false
		}
		c.mix(fp)
		c.synced = true
		return true
	case 'P':
		return c.parse(body)
	case 'B':
		_, rest, ok := wire.CString(body)
		if !ok {
			return false
		}
		name, _, ok := wire.CString(rest)
		if !ok {
			return false
		}
		fp, ok := c.stmtFP(name)
		if ok {
			c.mix(fp)
		}
		return ok
	case 'D':
		if len(body) < 2 || (body[0] != 'S' && body[0] != 'P') {
			return false
		}
		if body[0] == 'S' {
			name, _, ok := wire.CString(body[1:])
			if !ok {
				return false
			}
			_, ok = c.stmtFP(name)
			return ok
		}
		return true
	case 'E':
		return true
	case 'S':
		c.synced = true
		return true
	}
	// Close, Flush, FunctionCall, COPY data, Terminate...: not here.
	return false
}

// parse takes a Parse message of the request; false means the request
// does not qualify.
func (c *batchScan) parse(body []byte) bool {
	name, rest, ok := wire.CString(body)
	if !ok {
		return false
	}
	if len(name) == 0 && c.unnamed != nil && c.unnamed.key == string(rest) {
		// The client's unnamed statement again, word for word: the
		// handler reuses it (handleParse), and its classification.
		c.unnamedOK, c.unnamedFP = c.unnamed.info.pipe, c.unnamed.info.fp
		return c.unnamedOK
	}
	q, _, ok := wire.CString(rest)
	if !ok {
		return false
	}
	plain, fp := c.plainSQL(q)
	if !plain {
		return false
	}
	if len(name) == 0 {
		c.unnamedOK, c.unnamedFP = true, fp
		return true
	}
	if _, exists := c.stmts[string(name)]; exists {
		return false // 42P05: let it fail alone
	}
	if c.parsed == nil {
		c.parsed = make(map[string]uint64)
	}
	c.parsed[string(name)] = fp
	return true
}

// stmtFP returns the fingerprint of a statement the request binds or
// describes, and whether it qualifies.
func (c *batchScan) stmtFP(name []byte) (uint64, bool) {
	if len(name) == 0 {
		if c.unnamedOK {
			return c.unnamedFP, true
		}
		if c.unnamed == nil || !c.unnamed.info.pipe {
			return 0, false
		}
		return c.unnamed.info.fp, true
	}
	if fp, ok := c.parsed[string(name)]; ok {
		return fp, true
	}
	st := c.stmts[string(name)]
	if st == nil || !st.info.pipe {
		return 0, false
	}
	return st.info.fp, true
}

// pipeSafeSQL reports whether a statement text provably ends with its
// implicit transaction and leaves no session state behind: the lexer found
// nothing but plain statements (no transaction control, SET, COPY, LISTEN,
// cursors, temporary objects, DO or CALL, DDL, and no unreadable text).
func pipeSafeSQL(q []byte) bool {
	return len(q) > 0 && sqllex.Classify(bytesString(q)).Flags == 0
}

// turnNow is the turn of a rider that reads first: already given.
var turnNow = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// newRider readies the session's rider for a request.
func (s *session) newRider(b pipeBatch) *rider {
	rd := &s.rider
	own := rd.own
	if own == nil {
		own = make(chan struct{}, 1)
	}
	select {
	case <-own: // a signal the last request did not wait for
	default:
	}
	*rd = rider{own: own, fp: b.fp, fast: b.fast}
	return rd
}

// signal gives rd its turn.
func (rd *rider) signal() {
	select {
	case rd.turn <- struct{}{}:
	default:
	}
}

// lead makes the session's request the first on conn, freshly borrowed.
func (lp *lanePool) lead(conn *backend.Conn, rd *rider, key string) *rider {
	st, _ := conn.State.(*serverState)
	if st == nil {
		st = newServerState()
		conn.State = st
	}
	lp.mu.Lock()
	l := st.lane
	if l == nil {
		l = &lane{lp: lp, conn: conn}
		st.lane = l
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

// join writes the session's request behind others on the least loaded lane
// that takes it, or returns nil.
func (lp *lanePool) join(rd *rider, key string, lim laneLimits) *rider {
	lp.mu.Lock()
	var best *lane
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
func (l *lane) accepts(key string, lim laneLimits, now int64) bool {
	if l.writing || l.seals > 0 || l.solo || l.err != nil || len(l.riders) == 0 || len(l.riders) >= lim.depth || l.key != key {
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
	if time.Duration(now-head.since) > lim.cancelHold() {
		head.fast = false
		return false
	}
	return true
}

// add appends a rider that starts writing behind others. lp.mu must be
// held.
func (l *lane) add(rd *rider) {
	rd.l, rd.turn, rd.joined = l, rd.own, true
	l.riders = append(l.riders, rd)
	l.writing = true
}

// wait registers a session about to wait for a connection of the pool with
// a qualifying request, so that a place on a lane can be handed to it.
func (lp *lanePool) wait(rd *rider, key string, cancel context.CancelCauseFunc) *laneWaiter {
	w := &laneWaiter{key: key, rd: rd, cancel: cancel}
	lp.mu.Lock()
	lp.waiters = append(lp.waiters, w)
	lp.mu.Unlock()
	return w
}

// unwait ends a wait registered with wait and returns the place handed
// over, if any; the caller then holds l.stMu.
func (lp *lanePool) unwait(w *laneWaiter) *rider {
	lp.mu.Lock()
	for i, x := range lp.waiters {
		if x == w {
			lp.waiters = append(lp.waiters[:i], lp.waiters[i+1:]...)
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

// waitExclusive counts a session waiting with a request that cannot share
// a connection; while any does, lanes take no new riders, so they drain and
// their connections come free.
func (lp *lanePool) waitExclusive(d int) {
	lp.mu.Lock()
	lp.exclusive += d
	if lp.exclusive == 0 {
		lp.pokeLocked()
	}
	lp.mu.Unlock()
}

// waitLanes registers a session about to wait on the lanes alone (its pool
// is full), at the front of the queue when it had already waited; nil when
// no lane exists to hand it a place.
func (lp *lanePool) waitLanes(rd *rider, key string, front bool) *laneWaiter {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if len(lp.lanes) == 0 {
		return nil
	}
	w := &laneWaiter{key: key, rd: rd, ch: make(chan struct{}, 1)}
	if front {
		lp.waiters = append(lp.waiters, nil)
		copy(lp.waiters[1:], lp.waiters)
		lp.waiters[0] = w
	} else {
		lp.waiters = append(lp.waiters, w)
	}
	return w
}

// ConnReleased wakes the first session waiting on the lanes alone when a
// connection of the pool came free (backend.ReleaseNotifier), unless a
// session that cannot share one waits for it.
//
// When the pool is closing (a configuration reload replaced it), every
// such session is woken: each goes on to the pool that replaced it.
func (lp *lanePool) ConnReleased() {
	lp.mu.Lock()
	if lp.pool.Closing() {
		for i := 0; i < len(lp.waiters); {
			if w := lp.waiters[i]; w.ch != nil {
				lp.waiters = append(lp.waiters[:i], lp.waiters[i+1:]...)
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
func (lp *lanePool) pokeLocked() {
	for i, w := range lp.waiters {
		if w.ch != nil {
			lp.waiters = append(lp.waiters[:i], lp.waiters[i+1:]...)
			w.wake()
			return
		}
	}
}

// waitOnLanes waits, when the session's pool is full, for a place on a lane
// or for a connection to come free, without queueing in the backend pool:
// on a busy pool nearly every place comes from a lane. It returns no rider
// and no error when the session must wait in the pool after all.
func (s *session) waitOnLanes(actx context.Context, lp *lanePool, b pipeBatch) (*rider, *backend.Conn, error) {
	front := false
	for {
		if s.pool.Closing() {
			return nil, nil, nil // the pool's Acquire says so, and the session moves on
		}
		w := lp.waitLanes(s.newRider(b), b.key, front)
		if w == nil {
			return nil, nil, nil
		}
		select {
		case <-w.ch:
		case <-actx.Done():
		}
		if rd := lp.unwait(w); rd != nil {
			return rd, rd.l.conn, nil
		}
		if err := actx.Err(); err != nil {
			return nil, nil, err
		}
		// A connection came free.
		if conn, err := s.pool.TryAcquire(actx); err == nil {
			rd := lanesOf(conn.Pool()).lead(conn, s.newRider(b), b.key)
			lp.ConnReleased() // another may be free too
			return rd, conn, nil
		}
		if rd := lp.join(s.newRider(b), b.key, s.p.laneLimits()); rd != nil {
			return rd, rd.l.conn, nil
		}
		if !s.pool.Full() {
			return nil, nil, nil
		}
		front = true
	}
}

// fillLocked hands a free place on l to the oldest waiter that fits.
// lp.mu must be held.
func (lp *lanePool) fillLocked(l *lane, lim laneLimits) {
	if lp.exclusive > 0 || lp.pool.Closing() || len(lp.waiters) == 0 || !l.accepts(l.key, lim, time.Now().UnixNano()) {
		return
	}
	for i, w := range lp.waiters {
		if w.key != l.key {
			continue
		}
		lp.waiters = append(lp.waiters[:i], lp.waiters[i+1:]...)
		l.add(w.rd)
		w.got = true
		w.wake()
		return
	}
}

// doneWriting ends the writing of rd's request: the next rider may write.
func (lp *lanePool) doneWriting(rd *rider, lim laneLimits) {
	lp.mu.Lock()
	l := rd.l
	if l.writing && l.riders[len(l.riders)-1] == rd {
		l.writing = false
		lp.fillLocked(l, lim)
	}
	lp.mu.Unlock()
}

// leave ends rd's turn once its request has been answered: the next rider
// reads, or, when rd was the last, the connection goes back to the pool
// (or is destroyed). The latency of rd's request feeds the statistics.
func (p *Pooler) leave(rd *rider, destroy bool) {
	l := rd.l
	lp := l.lp
	if !rd.start.IsZero() {
		p.lat.observe(rd.fp, time.Since(rd.start))
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
		lp.failLocked(l, ErrServerLost)
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
		l.riders[0].since = time.Now().UnixNano()
		l.riders[0].signal()
		lp.fillLocked(l, p.laneLimits())
		lp.mu.Unlock()
		return
	}
	if !destroy && lp.exclusive == 0 && len(lp.waiters) > 0 && !l.conn.Expired() && !lp.pool.Closing() {
		// Hand the connection straight to the first waiter, whose
		// request leads the lane now: no trip through the pool.
		w := lp.waiters[0]
		lp.waiters = append(lp.waiters[:0], lp.waiters[1:]...)
		nr := w.rd
		nr.l, nr.turn, nr.joined, nr.since = l, turnNow, false, time.Now().UnixNano()
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
		l.conn.Release()
	}
}

// detach takes rd's connection out of lane mode when rd is its only rider
// (its request left a transaction open after all, which the lexer should
// have seen): the session keeps the connection as any transaction would. It
// reports false when others share it; the caller then fails them all.
func (lp *lanePool) detach(rd *rider) bool {
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
func (lp *lanePool) fail(rd *rider, err error) {
	lp.mu.Lock()
	lp.failLocked(rd.l, err)
	lp.mu.Unlock()
}

// failLocked marks l lost and wakes every rider waiting for its turn.
// lp.mu must be held.
func (lp *lanePool) failLocked(l *lane, err error) {
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
func (lp *lanePool) dropLocked(l *lane) {
	for i, x := range lp.lanes {
		if x == l {
			lp.lanes[i] = lp.lanes[len(lp.lanes)-1]
			lp.lanes[len(lp.lanes)-1] = nil
			lp.lanes = lp.lanes[:len(lp.lanes)-1]
			return
		}
	}
}

// riderSynced reports whether the connection rd shares already has the
// session's run-time parameters, as every rider's request expects: a
// rider's request is written with no parameter query of its own ahead of
// it. rd holds the state lock.
func (s *session) riderSynced(rd *rider) bool {
	st := rd.l.conn.State.(*serverState)
	return s.lastBorrower(st) || (st.syncedKey == s.desiredKey() && !st.dirtyAll && st.syncPend == 0)
}

// solo keeps other clients' requests off rd's connection until rd leaves,
// so its request may be sent again (a statement found stale, stale.go); it
// reports false when rd already has requests behind or ahead of it.
func (lp *lanePool) solo(rd *rider) bool {
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
func (lp *lanePool) cancelable(rd *rider, lim laneLimits) (bool, time.Duration) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	l := rd.l
	if l.err != nil {
		return false, 0
	}
	if !rd.sealer {
		rd.sealer = true
		l.seals++
	}
	if l.riders[0] != rd {
		rd.wantCancel = true
		return false, 0
	}
	rd.wantCancel = false
	if len(l.riders) == 1 && !l.writing {
		return true, 0
	}
	if wait := lim.cancelHold() - time.Duration(time.Now().UnixNano()-rd.since); wait > 0 {
		return false, wait
	}
	l.cancelled = true
	return true, 0
}

// cancelHold is how long a request with others behind it must have run
// before a cancel for it is sent: four times the fast threshold, so a
// query of a fast kind has surely finished, within [20 ms, 1 s].
func (lim laneLimits) cancelHold() time.Duration {
	return min(max(4*lim.fast, 20*time.Millisecond), time.Second)
}

// hitByOthers reports whether a cancel error reaching rd may have been
// meant for another request on its connection: one was sent while rd
// shared it, and rd's own client asked for none.
func (lp *lanePool) hitByOthers(rd *rider) bool {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return rd.l.cancelled && !rd.sealer
}

// errOthersCancel replaces, for a request stopped by another client's
// cancel (hitByOthers), PostgreSQL's "canceling statement due to user
// request", which would blame the client for a cancel it never sent.
var errOthersCancel = &PGError{
	Severity: "ERROR",
	Code:     pgproto.CodeQueryCanceled,
	Message:  "canceling statement due to another client's cancel request",
	Detail: "The request was pipelined on a server connection shared with another client's request, " +
		"which was cancelled; the cancel reached this request instead. Nothing of it took effect.",
	Hint: "Retry the request.",
}

// awaitTurn waits until the riders ahead of a's have read their replies,
// and returns the error that failed the lane, if any. A cancel the client
// asked for while it waited is sent now: its request is the one the
// server runs.
func (s *session) awaitTurn(a *attachment, rd *rider) error {
	<-rd.turn
	rd.myTurn = true
	rd.start = time.Now()
	l := rd.l
	l.lp.mu.Lock()
	err := l.err
	want := rd.wantCancel
	l.lp.mu.Unlock()
	if err != nil {
		return err
	}
	if want {
		s.mu.Lock()
		conn, g := s.beginCancelLocked()
		s.mu.Unlock()
		if conn != nil {
			go s.forwardCancel(context.Background(), conn, g)
		}
	}
	return nil
}

// endWrite ends the writing phase of a's rider, if it is in one: the
// statement cache is free for the riders' readers again; the caller then
// flushes the request and lets the next rider write (doneWriting).
func (a *attachment) endWrite() *rider {
	rd := a.rider
	if rd == nil || !rd.stLocked {
		return nil
	}
	rd.stLocked = false
	rd.l.stMu.Unlock()
	return rd
}

// abortWriteLocked ends a rider's request whose client went away before
// its Sync was written: a Describe of a portal that cannot exist fails the
// implicit transaction, so the Sync rolls back whatever the request did,
// and the riders behind it are unaffected. s.mu must be held.
func (s *session) abortWriteLocked(a *attachment) {
	const portal = "pgquic: abandoned request"
	f := wire.AppendHeader(nil, 'D', 1+len(portal)+1)
	f = append(f, 'P')
	f = append(f, portal...)
	f = append(f, 0)
	f = append(f, syncMsg...)
	s.push(a, entry{kind: eDescribe})
	s.push(a, entry{kind: eSync})
	_, _ = a.conn.W.Write(f)
}

// latTable keeps, per query fingerprint, the slowest recent answer of the
// server, for the pipelining policy. A fingerprint leaves constants out, so
// one kind covers pg_sleep(0) and pg_sleep(3): the worst time counts, not
// the mean, and it falls back by a quarter of the distance per faster
// answer, so one very slow answer keeps a kind slow for a couple of dozen
// answers while a few milliseconds of scheduling delay on a busy machine
// pass after two or three. Fingerprints share slots by hash; a slow kind of query makes its
// slot slow for every kind sharing it, which only makes the pooler more
// careful.
type latTable struct {
	slot [4096]struct {
		worst atomic.Uint32 // microseconds
		n     atomic.Uint32 // observations, saturating
	}
}

// latMinSamples is how many answers make a kind of query known.
const latMinSamples = 4

func (t *latTable) observe(fp uint64, d time.Duration) {
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

func (t *latTable) fast(fp uint64, threshold time.Duration) bool {
	e := &t.slot[fp%uint64(len(t.slot))]
	return e.n.Load() >= latMinSamples && time.Duration(e.worst.Load())*time.Microsecond <= threshold
}

// bytesString views b as a string without copying; b must not change while
// the string is in use.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
