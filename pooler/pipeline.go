package pooler

import (
	"context"
	"encoding/binary"
	"errors"
	"unsafe"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/sqllex"
	"github.com/pgquic/pgquic/internal/wire"
	"github.com/pgquic/pgquic/pooler/hiddencode"
	"github.com/pgquic/pgquic/pooler/lanes"
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
// instead is told so.
//
// The lanes themselves, riders, waiters and the latency statistics, are
// package lanes; this file decides which requests qualify
// (pipelineCheckLocked, scanBatch) and connects a session to the lanes.

// errLeftOpen fails a lane whose rider left a transaction block open.
var errLeftOpen = errors.New("a request pipelined on a shared server connection left a transaction open")

// errPinnedOnLane fails a lane whose rider's request changed its session's
// identity unseen (a view or a trigger calling a function that does SET
// ROLE): the requests behind it would run under that identity.
var errPinnedOnLane = errors.New("a request pipelined on a shared server connection changed the session's identity")

// laneLimits returns the pooler's limits for lanes.
func (p *Pooler) laneLimits() lanes.Limits {
	return lanes.Limits{Depth: p.cfg.PipelineDepth, Fast: p.cfg.PipelineFastThreshold, Lat: &p.lat}
}

// lanesOf returns the lanes of pool.
func lanesOf(pool *backend.Pool) *lanes.Pool { return sharedOf(pool).Pool }

// lead makes the session's request, rd, the first on conn, freshly
// borrowed; the lane is kept with the connection's state.
func lead(conn *backend.Conn, rd *lanes.Rider, key string) *lanes.Rider {
	return lanesOf(conn.Pool()).Lead(conn, rd, key, &stateOf(conn).lane)
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
	if s.pool.Spare() > laneSpare(s.pool)+1 {
		// The pool will not be nearly full once this request has borrowed
		// a connection (nearlyFull): it leads no lane, so it need not be
		// read for one. Should the pool fill meanwhile, the request waits
		// for a connection of its own, as one that may not share does.
		// The handler reads its text as any other's.
		return pipeBatch{}
	}
	rest := s.cr.Peek()
	fp, ok := scanBatch(typ, body, rest, s.stmts, s.unnamed, &s.pipeText, s.p.catalogOf(s.pool).current())
	if !ok {
		return pipeBatch{}
	}
	return pipeBatch{ok: true, fp: fp, fast: s.p.lat.Fast(fp, s.p.cfg.PipelineFastThreshold), key: s.desiredKey()}
}

// scanBatch reads a client's request: the message of type typ whose body
// has been read, then the bytes buffered after it. It reports whether the
// request is complete (ends in Sync, or is one Query, with nothing after
// it), small, and made of messages and statements that qualify, and its
// fingerprint. stmts and unnamed are the client's prepared statements;
// names is the catalog's code behind names (catalog.go), and a text that
// names any does not qualify.
//
// first is what the lexer found in the first message's statement text:
// when known, the handler had it already and the text is not lexed again;
// when not, scanBatch fills it in when it lexes that text, so the handler
// need not either.
func scanBatch(typ byte, body, rest []byte, stmts map[string]*stmt, unnamed *stmt, first *lexedText, names *hiddencode.Names) (uint64, bool) {
	if len(body)+len(rest) > maxPipeBatch || names == nil {
		return 0, false
	}
	c := batchScan{stmts: stmts, unnamed: unnamed, first: first, names: names}
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
	names     *hiddencode.Names // the catalog's code behind names
}

// qualifies reports whether a prepared statement may share a server
// connection: its text is plain and names no code behind names.
func (c *batchScan) qualifies(st *stmt) bool {
	return st != nil && st.info.pipe && !hiddenIn(c.names, st.text(), &st.hid)
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
	if !pipeSafeSQL(q) || hiddenIn(c.names, q, nil) {
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

// plainText reads the NUL-terminated statement text at the start of b
// (a Query's, or a Parse's after the name) and reports whether it is
// well formed and plain, with its fingerprint.
func (c *batchScan) plainText(b []byte) (uint64, bool) {
	q, _, ok := wire.CString(b)
	if !ok {
		return 0, false
	}
	plain, fp := c.plainSQL(q)
	return fp, plain
}

// mix adds a statement's fingerprint to the request's.
func (c *batchScan) mix(fp uint64) {
	c.fp = (c.fp^fp)*1099511628211 + 1
}

// msg takes one message; false means the request does not qualify.
func (c *batchScan) msg(typ byte, body []byte) bool {
	switch typ {
	case 'Q':
		fp, ok := c.plainText(body)
		if !ok {
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
		c.unnamedOK, c.unnamedFP = c.qualifies(c.unnamed), c.unnamed.info.fp
		return c.unnamedOK
	}
	fp, ok := c.plainText(rest)
	if !ok {
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
		if !c.qualifies(c.unnamed) {
			return 0, false
		}
		return c.unnamed.info.fp, true
	}
	if fp, ok := c.parsed[string(name)]; ok {
		return fp, true
	}
	st := c.stmts[string(name)]
	if !c.qualifies(st) {
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

// newRider readies the session's rider for a request.
func (s *session) newRider(b pipeBatch) *lanes.Rider {
	return s.rider.Reset(b.fp, b.fast)
}

// waitOnLanes waits, when the session's pool is full, for a place on a lane
// or for a connection to come free, without queueing in the backend pool:
// on a busy pool nearly every place comes from a lane. It returns no rider
// and no error when the session must wait in the pool after all.
func (s *session) waitOnLanes(actx context.Context, lp *lanes.Pool, b pipeBatch) (*lanes.Rider, *backend.Conn, error) {
	front := false
	for {
		if s.pool.Closing() {
			return nil, nil, nil // the pool's Acquire says so, and the session moves on
		}
		w := lp.WaitLanes(s.newRider(b), b.key, front)
		if w == nil {
			return nil, nil, nil
		}
		select {
		case <-w.C():
		case <-actx.Done():
		}
		if rd := lp.Unwait(w); rd != nil {
			return rd, rd.Lane().Conn(), nil
		}
		if err := actx.Err(); err != nil {
			return nil, nil, err
		}
		// A connection came free.
		if conn, err := s.pool.TryAcquire(actx); err == nil {
			rd := lead(conn, s.newRider(b), b.key)
			lp.ConnReleased() // another may be free too
			return rd, conn, nil
		}
		if rd := lp.Join(s.newRider(b), b.key, s.p.laneLimits()); rd != nil {
			return rd, rd.Lane().Conn(), nil
		}
		if !s.pool.Full() {
			return nil, nil, nil
		}
		front = true
	}
}

// riderSynced reports whether the connection rd shares already has the
// session's run-time parameters, as every rider's request expects: a
// rider's request is written with no parameter query of its own ahead of
// it. rd holds the state lock.
func (s *session) riderSynced(rd *lanes.Rider) bool {
	st := rd.Lane().Conn().State.(*serverState)
	return s.lastBorrower(st) || (st.syncedKey == s.desiredKey() && !st.dirtyAll && st.syncPend == 0)
}

// errOthersCancel replaces, for a request stopped by another client's
// cancel (Rider.HitByOthers), PostgreSQL's "canceling statement due to user
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
func (s *session) awaitTurn(a *attachment, rd *lanes.Rider) error {
	want, err := rd.AwaitTurn()
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
func (a *attachment) endWrite() *lanes.Rider {
	rd := a.rider
	if rd == nil || !rd.EndWrite() {
		return nil
	}
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

// bytesString views b as a string without copying; b must not change while
// the string is in use.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
