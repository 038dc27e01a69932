package pooler

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/pooler/hiddencode"
	"github.com/pgquic/pgquic/pooler/lanes"
)

// Code the server runs behind a name.
//
// A text may name only a table, a view, a type or an operator and still
// make the server run a user-defined function: a trigger, a rule, a view's
// query, a column DEFAULT, a CHECK constraint, a generated column, an
// index expression, a row security policy, a domain's CHECK, a cast or a
// type's input function, an operator's function. Such a function may SET
// anything, LISTEN, take an advisory lock, create a temporary table or
// change the role, and the lexer sees none of it. So in transaction mode
// the pooler learns from each pool's database which names carry such code
// (hiddencode), and reads a text that names one as it reads a call of a
// user-defined function: the probe asks the server afterwards what the
// session holds, the run-time parameters are read back, and the text
// never shares a server connection with other clients' requests.
//
// It fails closed. Until the catalog has been read, while DDL the pooler
// passed on has not ended (its transaction may add a trigger any moment),
// after such DDL until the catalog has been read again, and whenever
// reading it fails, every text counts as naming such code. DDL the pooler
// did not pass on (a migration run directly against the server) is seen
// at the next read, at most Config.CatalogRefresh later: until then a
// text naming the object it changed is read by the older catalog.

// The catalog is read in the background, on a server connection borrowed
// for the read alone (refreshCatalog): no client's request waits for it, so
// a request's start never moves behind another client's (pg_stat_activity
// shows it running when its client expects). While a read is due or
// running, requests are read by the catalog known so far, or as opaque
// when none is. Only a pool's first login, when nothing is known yet,
// reads it on the connection it borrowed before the greeting (startup.go),
// so the first requests are not all opaque.

// catalogTimeout bounds one read of the catalog.
const catalogTimeout = 10 * time.Second

// catalogWatch is what the pooler knows of one pool's catalog.
type catalogWatch struct {
	names atomic.Pointer[hiddencode.Names] // nil: not known (fail closed)
	// next is when a read of the catalog falls due (Unix nanoseconds):
	// CatalogRefresh after the last read, whether it succeeded or not,
	// and at once when the catalog may have changed.
	next atomic.Int64
	// busy is held by the one read of the catalog that may run at a time.
	busy chan struct{}

	// gen mirrors epoch for readers that take no lock: an attachment
	// notes it when it starts (catalogAt) and compares it when it ends.
	gen atomic.Uint64

	mu sync.Mutex
	// last is the newest catalog read, kept when names is forgotten: if
	// the fingerprint says nothing changed since, it is the catalog again
	// without a full read.
	last *hiddencode.Names
	// epoch counts invalidations: a read that began before one is
	// thrown away, as it may have missed the change.
	epoch uint64
	// ddl counts server connections that ran DDL in a transaction which
	// has not ended yet; no read is kept while it is not zero.
	ddl int
	// ends counts the ends of such transactions (ddlEnded), read without
	// the lock by sessions noting what their requests were read by.
	ends atomic.Uint64
	// changed is closed, and replaced, at every change and every read
	// that ends: a release waiting for the catalog after DDL
	// (sameCodeAfter) looks again then.
	changed chan struct{}
}

// poolShared is what the pooler keeps with each backend pool
// (backend.Pool.Shared): the lanes of its shared connections, which hear
// of every released connection, and its catalog.
type poolShared struct {
	*lanes.Pool
	catalog atomic.Pointer[catalogWatch] // the pool's database's (catalogOf)
}

func sharedOf(pool *backend.Pool) *poolShared { return pool.Shared(newPoolShared).(*poolShared) }

func newPoolShared(pool *backend.Pool) any { return &poolShared{Pool: lanes.New(pool, ErrServerLost)} }

// catalogOf returns the catalog watch of pool's database. Every pool of
// one database (one per user) shares it, so DDL sent through any of them
// makes the catalog unknown for all.
func (p *Pooler) catalogOf(pool *backend.Pool) *catalogWatch {
	ps := sharedOf(pool)
	if w := ps.catalog.Load(); w != nil {
		return w
	}
	w, _ := p.catalogs.LoadOrStore(pool.Server(), &catalogWatch{busy: make(chan struct{}, 1)})
	ps.catalog.Store(w.(*catalogWatch))
	return w.(*catalogWatch)
}

// catalogMark is the catalog a request was read by: the watch's
// generation and its count of ended DDL transactions then, and the names
// it knew (nil: none, so the request was read as opaque).
type catalogMark struct {
	gen, ends uint64
	names     *hiddencode.Names
}

// mark returns the catalog a request read now is read by. The count of
// ends is read first and the names last, so an end in between is counted
// (sameCodeAfter then expects one more) and a change is seen by gen.
func (w *catalogWatch) mark() catalogMark {
	ends := w.ends.Load()
	gen := w.gen.Load()
	return catalogMark{gen: gen, ends: ends, names: w.names.Load()}
}

// current returns what is known of the catalog: nil when nothing is.
func (w *catalogWatch) current() *hiddencode.Names { return w.names.Load() }

// invalidate forgets the catalog, which may have changed: it is read
// again at the next chance.
func (w *catalogWatch) invalidate() { w.change(0) }

// ddlBegan records DDL on a server connection whose transaction has not
// ended; ddlEnded its end (commit, rollback, or the connection's loss).
// Both forget the catalog.
func (w *catalogWatch) ddlBegan() { w.change(1) }
func (w *catalogWatch) ddlEnded() { w.change(-1) }

func (w *catalogWatch) change(ddl int) {
	w.mu.Lock()
	w.ddl += ddl
	if ddl < 0 {
		w.ends.Add(1)
	}
	w.epoch++
	w.gen.Add(1)
	w.names.Store(nil)
	w.next.Store(0)
	w.notifyLocked()
	w.mu.Unlock()
}

// release ends the read that held w.busy and wakes the releases waiting
// in sameCodeAfter, which may start the next one now.
func (w *catalogWatch) release() {
	<-w.busy
	w.mu.Lock()
	w.notifyLocked()
	w.mu.Unlock()
}

// notifyLocked wakes the releases waiting in sameCodeAfter. w.mu must be
// held.
func (w *catalogWatch) notifyLocked() {
	if w.changed != nil {
		close(w.changed)
		w.changed = nil
	}
}

// watchLocked returns what a release waiting for the catalog after DDL
// reads of w: the DDL transactions open and ended, the catalog known (nil:
// none), and a channel closed at the next change. w.mu must be held.
func (w *catalogWatch) watchLocked() (ddl int, ends uint64, n *hiddencode.Names, changed <-chan struct{}) {
	if w.changed == nil {
		w.changed = make(chan struct{})
	}
	return w.ddl, w.ends.Load(), w.names.Load(), w.changed
}

// retryAfter puts the next read off by d after one that could not start,
// unless the catalog may have changed since epoch (it is due again then).
func (w *catalogWatch) retryAfter(d time.Duration, epoch uint64) {
	w.mu.Lock()
	if w.epoch == epoch {
		w.next.Store(time.Now().Add(d).UnixNano())
	}
	w.mu.Unlock()
}

// epochNow returns the count of invalidations so far (retryAfter).
func (w *catalogWatch) epochNow() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.epoch
}

// due reports whether the catalog should be read (again) now.
func (w *catalogWatch) due(now time.Time) bool { return now.UnixNano() >= w.next.Load() }

// Results of one read of the catalog (learn).
const (
	readSkipped   = iota // DDL has not ended: nothing was read
	readKept             // what was read is the catalog now
	readUnchanged        // the fingerprint says the last read is still the catalog
	readDiscarded        // the catalog changed meanwhile: due again already
	readFailed           // the catalog is unknown until the next read
)

// learn reads the catalog on conn, an idle server connection the caller
// holds, and keeps what it found unless the catalog may have changed
// meanwhile. When a read was kept before, the catalog's fingerprint is
// read first, and the full read is done only if it changed. An error
// that is not a *backend.ServerError leaves conn out of step with its
// server: the caller destroys it.
func (w *catalogWatch) learn(ctx context.Context, conn *backend.Conn, every time.Duration) (int, error) {
	w.mu.Lock()
	start, ddl, last := w.epoch, w.ddl, w.last
	w.mu.Unlock()
	if ddl > 0 {
		return readSkipped, nil // read once the DDL has ended (ddlEnded)
	}
	var n *hiddencode.Names
	var err error
	if last != nil {
		var fp string
		var fb hiddencode.Builder
		err = conn.Query(ctx, catalogTimeout, hiddencode.FingerprintQuery, fb.Add)
		fp = fb.Fingerprint()
		if err == nil && fp == last.Fingerprint() {
			n = last
		}
	}
	if n == nil && err == nil {
		var b hiddencode.Builder
		if err = conn.Query(ctx, catalogTimeout, hiddencode.Query, b.Add); err == nil {
			n = b.Build()
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.epoch != start || w.ddl > 0 {
		return readDiscarded, err
	}
	w.next.Store(time.Now().Add(every).UnixNano())
	if err != nil {
		w.names.Store(nil)
		return readFailed, err
	}
	w.names.Store(n)
	if n == last {
		return readUnchanged, nil
	}
	w.last = n
	return readKept, nil
}

// learnOn reads the catalog on conn, a server connection the caller has
// just borrowed for itself, when nothing is known of it and no other read
// is running; otherwise it starts a background read when one is due. It
// reports false when conn is no longer usable (the caller destroys it); a
// failed read otherwise only leaves the catalog unknown, which fails
// closed.
func (p *Pooler) learnOn(ctx context.Context, conn *backend.Conn) bool {
	w := p.catalogOf(conn.Pool())
	if w.current() != nil || !w.due(time.Now()) {
		p.refreshCatalog(conn.Pool())
		return true
	}
	select {
	case w.busy <- struct{}{}:
	default:
		return true // another session is reading it
	}
	defer w.release()
	return p.readCatalog(ctx, w, conn)
}

// refreshCatalog starts a read of pool's catalog when one is due and none
// is running. The read borrows a server connection of its own, waiting for
// one like any client; it gives up after catalogTimeout, and the catalog
// is read again CatalogRefresh later.
func (p *Pooler) refreshCatalog(pool *backend.Pool) {
	w := p.catalogOf(pool)
	if !w.due(time.Now()) {
		return
	}
	select {
	case w.busy <- struct{}{}:
	default:
		return // a read is running
	}
	if !p.bg.add() {
		<-w.busy // shutting down
		return
	}
	go func() {
		defer p.bg.done()
		defer w.release()
		epoch := w.epochNow()
		ctx, cancel := context.WithTimeout(p.bg.ctx, catalogTimeout)
		defer cancel()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			w.retryAfter(p.cfg.CatalogRefresh, epoch)
			if !pool.Closing() && p.bg.ctx.Err() == nil {
				p.m.catalogReads.WithLabelValues("failed").Inc()
				p.log.Warn("no server connection to read the catalog for code behind names on; read again later",
					"database", pool.Database(), "err", err)
			}
			return
		}
		if p.readCatalog(ctx, w, conn) {
			conn.Release()
		} else {
			conn.Destroy()
		}
	}()
}

// readCatalog reads w's catalog on conn, which the caller holds, as does
// it w.busy, and counts the outcome. It reports false when conn is no
// longer usable.
func (p *Pooler) readCatalog(ctx context.Context, w *catalogWatch, conn *backend.Conn) bool {
	res, err := w.learn(ctx, conn, p.cfg.CatalogRefresh)
	switch res {
	case readSkipped:
		return true
	case readKept:
		p.m.catalogReads.WithLabelValues("ok").Inc()
	case readUnchanged:
		p.m.catalogReads.WithLabelValues("unchanged").Inc()
	case readDiscarded:
		p.m.catalogReads.WithLabelValues("discarded").Inc()
	case readFailed:
		p.m.catalogReads.WithLabelValues("failed").Inc()
		p.log.Warn("reading the catalog for code behind names failed; until it is read, every statement counts as running unseen code",
			"database", conn.Pool().Database(), "err", err)
	}
	var se *backend.ServerError
	return err == nil || errors.As(err, &se)
}

// ddlSettleTimeout bounds how long a release waits for DDL that changed
// the catalog while its requests ran to end and for the catalog to be
// read again (sameCodeAfter); past it the connection is closed.
const ddlSettleTimeout = 250 * time.Millisecond

// sameCodeAfter reports whether the DDL the pooler passed on while
// requests read by the catalog at m ran left the code behind names as it
// was at m. Then those requests, read as plain, cannot have run code the
// DDL added, and neither can the requests written behind them on a lane:
// their server connection holds nothing the pooler does not know of
// (overlapsDDLLocked said it may). A migration that adds a column or an
// index then costs its in-flight neighbours a wait for one read of the
// catalog, not their connection. It waits up to ddlSettleTimeout for the
// DDL's transactions to end and the catalog to be read again, and it
// fails closed: false when m knew no names (its requests were opaque),
// when more than one DDL transaction ended since m (one may have added a
// trigger the requests ran and the next dropped it), when the pool has
// no connection left for a read, or when no read comes in time.
func (p *Pooler) sameCodeAfter(pool *backend.Pool, m catalogMark) bool {
	if m.names == nil || pool.Size() <= 1 {
		return false // opaque requests; or the one connection, held, is all a read could use
	}
	w := p.catalogOf(pool)
	timer := time.NewTimer(ddlSettleTimeout)
	defer timer.Stop()
	for {
		w.mu.Lock()
		ddl, ends, n, changed := w.watchLocked()
		w.mu.Unlock()
		switch {
		case ends > m.ends+1:
			return false
		case ddl == 0 && n != nil:
			return n.SameCode(m.names)
		case pool.Spare() <= 0:
			// Every connection is lent: a read would wait for one of
			// them, and with all of them waiting here none is released
			// before the timeout, a stall of the pool for every client.
			return false
		}
		p.refreshCatalog(pool)
		select {
		case <-changed:
		case <-timer.C:
			return false
		case <-p.bg.ctx.Done():
			return false
		}
	}
}

// hiddenText reports whether, in transaction mode, text names something
// that runs code the text does not show (or nothing is known of the
// catalog). memo, when not nil, keeps the answer for the Names it was
// found with, for a text that comes again (a prepared statement).
func (s *session) hiddenText(text []byte, memo *hiddenMemo) bool {
	if s.p.cfg.Mode != ModeTransaction || len(text) == 0 {
		return false
	}
	return hiddenIn(s.p.catalogOf(s.pool).current(), text, memo)
}

// hiddenIn is hiddenText for the catalog n (nil: unknown).
func hiddenIn(n *hiddencode.Names, text []byte, memo *hiddenMemo) bool {
	switch {
	case n == nil:
		return true
	case n.Empty() || len(text) == 0:
		return false
	case memo != nil && memo.names == n:
		return memo.hidden
	}
	h := n.Mentions(bytesString(text))
	if memo != nil {
		memo.names, memo.hidden = n, h
	}
	return h
}

// checkHidden makes info opaque (hide) when its text names code behind
// names, or nothing is known of the catalog, counting it. memo is
// hiddenText's.
func (s *session) checkHidden(info *sqlInfo, text []byte, memo *hiddenMemo) {
	if s.p.cfg.Mode != ModeTransaction {
		return
	}
	n := s.catalogAtHand()
	if info.pins.Opaque || info.noQuery || len(text) == 0 {
		return // opaque already, or nothing to hide from
	}
	if !hiddenIn(n, text, memo) {
		return
	}
	info.hide()
	if n == nil {
		s.p.m.hiddenUnknown.Inc()
	} else {
		s.p.m.hiddenNamed.Inc()
	}
}

// catalogAtHand notes that the message at hand is read by the catalog
// now (s.catalogAt), which an attachment it begins counts from
// (overlapsDDLLocked), and returns the names it is read by. The caller
// is in transaction mode.
func (s *session) catalogAtHand() *hiddencode.Names {
	s.catalogAt, s.catalogRead = s.p.catalogOf(s.pool).mark(), true
	return s.catalogAt.names
}

// hiddenMemo is hiddenText's answer for one text under one Names.
type hiddenMemo struct {
	names  *hiddencode.Names
	hidden bool
}

// hide makes info that of a text naming code the server runs unseen: as
// opaque as a call of a user-defined function (inspectSQL), and never
// shared with other clients' requests.
func (info *sqlInfo) hide() {
	info.pipe = false
	info.pins.Opaque = true
	info.paramsAll = true
}

// noteDDLLocked records that a's server runs DDL, which may add code
// behind a name any moment: the catalog is unknown until the DDL's
// transaction has ended and the catalog has been read again. s.mu must be
// held.
func (s *session) noteDDLLocked(a *attachment) {
	w := s.p.catalogOf(a.conn.Pool())
	if a.ddl {
		w.invalidate()
		return
	}
	a.ddl, a.ranDDL = true, true
	w.ddlBegan()
}

// overlapsDDLLocked reports whether the catalog changed, by DDL the
// pooler passed on, while a's requests ran: one read as plain may have
// waited for the DDL's lock and then run a trigger it added (an INSERT
// behind a migration's ALTER TABLE). a's own DDL does not count; its
// requests were opaque. s.mu must be held.
func (s *session) overlapsDDLLocked(a *attachment) bool {
	return !a.ranDDL && s.p.cfg.Mode == ModeTransaction && s.p.catalogOf(a.conn.Pool()).gen.Load() != a.catalogAt.gen
}

// endDDLLocked records that the DDL a's server ran has ended: its
// transaction is over, or the connection is going. s.mu must be held.
func (s *session) endDDLLocked(a *attachment) {
	if !a.ddl {
		return
	}
	a.ddl = false
	s.p.catalogOf(a.conn.Pool()).ddlEnded()
}
