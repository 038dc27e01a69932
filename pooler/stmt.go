package pooler

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unsafe"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/sqllex"
	"github.com/pgquic/pgquic/internal/wire"
	"github.com/pgquic/pgquic/pooler/lanes"
	"github.com/pgquic/pgquic/pooler/params"
	"github.com/pgquic/pgquic/pooler/stmtcache"
)

// Prepared statements in transaction mode.
//
// A client's named statements must keep working whichever server connection
// serves its next transaction. The pooler therefore renames them: a
// statement's identity is its full query text plus its parameter type OIDs
// (the key), and its server-side name is derived from a SHA-256 of that key.
// Every server connection keeps an LRU of the statements it holds, keyed by
// server name and checked against the full key, so two different queries can
// never share one server statement even if their hashes collided. When a
// Bind or Describe names a statement the current server lacks, the pooler
// first replays the client's Parse under the server name and swallows the
// ParseComplete it caused; Close and DEALLOCATE only touch the client's map.
//
// This follows the lessons of PgBouncer 1.21+, PgCat and PgDog, whose bug
// trackers show where prepared statements in transaction mode break: short
// hashes that collide, a Describe or Bind with no Parse in the transaction,
// ParseComplete/CloseComplete the client did not ask for, unbounded caches.

const serverStmtPrefix = "pgq_"

// stmt is one client statement as the pooler replays it.
type stmt struct {
	key   string // query text, NUL, parameter count and OIDs: the statement's identity (aliases parse)
	name  string // server-side name; "" for the unnamed statement
	parse []byte // complete Parse frame under the server name; never modified
	info  sqlInfo
	hid   hiddenMemo // whether the text names code behind names (catalog.go); guarded by s.mu
	used  bool       // the client has described or bound it since parsing it (stale.go); guarded by s.mu
	gen   uint64     // generation of the result shape the client was told (stale.go); guarded by s.mu
}

// newStmt builds the Parse frame of a statement once. Its key is a view into
// that frame rather than a second copy of the query text: the frame is never
// written again, so the string stays immutable. lexed, when it describes
// the key's query text, is what the pipelining check found in it already.
func newStmt(name string, key []byte, lexed *lexedText) *stmt {
	frame := wire.AppendHeader(make([]byte, 0, 5+len(name)+1+len(key)), 'P', len(name)+1+len(key))
	frame = append(frame, name...)
	frame = append(frame, 0)
	off := len(frame)
	frame = append(frame, key...)
	st := &stmt{name: name, parse: frame}
	if len(key) > 0 {
		st.key = unsafe.String(&frame[off], len(key))
	}
	if q, _, ok := wire.CString(key); ok {
		if lexed.of(q) && lexed.plain {
			st.info = sqlInfo{pipe: true, fp: lexed.fp} // what inspectSQL gives a plain text
		} else {
			st.info = inspectSQL(q)
		}
	}
	return st
}

// text returns the statement's query text.
func (st *stmt) text() []byte {
	q, _, _ := wire.CString(unsafe.Slice(unsafe.StringData(st.key), len(st.key)))
	return q
}

// size is what the statement costs the pooler, for ClientStatementBytes.
func (st *stmt) size() int { return len(st.parse) + len(st.name) }

func serverStmtName(key []byte) string {
	h := sha256.Sum256(key)
	return serverStmtPrefix + hex.EncodeToString(h[:12])
}

// serverState is what the pooler knows about one server connection: the
// statements prepared on it (package stmtcache), and the run-time
// parameters the pooler set on it that the server does not report.
//
// The statement cache must follow the server's truth, whoever changed it:
// a DEALLOCATE or DISCARD in any protocol is seen by its command tag, a
// Close the server skipped after an error leaves its name in doubt
// (MarkMaybe), and a 26000 or 42P05 answer corrects the entry it names. A
// name that may exist on the server although the cache does not list it is
// closed before it is prepared again (closing a missing statement is not an
// error). On a connection shared by several clients' requests
// (pipeline.go), a session that cannot trust another's unconfirmed Parse
// prepares what it needs itself (closing a named statement first, which
// runs after the whole request ahead). Records that only take something
// away (a Close, a simple Query destroying the unnamed statement) are safe
// to make at once.
type serverState struct {
	stmts     stmtcache.Cache // the statements prepared on the connection
	seqBy     uint64          // whose nextval the server process may remember (sequences.go)
	syncPend  int             // parameter syncs written and not yet answered (riderSynced)
	set       map[string]string
	syncedKey string // parameters of the last session synced, serialised (see syncParams)
	agreedKey string // a parameter key whose reported values conn.Params held at agreedGen (syncParams)
	agreedGen uint64
	lastUser  uint64 // session that last borrowed the connection (see reapplyParams)
	dirtyAll  bool   // a client ran RESET ALL or set_config of an unknown parameter

	lane *lanes.Lane // the clients' requests sharing the connection (pipeline.go)
}

func newServerState() *serverState {
	return &serverState{set: make(map[string]string)}
}

// stateOf returns conn's serverState, made the first time it is asked for.
func stateOf(conn *backend.Conn) *serverState {
	st, _ := conn.State.(*serverState)
	if st == nil {
		st = newServerState()
		conn.State = st
	}
	return st
}

// settle forgets the bookkeeping of replies still owed, for a connection
// freshly borrowed with nothing in flight (see stmtcache.Cache.Settle).
func (st *serverState) settle() {
	st.syncPend = 0
	st.stmts.Settle()
}

// reset forgets everything after DISCARD ALL.
func (st *serverState) reset() {
	st.stmts.Drop(true)
	clear(st.set)
	st.syncedKey = ""
}

// ensurePrepared makes sure a's server holds st, replaying the Parse when it
// does not. s.mu must be held.
func (s *session) ensurePrepared(a *attachment, st *stmt) error {
	present, conflict := a.st.stmts.Lookup(st.name, st.key, s.id)
	gen := s.p.stale.current(st.name)
	if present && a.st.stmts.Gen(st.name) >= gen {
		return nil
	}
	if present {
		// Prepared here before DDL changed its result type (stale.go):
		// prepare it again rather than let the server refuse it.
		conflict = true
	}
	if conflict || a.st.stmts.MayHold(st.name) {
		if err := s.injectClose(a, st.name); err != nil {
			return err
		}
	}
	if err := s.ensureRoom(a); err != nil {
		return err
	}
	// Recorded first: a Parse the server will skip (push discards it)
	// forgets the record at once.
	a.st.stmts.Add(st.name, st.key, gen, s.id)
	s.push(a, entry{kind: eParse, injected: true, stmt: st.name})
	s.p.m.prepares.Inc()
	return s.writeServer(a, st.parse)
}

// rewriteDeallocate turns the text of an unnamed Parse that is "DEALLOCATE
// name" of one of the client's protocol-level statements (psycopg sends its
// cache evictions this way) into a DEALLOCATE of the statement's server
// name, prepared on a's server first, so the server drops what the client
// meant, and forgets the client's name, as PostgreSQL would. rest is the
// Parse body after the statement name. s.mu must be held.
func (s *session) rewriteDeallocate(a *attachment, rest []byte) ([]byte, error) {
	sql, tail, ok := wire.CString(rest)
	if !ok {
		return rest, nil
	}
	verb, arg := classifyQuery(sql)
	if verb != "deallocate" || arg == "all" {
		return rest, nil
	}
	st := s.stmts[arg]
	if st == nil {
		return rest, nil
	}
	if err := s.ensurePrepared(a, st); err != nil {
		return nil, err
	}
	s.dropClientStmt(arg)
	out := append([]byte("DEALLOCATE "+params.QuoteIdent(st.name)), 0)
	return append(out, tail...), nil
}

// ensureUnnamed replays the client's unnamed statement on a server that does
// not hold it (a Bind of "" in a later transaction). s.mu must be held.
func (s *session) ensureUnnamed(a *attachment) error {
	u := s.unnamed
	if u == nil || a.st.stmts.HasUnnamed(u.key, s.id) {
		return nil
	}
	a.st.stmts.WroteUnnamed(u.key, s.id) // before push, which forgets it if the server will skip it
	s.push(a, entry{kind: eParse, injected: true, unnamed: true})
	s.p.m.prepares.Inc()
	return s.writeServer(a, u.parse)
}

// ensureRoom evicts least recently used statements beyond the cache size.
func (s *session) ensureRoom(a *attachment) error {
	for a.st.stmts.Len() >= s.p.cfg.StatementCacheSize {
		if err := s.injectClose(a, a.st.stmts.Oldest()); err != nil {
			return err
		}
	}
	return nil
}

func (s *session) injectClose(a *attachment, name string) error {
	frame := wire.AppendHeader(s.scratch[:0], 'C', 1+len(name)+1)
	frame = append(frame, 'S')
	frame = append(frame, name...)
	frame = append(frame, 0)
	s.scratch = frame[:0]
	// If the server skips this Close (an error earlier in the pipeline),
	// the statement stays: discard then records the name in maybe.
	s.push(a, entry{kind: eClose, injected: true, stmt: name})
	a.st.stmts.Remove(name)
	return s.writeServer(a, frame)
}

// handleParse handles a Parse message.
func (s *session) handleParse(ctx context.Context) error {
	if s.p.cfg.Mode == ModeSession {
		return s.sessionForward(ctx, eParse)
	}
	body, err := s.cr.Body()
	if err != nil {
		return err
	}
	nameB, rest, ok := wire.CString(body)
	if !ok || len(rest) < 3 {
		return fatal(pgproto.CodeProtocolViolation, "invalid Parse message", nil)
	}
	s.mu.Lock()
	s.pipeTyp, s.pipeBody, s.pipeText = 'P', body, lexedText{}
	s.pipeSeq = s.p.cfg.Mode == ModeTransaction && s.parseReadsSequences(nameB, rest)
	a, err := s.attachLocked(ctx)
	if err != nil {
		s.mu.Unlock()
		return s.raise(err, false)
	}
	if len(nameB) == 0 {
		err = s.parseUnnamedLocked(a, rest)
		s.mu.Unlock()
		return err
	}
	name := string(nameB)
	if pe := s.parseRefusalLocked(name, rest); pe != nil {
		s.mu.Unlock()
		return s.raise(pe, false)
	}
	err = s.parseNamedLocked(a, name, rest)
	s.mu.Unlock()
	return err
}

// parseUnnamedLocked forwards a Parse of the unnamed statement whose text
// and parameter types are rest. s.mu must be held.
func (s *session) parseUnnamedLocked(a *attachment, rest []byte) error {
	rest, err := s.rewriteDeallocate(a, rest)
	if err != nil {
		return err
	}
	lexed := s.pipeText
	s.pipeText = lexedText{}
	u := s.unnamed
	if u != nil && string(rest) == u.key && a.pending() == 0 && (a.replay == nil || a.replay.stmt != u) {
		// The same text as the client's last unnamed statement, which
		// nothing else refers to any more (no reply pending, no retry
		// log): reuse its frame and classification, as a fresh one
		// would be, instead of building and lexing them again.
		u.used, u.gen = false, 0
	} else {
		u = newStmt("", rest, &lexed)
		s.unnamed = u
	}
	a.st.stmts.WroteUnnamed(u.key, s.id) // before push, which forgets it if the server will skip it
	s.push(a, entry{kind: eParse, unnamed: true})
	return s.writeServer(a, u.parse)
}

// parseRefusalLocked returns the error a Parse of the named statement
// name with text rest gets before anything is sent: 42P05 for a name the
// client has already, 53400 beyond ClientStatementLimit or
// ClientStatementBytes; nil when the Parse may go on. s.mu must be held.
func (s *session) parseRefusalLocked(name string, rest []byte) *PGError {
	if _, exists := s.stmts[name]; exists {
		return pgerr(pgproto.CodeDuplicatePStatement, fmt.Sprintf("prepared statement %q already exists", name), nil)
	}
	if len(s.stmts) >= s.p.cfg.ClientStatementLimit {
		return pgerr(pgproto.CodeInsufficientResource,
			fmt.Sprintf("too many prepared statements (limit %d per client)", s.p.cfg.ClientStatementLimit), nil)
	}
	if s.stmtBytes+len(rest) > s.p.cfg.ClientStatementBytes {
		return pgerr(pgproto.CodeInsufficientResource,
			fmt.Sprintf("prepared statements too large (limit %d bytes of statement text per client)", s.p.cfg.ClientStatementBytes), nil)
	}
	return nil
}

// parseNamedLocked prepares the client's statement name, with text and
// parameter types rest, under its server name: answered by the pooler when
// a's server holds it already, otherwise forwarded (after closing a name
// the server may hold for something else, and evicting what the cache
// has no room for). s.mu must be held.
func (s *session) parseNamedLocked(a *attachment, name string, rest []byte) error {
	lexed := s.pipeText
	s.pipeText = lexedText{}
	st := newStmt(serverStmtName(rest), rest, &lexed)
	// The name exists for the client only once the server accepts the
	// Parse: the relay removes it again if the Parse fails or is skipped.
	s.addClientStmt(name, st)
	present, conflict := a.st.stmts.Lookup(st.name, st.key, s.id)
	if present {
		// The server already has it: answer ParseComplete in order.
		if a.pending() > 0 || a.skipping {
			s.push(a, entry{kind: eSynthetic, synthetic: parseComplete, clientName: name, cst: st})
			return nil
		}
		return s.writeClient(parseComplete)
	}
	if conflict || a.st.stmts.MayHold(st.name) {
		if err := s.injectClose(a, st.name); err != nil {
			return err
		}
	}
	if err := s.ensureRoom(a); err != nil {
		return err
	}
	a.st.stmts.Add(st.name, st.key, s.p.stale.current(st.name), s.id) // before push, which forgets it if the server will skip it
	s.push(a, entry{kind: eParse, stmt: st.name, clientName: name, cst: st})
	return s.writeServer(a, st.parse)
}

var (
	parseComplete = []byte{'1', 0, 0, 0, 4}
	closeComplete = []byte{'3', 0, 0, 0, 4}
)

// handleBind handles a Bind message, renaming its statement.
func (s *session) handleBind(ctx context.Context) error {
	if s.p.cfg.Mode == ModeSession {
		return s.sessionForward(ctx, eBind)
	}
	body, err := s.cr.Body()
	if err != nil {
		return err
	}
	portal, rest, ok := wire.CString(body)
	var name []byte
	if ok {
		name, rest, ok = wire.CString(rest)
	}
	if !ok {
		return fatal(pgproto.CodeProtocolViolation, "invalid Bind message", nil)
	}
	s.mu.Lock()
	st := s.stmts[string(name)]
	s.mu.Unlock()
	run := st
	if len(name) == 0 {
		run = s.unnamed
	}
	var info sqlInfo
	if run != nil {
		info = run.info
		s.mu.Lock()
		s.checkHidden(&info, run.text(), &run.hid)
		s.mu.Unlock()
		if err := s.checkIdentity(info); err != nil {
			return s.raise(err, false)
		}
	}
	s.mu.Lock()
	s.pipeTyp, s.pipeBody, s.pipeText = 'B', body, lexedText{}
	s.pipeSeq = run == nil || info.readsSequences()
	a, err := s.attachLocked(ctx)
	if err != nil {
		s.mu.Unlock()
		return s.raise(err, false)
	}
	defer s.mu.Unlock()
	if run != nil {
		s.noteSQL(a, info)
	}
	st = s.stmts[string(name)] // the relay may have dropped it meanwhile (a failed Parse)
	switch {
	case len(name) == 0:
		if err := s.ensureUnnamed(a); err != nil {
			return err
		}
	case st != nil:
		if err := s.ensurePrepared(a, st); err != nil {
			return err
		}
		if pe := s.checkShape(a, st); pe != nil {
			return s.raiseStaleLocked(a, pe)
		}
	}
	if st == nil {
		// Unnamed, or unknown to us: the server answers (26000 if unknown).
		s.push(a, entry{kind: eBind})
		return s.writeServer(a, s.frame('B', body))
	}
	s.push(a, entry{kind: eBind, stmt: st.name, cst: st})
	frame := wire.AppendHeader(s.scratch[:0], 'B', len(portal)+1+len(st.name)+1+len(rest))
	frame = append(frame, portal...)
	frame = append(frame, 0)
	frame = append(frame, st.name...)
	frame = append(frame, 0)
	frame = append(frame, rest...)
	s.scratch = frame[:0]
	return s.writeServer(a, frame)
}

// frame rebuilds a complete message from a body read with Body.
func (s *session) frame(typ byte, body []byte) []byte {
	f := wire.AppendHeader(s.scratch[:0], typ, len(body))
	f = append(f, body...)
	s.scratch = f[:0]
	return f
}

// handleDescribe handles a Describe message, renaming its statement.
func (s *session) handleDescribe(ctx context.Context) error {
	if s.p.cfg.Mode == ModeSession {
		return s.forward(ctx, eDescribe)
	}
	body, err := s.cr.Body()
	if err != nil {
		return err
	}
	if len(body) < 2 {
		return fatal(pgproto.CodeProtocolViolation, "invalid Describe message", nil)
	}
	kind := body[0]
	name, _, ok := wire.CString(body[1:])
	if !ok || (kind != 'S' && kind != 'P') {
		return fatal(pgproto.CodeProtocolViolation, "invalid Describe message", nil)
	}
	s.mu.Lock()
	s.pipeTyp, s.pipeBody, s.pipeText = 'D', body, lexedText{}
	a, err := s.attachLocked(ctx)
	if err != nil {
		s.mu.Unlock()
		return s.raise(err, false)
	}
	defer s.mu.Unlock()
	var st *stmt
	if kind == 'S' && len(name) > 0 {
		st = s.stmts[string(name)]
	}
	if kind == 'S' {
		if len(name) == 0 {
			if err := s.ensureUnnamed(a); err != nil {
				return err
			}
		} else if st != nil {
			if err := s.ensurePrepared(a, st); err != nil {
				return err
			}
			if pe := s.checkShape(a, st); pe != nil {
				return s.raiseStaleLocked(a, pe)
			}
		}
	}
	if st == nil {
		s.push(a, entry{kind: eDescribe})
		return s.writeServer(a, s.frame('D', body))
	}
	s.push(a, entry{kind: eDescribe, stmt: st.name, cst: st})
	frame := wire.AppendHeader(s.scratch[:0], 'D', 1+len(st.name)+1)
	frame = append(frame, 'S')
	frame = append(frame, st.name...)
	frame = append(frame, 0)
	s.scratch = frame[:0]
	return s.writeServer(a, frame)
}

// handleClose handles a Close message. Closing a named statement only
// forgets the client's name; the server keeps the statement cached for
// everyone until evicted.
func (s *session) handleClose(ctx context.Context) error {
	if s.p.cfg.Mode == ModeSession {
		return s.forward(ctx, eClose)
	}
	body, err := s.cr.Body()
	if err != nil {
		return err
	}
	if len(body) < 2 {
		return fatal(pgproto.CodeProtocolViolation, "invalid Close message", nil)
	}
	kind := body[0]
	name, _, ok := wire.CString(body[1:])
	if !ok || (kind != 'S' && kind != 'P') {
		return fatal(pgproto.CodeProtocolViolation, "invalid Close message", nil)
	}
	if kind == 'S' && len(name) > 0 {
		s.mu.Lock()
		s.dropClientStmt(string(name))
		s.mu.Unlock()
		return s.respond(closeComplete, false)
	}
	if kind == 'S' {
		s.unnamed = nil
	}
	s.mu.Lock()
	a := s.currentLocked()
	if a == nil {
		s.mu.Unlock()
		// No transaction is open, so no portal exists and the unnamed
		// statement lives only in our memory: nothing to close on a server.
		return s.respond(closeComplete, false)
	}
	defer s.mu.Unlock()
	if kind == 'S' {
		a.st.stmts.DropUnnamed()
	}
	s.push(a, entry{kind: eClose})
	return s.writeServer(a, s.frame('C', body))
}

// handleQuery handles a simple Query. In transaction mode DEALLOCATE of a
// protocol-level statement is answered by the pooler, since those statements
// live in the pooler's map, not on any one server.
func (s *session) handleQuery(ctx context.Context) error {
	if s.p.cfg.Mode == ModeSession {
		return s.sessionQuery(ctx)
	}
	body, err := s.cr.Body()
	if err != nil {
		return err
	}
	sql, _, ok := wire.CString(body)
	if !ok {
		return fatal(pgproto.CodeProtocolViolation, "invalid Query message", nil)
	}
	switch verb, arg := classifyQuery(sql); verb {
	case "deallocate":
		s.mu.Lock()
		_, known := s.stmts[arg]
		switch {
		case arg == "all" && s.pin.held&sqllex.HeldPrepare == 0: // else SQL PREPAREs must go too
			s.clearClientStmts(nil)
			s.unnamed = nil
			s.mu.Unlock()
			return s.respond(commandComplete("DEALLOCATE ALL"), true)
		case known:
			s.dropClientStmt(arg)
			s.mu.Unlock()
			return s.respond(commandComplete("DEALLOCATE"), true)
		}
		s.mu.Unlock()
	}
	info := s.inspectQuery(sql)
	var memo *hiddenMemo
	if s.plainQuery.kept {
		memo = &s.plainQuery.hid
	}
	s.checkHidden(&info, sql, memo)
	if err := s.checkIdentity(info); err != nil {
		return s.raise(err, true)
	}
	s.mu.Lock()
	s.pipeTyp, s.pipeBody, s.pipeSeq = 'Q', body, info.readsSequences()
	s.pipeText = lexedText{text: sql, plain: info.pipe, fp: info.fp}
	a, err := s.attachLocked(ctx)
	s.pipeText = lexedText{}
	if err != nil {
		s.mu.Unlock()
		return s.raise(err, true)
	}
	defer s.mu.Unlock()
	s.noteSQL(a, info)
	s.push(a, entry{kind: eQuery})
	a.st.stmts.DropUnnamed() // a simple Query destroys the unnamed statement
	// A DEALLOCATE or DISCARD that reaches the server, in this protocol or
	// the extended one, is seen by its command tag (see serverDropped).
	if err := s.writeServerProbing(a, s.frame('Q', body), info); err != nil {
		return err
	}
	return s.followLocked(a)
}

// plainQuery is the text of a session's last simple Query when the lexer
// found nothing but plain statements in it, with the whole classification
// it got, so that a repeat returns exactly what inspectSQL returned.
type plainQuery struct {
	text []byte
	info sqlInfo
	// ints are the spans of text's integer constants (sqllex.IntegerSpans),
	// looked for (intsRead) the first time a text came that differs from
	// text in runs of digits only, as a simple-protocol client's do.
	ints     []sqllex.Span
	intsRead bool
	// kept reports that the last text inspectQuery read is text (it came
	// again, or was kept just now); hid is whether text names code
	// behind names (catalog.go), which a text differing in digits alone
	// does exactly when text does.
	kept bool
	hid  hiddenMemo
}

// maxPlainQuery bounds the text a session keeps for inspectQuery: what a
// session holds while idle stays small, and a longer text is rarely sent
// again unchanged.
const maxPlainQuery = 1024

// inspectQuery is inspectSQL for a simple Query's text. A client that
// sends the same plain text as its previous Query (what a polling loop,
// a health check or an application's fixed statement does) gets the
// classification that text got the first time after one comparison of
// the bytes instead of a run of the lexer (about 0.4 µs for "SELECT 1",
// 5 µs for a 200-byte SELECT). Classification is a function of the
// text alone, so equal bytes mean an equal result; only plain texts are
// kept, so a text that changes anything is always read again.
//
// A text that differs from the kept one only in the values of integer
// constants ("... WHERE aid = 42" after "... WHERE aid = 7") gets the
// kept classification too, after a comparison that skips runs of digits
// which the lexer took for such constants in the kept text: the lexer
// reads no number's value, and such a text lexes token for token as the
// kept one (sqllex.SameButIntegers says why), so inspectSQL would return
// the same. The constants' places are looked for once per kept text, and
// only when a text differing in digits alone comes.
func (s *session) inspectQuery(sql []byte) sqlInfo {
	m := &s.plainQuery
	if len(m.text) > 0 && (bytes.Equal(m.text, sql) || m.sameButIntegers(sql)) {
		m.kept = true
		return m.info
	}
	info := inspectSQL(sql)
	m.kept = false
	if info.pipe && info.params == nil && info.resets == nil && len(sql) <= maxPlainQuery {
		m.text, m.info = append(m.text[:0], sql...), info
		m.ints, m.intsRead = m.ints[:0], false
		m.kept, m.hid = true, hiddenMemo{}
	}
	return info
}

// sameButIntegers reports whether sql is m's text with other digits in
// some of its integer constants. m.text is not empty.
func (m *plainQuery) sameButIntegers(sql []byte) bool {
	if len(sql) == 0 {
		return false
	}
	a := unsafe.String(&m.text[0], len(m.text)) // neither is modified meanwhile
	b := unsafe.String(&sql[0], len(sql))
	if !m.intsRead {
		if !sqllex.DifferInDigitsOnly(a, b) {
			return false
		}
		m.ints, m.intsRead = sqllex.IntegerSpans(a, m.ints[:0]), true
	}
	return len(m.ints) > 0 && sqllex.SameButIntegers(a, b, m.ints)
}

// addClientStmt records a client's named statement. s.mu must be held.
func (s *session) addClientStmt(name string, st *stmt) {
	if s.stmts == nil {
		s.stmts = make(map[string]*stmt)
	}
	if old := s.stmts[name]; old != nil {
		s.stmtBytes -= old.size()
	}
	s.stmts[name] = st
	s.stmtBytes += st.size()
}

// dropClientStmt forgets a client's named statement. s.mu must be held.
func (s *session) dropClientStmt(name string) {
	if old := s.stmts[name]; old != nil {
		s.stmtBytes -= old.size()
		delete(s.stmts, name)
	}
}

// clearClientStmts forgets every named statement of the client except
// those in keep. s.mu must be held.
func (s *session) clearClientStmts(keep map[string]*stmt) {
	for name, st := range s.stmts {
		if keep[name] != st {
			s.dropClientStmt(name)
		}
	}
}

// Command tags of the statements that remove prepared statements.
var (
	tagDeallocateAll = []byte("DEALLOCATE ALL\x00")
	tagDeallocate    = []byte("DEALLOCATE\x00")
	tagDiscardAll    = []byte("DISCARD ALL\x00")
)

// serverDropped follows a CommandComplete that says the server removed
// prepared statements, whoever asked for it and in whichever protocol: the
// server's cache is emptied (certainly, or with every name in doubt after a
// DEALLOCATE of one unknown name), and a client's own DEALLOCATE ALL or
// DISCARD ALL removes its named statements as PostgreSQL would. Statements
// the pooler or the client staged behind it are created after it runs, so
// they are kept (the server's copies as names in doubt). s.mu must be held.
func (s *session) serverDropped(a *attachment, tag []byte, quiet bool) {
	var certain bool
	switch {
	case bytes.Equal(tag, tagDeallocateAll), bytes.Equal(tag, tagDiscardAll):
		certain = true
	case bytes.Equal(tag, tagDeallocate):
	default:
		return
	}
	a.st.stmts.Drop(certain)
	var later map[string]*stmt
	for i := a.head + 1; i < len(a.queue); i++ {
		e := &a.queue[i]
		if e.kind == eParse && e.stmt != "" {
			a.st.stmts.MarkMaybe(e.stmt)
		}
		if e.clientName != "" && e.cst != nil {
			if later == nil {
				later = make(map[string]*stmt)
			}
			later[e.clientName] = e.cst
		}
	}
	if certain && !quiet {
		s.clearClientStmts(later)
		s.unnamed = nil
	}
	if bytes.Equal(tag, tagDiscardAll) {
		// Every parameter is back at its default too.
		clear(a.st.set)
		a.st.syncedKey = ""
		a.st.lastUser = 0
	}
}

func commandComplete(tag string) []byte {
	b := wire.AppendHeader(nil, 'C', len(tag)+1)
	b = append(b, tag...)
	return append(b, 0)
}

// classifyQuery recognises "DEALLOCATE [PREPARE] name|ALL" standing alone. It returns the verb and the (unquoted) argument.
func classifyQuery(sql []byte) (verb, arg string) {
	if len(sql) > 256 || !startsWithD(sql) {
		return "", "" // the common case: no allocation
	}
	q := strings.TrimSpace(string(sql))
	q = strings.TrimSpace(strings.TrimSuffix(q, ";"))
	if strings.ContainsAny(q, ";-/") {
		return "", "" // several statements or comments: let the server decide
	}
	f := strings.Fields(q)
	if len(f) == 0 {
		return "", ""
	}
	switch strings.ToLower(f[0]) {
	case "deallocate":
		f = f[1:]
		if len(f) > 0 && strings.EqualFold(f[0], "prepare") {
			f = f[1:]
		}
		if len(f) != 1 {
			return "", ""
		}
		if strings.EqualFold(f[0], "all") {
			return "deallocate", "all"
		}
		name := f[0]
		if len(name) >= 2 && name[0] == '"' && name[len(name)-1] == '"' {
			name = strings.ReplaceAll(name[1:len(name)-1], `""`, `"`)
		} else {
			name = strings.ToLower(name)
		}
		return "deallocate", name
	}
	return "", ""
}

func startsWithD(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case 'd', 'D':
			return true
		default:
			return false
		}
	}
	return false
}
