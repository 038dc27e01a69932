package pooler

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/wire"
)

// Statements made stale by DDL.
//
// A server statement the pooler shares between clients outlives the table
// shape it was planned for. After ALTER TABLE t ADD COLUMN, PostgreSQL
// refuses to run or describe a statement prepared for SELECT * FROM t with
// 0A000 "cached plan must not change result type": the result would no
// longer match what the client was told. Directly, only clients that
// prepared before the DDL see that; a client preparing afterwards gets the
// new shape. Through the pooler a later client's Parse is answered from the
// server's cache, so without care it inherits the stale statement and fails
// too, and so does every later client of that server connection.
//
// So:
//   - a 0A000 for a pooler-named statement drops it from the server
//     connection's cache (and closes it before it is prepared again), so the
//     next client to use it gets a statement planned for the current table;
//   - the first use (Describe or Bind) of a statement a client has just
//     parsed is retried transparently, once: it is the case of a client
//     preparing after the DDL, which must succeed as it would directly. The
//     pooler records the client's messages from that first use to the Sync
//     ending the pipeline; on 0A000 it swallows the error and the Sync's
//     ReadyForQuery, closes and prepares the statement again, and sends the
//     recorded messages once more;
//   - a statement the client has already used gets the error, as it would
//     directly (drivers such as pgx then prepare it again), once.
//
// The retry is only attempted when it cannot change what the client sees
// beyond the error it replaces: no reply to any of the client's messages in
// the pipeline has reached it yet, the connection was outside a transaction
// block when the pipeline began (the error would otherwise have aborted the
// client's transaction), the whole pipeline up to its Sync has been received
// and recorded (at most replayLimit bytes), and the owner is reading the
// replies inline (no concurrent writer to the server).

// replayLimit bounds the messages recorded for a retry; a longer pipeline is
// not retried.
const replayLimit = 64 << 10

// replayLog is what the pooler recorded of the current pipeline, from the
// first use of a freshly parsed statement to the Sync.
type replayLog struct {
	items  []replayItem
	size   int
	closed bool // the Sync has been recorded
	stmt   *stmt
}

// replayItem is one recorded message: the reply it expects and its frame
// as sent to the server (nil for a reply the pooler writes itself).
type replayItem struct {
	e     entry
	frame []byte
}

// staleGens counts, per server statement name, the result type changes
// the pooler has seen (0A000 from a server): a statement's generation. Each
// server copy records the generation it was prepared in, and each client
// statement the generation whose result shape the client was told, so the
// pooler knows which server copies are stale (prepared again before use)
// and which clients must hear of the change (0A000, once, as PostgreSQL
// says to a client whose statement predates the DDL). Until the first
// change, looking a generation up costs one atomic load.
type staleGens struct {
	any atomic.Bool
	mu  sync.Mutex
	m   map[string]uint64
}

// staleGensLimit bounds the names remembered; past it the table starts
// again, which at worst lets a client whose statement predates a change
// read the new shape without the error first.
const staleGensLimit = 10000

// current returns name's generation.
func (g *staleGens) current(name string) uint64 {
	if !g.any.Load() {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.m[name]
}

// bump records that a server copy of name prepared in generation old no
// longer matches the tables, and returns the generation now current.
func (g *staleGens) bump(name string, old uint64) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m == nil || len(g.m) >= staleGensLimit {
		g.m = make(map[string]uint64)
	}
	if g.m[name] <= old {
		g.m[name] = old + 1
	}
	g.any.Store(true)
	return g.m[name]
}

// errStaleShape is what a client whose statement predates a change of its
// result type is told, PostgreSQL's own error.
func errStaleShape() *PGError {
	return pgerr(pgproto.CodeFeatureNotSupported, "cached plan must not change result type", nil)
}

// checkShape runs before a Bind or Describe of the client's statement st,
// which a's server holds: a first use learns the generation of the server's
// copy, and a client told an older result shape than that copy's gets
// PostgreSQL's 0A000, once. It also arms the retry of a first use (see
// armReplay). s.mu must be held.
func (s *session) checkShape(a *attachment, st *stmt) *PGError {
	gen := a.st.stmts.Gen(st.name)
	if !st.used {
		st.used, st.gen = true, gen
		s.armReplay(a, st)
		return nil
	}
	if st.gen < gen {
		st.gen = gen
		return errStaleShape()
	}
	return nil
}

// raiseStaleLocked reports pe for the current Bind or Describe the way the
// server would: the server raises it, so a transaction block is aborted and
// the rest of the pipeline skipped. s.mu must be held.
func (s *session) raiseStaleLocked(a *attachment, pe *PGError) error {
	s.p.m.errors.WithLabelValues(pe.Code).Inc()
	s.skipping = true
	return s.serverRaiseLocked(a, pe, false)
}

// armReplay starts recording when st, a statement the client has just
// parsed, is used for the first time and a retry would be safe. It is
// called before the message's entry is pushed. s.mu must be held.
func (s *session) armReplay(a *attachment, st *stmt) {
	if a.relaying || a.skipping || a.status != 'I' || a.begun || s.p.cfg.Mode != ModeTransaction {
		return
	}
	if rd := a.rider; rd != nil && !rd.Solo() {
		// Behind other clients' requests a retry would run after
		// theirs: the client gets the error once.
		return
	}
	for i := a.head; i < len(a.queue); i++ {
		e := &a.queue[i]
		if !e.injected && !e.quiet && (e.kind != eSynthetic || e.rfq) {
			// A reply from the server to the client is still due: it
			// may already have had part of it.
			return
		}
	}
	a.replay = &replayLog{stmt: st}
	a.replayFirst = true
}

// recordPush notes an entry pushed while recording. Entries the retry
// cannot reproduce (the pooler's own queries, replayed Parses, a real Parse,
// a simple Query, a function call) stop the recording. s.mu must be held.
func (s *session) recordPush(a *attachment, e *entry) {
	r := a.replay
	if r.closed {
		a.replay = nil // a stale log of an earlier pipeline
		return
	}
	switch {
	case a.replayFirst:
		a.replayFirst = false
		e.replayHead = true
	case e.injected || e.quiet || e.reset:
		a.replay = nil
		return
	}
	switch e.kind {
	case eBind, eDescribe, eExecute, eClose, eSync:
	case eSynthetic:
		if e.rfq {
			a.replay = nil
			return
		}
	default:
		a.replay = nil
		return
	}
	r.items = append(r.items, replayItem{e: *e})
	r.closed = e.kind == eSync
}

// recordFrame attaches the frame written for the last recorded entry. A
// nil frame forwards the client's current message: it is read here, so its
// bytes can be kept, and returned to be written instead. s.mu must be held.
func (s *session) recordFrame(a *attachment, frame []byte) ([]byte, error) {
	r := a.replay
	n := len(r.items)
	if n == 0 || r.items[n-1].frame != nil || r.items[n-1].e.kind == eSynthetic {
		a.replay = nil
		return frame, nil
	}
	if frame == nil {
		body, err := s.cr.Body()
		if err != nil {
			return nil, err
		}
		frame = s.frame(s.curTyp, body)
	}
	r.size += len(frame)
	if r.size > replayLimit {
		a.replay = nil
		return frame, nil
	}
	r.items[n-1].frame = bytes.Clone(frame)
	return frame, nil
}

// retryStale handles an ErrorResponse answering e, the head of the queue.
// For a 0A000 about a pooler-named statement it drops the statement from
// the connection's cache and, when the recorded pipeline allows it,
// prepares the statement again and replays the pipeline; it then returns
// true and the error must not reach the client. s.mu must be held.
func (s *session) retryStale(a *attachment, e *entry, body []byte) bool {
	if e.stmt == "" || (e.kind != eBind && e.kind != eDescribe) || errorCode(body) != pgproto.CodeFeatureNotSupported {
		return false
	}
	// Whatever happens next, the server's copy is stale: the next Parse or
	// replay of this name closes it first and prepares it again, and
	// clients told the old shape hear of the change.
	gen := s.p.stale.bump(e.stmt, a.st.stmts.Gen(e.stmt))
	a.st.stmts.Remove(e.stmt)
	a.st.stmts.MarkMaybe(e.stmt)
	r := a.replay
	if r == nil || !r.closed || !e.replayHead || a.relaying || a.pending() != len(r.items) || r.stmt.name != e.stmt {
		a.replay = nil
		if e.cst != nil {
			e.cst.gen = gen // this client has now had its error
		}
		return false
	}
	a.replay = nil
	a.heldT = nil // the ParameterDescription of the failed Describe
	r.stmt.gen = gen
	// The server skips everything up to the Sync and answers it with
	// ReadyForQuery: undo what the skipped messages would have done, and
	// swallow that ReadyForQuery.
	for f := a.front(); f != nil && f.kind != eSync; f = a.front() {
		s.discard(a, f)
		a.pop()
	}
	sync := a.front()
	if sync == nil {
		return false // cannot happen: the log ends with the Sync
	}
	sync.quiet = true
	a.quiet.Add(1)

	st := r.stmt
	out := wire.AppendHeader(nil, 'C', 1+len(st.name)+1)
	out = append(out, 'S')
	out = append(out, st.name...)
	out = append(out, 0)
	s.push(a, entry{kind: eClose, injected: true})
	a.st.stmts.Unmark(st.name)
	out = append(out, st.parse...)
	a.st.stmts.Add(st.name, st.key, gen, s.id)
	s.push(a, entry{kind: eParse, injected: true, stmt: st.name})
	s.p.m.prepares.Inc()
	for _, it := range r.items {
		ne := it.e
		ne.replayHead = false
		if ne.clientName != "" && ne.cst != nil && s.stmts[ne.clientName] == nil {
			// A synthetic ParseComplete the error discarded: the client's
			// name comes back with it.
			s.addClientStmt(ne.clientName, ne.cst)
		}
		s.push(a, ne)
		out = append(out, it.frame...)
	}
	nc := a.conn.NetConn()
	_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := a.conn.W.Write(out)
	if err == nil {
		err = a.conn.W.Flush()
	}
	_ = nc.SetWriteDeadline(time.Time{})
	if err != nil {
		// The relay's next read fails too and reports the lost connection.
		a.destroy = true
		_ = nc.Close()
	}
	s.log.Info("statement invalidated by DDL prepared again and retried", "statement", st.name)
	return true
}
