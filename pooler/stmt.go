package pooler

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/pgquic/pgquic/internal/wire"
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
// This follows the lessons of PgBouncer 1.21+, PgCat and PgDog (see
// DESIGN.md "Pitfalls others hit").

const serverStmtPrefix = "pgq_"

// stmt is one client statement as the pooler replays it.
type stmt struct {
	key   string // query text, NUL, parameter count and OIDs: the statement's identity
	name  string // server-side name; "" for the unnamed statement
	parse []byte // complete Parse frame under the server name
}

func newStmt(name, key string) *stmt {
	frame := wire.AppendHeader(make([]byte, 0, 5+len(name)+1+len(key)), 'P', len(name)+1+len(key))
	frame = append(frame, name...)
	frame = append(frame, 0)
	frame = append(frame, key...)
	return &stmt{key: key, name: name, parse: frame}
}

func serverStmtName(key string) string {
	h := sha256.Sum256([]byte(key))
	return serverStmtPrefix + hex.EncodeToString(h[:12])
}

// serverState is what the pooler knows about one server connection: the
// statements prepared on it, its unnamed statement, and the run-time
// parameters the pooler set on it that the server does not report.
type serverState struct {
	lru        *list.List // of *cachedStmt, most recent first
	byName     map[string]*list.Element
	unnamedKey string
	unnamedOK  bool
	set        map[string]string
	syncedKey  string // parameters of the last session synced, serialised (see syncParams)
	poisoned   bool   // state unknown (DISCARD ALL ran): destroy at release
}

type cachedStmt struct{ name, key string }

func newServerState() *serverState {
	return &serverState{lru: list.New(), byName: make(map[string]*list.Element), set: make(map[string]string)}
}

// lookup reports whether the server holds name for key, and whether it
// holds name for another key (a hash collision).
func (st *serverState) lookup(name, key string) (present, conflict bool) {
	el := st.byName[name]
	if el == nil {
		return false, false
	}
	if el.Value.(*cachedStmt).key != key {
		return false, true
	}
	st.lru.MoveToFront(el)
	return true, false
}

func (st *serverState) add(name, key string) {
	st.byName[name] = st.lru.PushFront(&cachedStmt{name: name, key: key})
}

func (st *serverState) remove(name string) {
	if el := st.byName[name]; el != nil {
		st.lru.Remove(el)
		delete(st.byName, name)
	}
}

func (st *serverState) oldest() string {
	if el := st.lru.Back(); el != nil {
		return el.Value.(*cachedStmt).name
	}
	return ""
}

// forget drops what a failed (or skipped) Parse would have created.
func (st *serverState) forget(e *entry) {
	if e.unnamed {
		st.unnamedOK = false
		return
	}
	if e.stmt != "" {
		st.remove(e.stmt)
	}
}

// reset forgets everything after DISCARD ALL.
func (st *serverState) reset() {
	st.lru.Init()
	clear(st.byName)
	clear(st.set)
	st.syncedKey = ""
	st.unnamedOK = false
	st.poisoned = false
}

// ensurePrepared makes sure a's server holds st, replaying the Parse when it
// does not. s.mu must be held.
func (s *session) ensurePrepared(a *attachment, st *stmt) error {
	present, conflict := a.st.lookup(st.name, st.key)
	if present {
		return nil
	}
	if conflict {
		if err := s.injectClose(a, st.name); err != nil {
			return err
		}
	}
	if err := s.ensureRoom(a); err != nil {
		return err
	}
	s.push(a, entry{kind: eParse, injected: true, stmt: st.name})
	a.st.add(st.name, st.key)
	s.p.m.prepares.Inc()
	return s.writeServer(a, st.parse)
}

// ensureUnnamed replays the client's unnamed statement on a server that does
// not hold it (a Bind of "" in a later transaction). s.mu must be held.
func (s *session) ensureUnnamed(a *attachment) error {
	u := s.unnamed
	if u == nil || (a.st.unnamedOK && a.st.unnamedKey == u.key) {
		return nil
	}
	s.push(a, entry{kind: eParse, injected: true, unnamed: true})
	a.st.unnamedKey, a.st.unnamedOK = u.key, true
	s.p.m.prepares.Inc()
	return s.writeServer(a, u.parse)
}

// ensureRoom evicts least recently used statements beyond the cache size.
func (s *session) ensureRoom(a *attachment) error {
	for a.st.lru.Len() >= s.p.cfg.StatementCacheSize {
		if err := s.injectClose(a, a.st.oldest()); err != nil {
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
	s.push(a, entry{kind: eClose, injected: true})
	a.st.remove(name)
	return s.writeServer(a, frame)
}

// handleParse handles a Parse message.
func (s *session) handleParse(ctx context.Context) error {
	if s.p.cfg.Mode == ModeSession {
		return s.forward(ctx, eParse)
	}
	body, err := s.cr.Body()
	if err != nil {
		return err
	}
	nameB, rest, ok := wire.CString(body)
	if !ok || len(rest) < 3 {
		return fatal(codeProtocolViolation, "invalid Parse message", nil)
	}
	name, key := string(nameB), string(rest)
	if name == "" {
		u := newStmt("", key)
		s.unnamed = u
		a, err := s.attach(ctx)
		if err != nil {
			return s.raise(err, false)
		}
		s.push(a, entry{kind: eParse, unnamed: true})
		a.st.unnamedKey, a.st.unnamedOK = key, true
		err = s.writeServer(a, u.parse)
		s.mu.Unlock()
		return err
	}
	a, err := s.attach(ctx)
	if err != nil {
		return s.raise(err, false)
	}
	if _, exists := s.stmts[name]; exists {
		s.mu.Unlock()
		return s.raise(pgerr(codeDuplicatePStatement, fmt.Sprintf("prepared statement %q already exists", name), nil), false)
	}
	if len(s.stmts) >= s.p.cfg.ClientStatementLimit {
		s.mu.Unlock()
		return s.raise(pgerr(codeInsufficientResource,
			fmt.Sprintf("too many prepared statements (limit %d per client)", s.p.cfg.ClientStatementLimit), nil), false)
	}
	defer s.mu.Unlock()
	st := newStmt(serverStmtName(key), key)
	if s.stmts == nil {
		s.stmts = make(map[string]*stmt)
	}
	// The name exists for the client only once the server accepts the
	// Parse: the relay removes it again if the Parse fails or is skipped.
	s.stmts[name] = st
	if present, _ := a.st.lookup(st.name, st.key); present {
		// The server already has it: answer ParseComplete in order.
		if a.pending() > 0 || a.skipping {
			s.push(a, entry{kind: eSynthetic, synthetic: parseComplete, clientName: name, cst: st})
			return nil
		}
		return s.writeClient(parseComplete)
	}
	if err := s.ensureRoom(a); err != nil {
		return err
	}
	s.push(a, entry{kind: eParse, stmt: st.name, clientName: name, cst: st})
	a.st.add(st.name, st.key)
	return s.writeServer(a, st.parse)
}

var (
	parseComplete = []byte{'1', 0, 0, 0, 4}
	closeComplete = []byte{'3', 0, 0, 0, 4}
)

// handleBind handles a Bind message, renaming its statement.
func (s *session) handleBind(ctx context.Context) error {
	if s.p.cfg.Mode == ModeSession {
		return s.forward(ctx, eBind)
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
		return fatal(codeProtocolViolation, "invalid Bind message", nil)
	}
	a, err := s.attach(ctx)
	if err != nil {
		return s.raise(err, false)
	}
	defer s.mu.Unlock()
	st := s.stmts[string(name)]
	switch {
	case len(name) == 0:
		if err := s.ensureUnnamed(a); err != nil {
			return err
		}
	case st != nil:
		if err := s.ensurePrepared(a, st); err != nil {
			return err
		}
	}
	s.push(a, entry{kind: eBind})
	if st == nil {
		// Unnamed, or unknown to us: the server answers (26000 if unknown).
		return s.writeServer(a, s.frame('B', body))
	}
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
		return fatal(codeProtocolViolation, "invalid Describe message", nil)
	}
	kind := body[0]
	name, _, ok := wire.CString(body[1:])
	if !ok || (kind != 'S' && kind != 'P') {
		return fatal(codeProtocolViolation, "invalid Describe message", nil)
	}
	a, err := s.attach(ctx)
	if err != nil {
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
		}
	}
	s.push(a, entry{kind: eDescribe})
	if st == nil {
		return s.writeServer(a, s.frame('D', body))
	}
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
		return fatal(codeProtocolViolation, "invalid Close message", nil)
	}
	kind := body[0]
	name, _, ok := wire.CString(body[1:])
	if !ok || (kind != 'S' && kind != 'P') {
		return fatal(codeProtocolViolation, "invalid Close message", nil)
	}
	if kind == 'S' && len(name) > 0 {
		s.mu.Lock()
		delete(s.stmts, string(name))
		s.mu.Unlock()
		return s.respond(closeComplete, false)
	}
	if kind == 'S' {
		s.unnamed = nil
	}
	a := s.current()
	if a == nil {
		// No transaction is open, so no portal exists and the unnamed
		// statement lives only in our memory: nothing to close on a server.
		return s.respond(closeComplete, false)
	}
	defer s.mu.Unlock()
	if kind == 'S' {
		a.st.unnamedOK = false
	}
	s.push(a, entry{kind: eClose})
	return s.writeServer(a, s.frame('C', body))
}

// handleQuery handles a simple Query. In transaction mode DEALLOCATE of a
// protocol-level statement is answered by the pooler, since those statements
// live in the pooler's map, not on any one server.
func (s *session) handleQuery(ctx context.Context) error {
	if s.p.cfg.Mode == ModeSession {
		return s.forward(ctx, eQuery)
	}
	body, err := s.cr.Body()
	if err != nil {
		return err
	}
	sql, _, ok := wire.CString(body)
	if !ok {
		return fatal(codeProtocolViolation, "invalid Query message", nil)
	}
	switch verb, arg := classifyQuery(sql); verb {
	case "deallocate":
		s.mu.Lock()
		_, known := s.stmts[arg]
		switch {
		case arg == "all":
			clear(s.stmts)
			s.unnamed = nil
			s.mu.Unlock()
			return s.respond(commandComplete("DEALLOCATE ALL"), true)
		case known:
			delete(s.stmts, arg)
			s.mu.Unlock()
			return s.respond(commandComplete("DEALLOCATE"), true)
		}
		s.mu.Unlock()
	case "discard all":
		s.mu.Lock()
		clear(s.stmts)
		s.unnamed = nil
		s.mu.Unlock()
	}
	a, err := s.attach(ctx)
	if err != nil {
		return s.raise(err, true)
	}
	defer s.mu.Unlock()
	s.push(a, entry{kind: eQuery})
	a.st.unnamedOK = false // a simple Query destroys the unnamed statement
	if mayDropStatements(sql) {
		// DISCARD ALL or DEALLOCATE ALL reached the server: what it holds
		// is no longer known, so it is not reused.
		a.st.poisoned = true
	}
	return s.writeServer(a, s.frame('Q', body))
}

func commandComplete(tag string) []byte {
	b := wire.AppendHeader(nil, 'C', len(tag)+1)
	b = append(b, tag...)
	return append(b, 0)
}

// classifyQuery recognises "DEALLOCATE [PREPARE] name|ALL" and "DISCARD
// ALL" standing alone. It returns the verb and the (unquoted) argument.
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
	case "discard":
		if len(f) == 2 && strings.EqualFold(f[1], "all") {
			return "discard all", ""
		}
	}
	return "", ""
}

// mayDropStatements reports whether a query might remove prepared
// statements the pooler placed on the server.
func mayDropStatements(sql []byte) bool {
	return containsFold(sql, "discard") || (containsFold(sql, "deallocate") && containsFold(sql, "all"))
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

// containsFold reports whether b contains the lower-case ASCII word w,
// ignoring case, without allocating.
func containsFold(b []byte, w string) bool {
	for i := 0; i+len(w) <= len(b); i++ {
		j := 0
		for ; j < len(w); j++ {
			if b[i+j]|0x20 != w[j] {
				break
			}
		}
		if j == len(w) {
			return true
		}
	}
	return false
}
