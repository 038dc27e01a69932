package sqllex

// classifier reads the leading tokens of one statement and decides what the
// statement is. Its lexer is a copy, so reading ahead costs the main scan
// nothing; a semicolon reads as the end of the statement.
type classifier struct {
	src           string
	l             lexer
	text          bool // fill in Name (allocates)
	escapeStrings bool
	st            Stmt // the statement being classified; held by value so it stays on the stack
	peeked        bool
	pk            token
	done          bool
}

// next returns the next token of the statement, or tEOF at its end.
func (c *classifier) next() token {
	if c.peeked {
		c.peeked = false
		return c.pk
	}
	if c.done {
		return token{kind: tEOF}
	}
	t := c.l.next()
	if t.kind == tSemi || t.kind == tBad || t.kind == tEOF {
		c.done = true
		return token{kind: tEOF}
	}
	return t
}

// peek returns the token next would return, without taking it.
func (c *classifier) peek() token {
	if !c.peeked {
		c.pk = c.next()
		c.peeked = true
	}
	return c.pk
}

// is reports whether t is the unquoted keyword kw (lower case).
func (c *classifier) is(t token, kw string) bool {
	return t.kind == tIdent && eqFold(c.src[t.start:t.end], kw)
}

// isOp reports whether t is the operator or punctuation op.
func (c *classifier) isOp(t token, op string) bool {
	return t.kind == tOp && c.src[t.start:t.end] == op
}

func isWord(t token) bool { return t.kind == tIdent || t.kind == tQIdent }

// name records t (an identifier or a string constant) as the statement's
// Name when names are wanted.
func (c *classifier) name(t token) {
	if !c.text {
		return
	}
	var b []byte
	ok := false
	switch t.kind {
	case tIdent, tQIdent:
		b, ok = appendIdent(nil, c.src, t)
	case tString, tDollar:
		var st decodeStatus
		b, st = appendValue(nil, c.src, t, c.escapeStrings, t.end-t.start)
		ok = st == decodeOK
	}
	if ok {
		c.st.Name = string(b)
	}
}

// setName records a fixed Name when names are wanted.
func (c *classifier) setName(name string) {
	if c.text {
		c.st.Name = name
	}
}

// head classifies the statement by its first keywords.
func (c *classifier) head() {
	t := c.next()
	if t.kind != tIdent {
		return
	}
	var buf [len("deallocate")]byte // the longest keyword below
	w, ok := lowerKeyword(c.src[t.start:t.end], buf[:])
	if !ok {
		return
	}
	st := &c.st
	switch string(w) {
	case "set":
		c.set()
	case "reset":
		c.reset()
	case "begin":
		st.Flags |= Begin
	case "start":
		if c.is(c.next(), "transaction") {
			st.Flags |= Begin
		}
	case "commit":
		c.commit()
	case "end":
		st.Flags |= Commit | c.chain()
	case "abort":
		st.Flags |= Rollback | c.chain()
	case "rollback":
		c.rollback()
	case "savepoint":
		st.Flags |= Savepoint
		c.name(c.next())
	case "release":
		st.Flags |= Release
		c.name(c.skipOptional("savepoint"))
	case "prepare":
		c.prepare()
	case "execute":
		st.Flags |= Execute
		c.name(c.next())
	case "deallocate":
		c.deallocate()
	case "discard":
		c.discard()
	case "copy":
		st.Flags |= Copy
	case "listen":
		st.Flags |= Listen
		c.name(c.next())
	case "notify":
		st.Flags |= Notify
		c.name(c.next())
	case "unlisten":
		c.unlisten()
	case "declare":
		c.declare()
	case "create":
		st.Flags |= SchemaChange
		c.create()
	case "do":
		st.Flags |= DoBlock
	case "call":
		st.Flags |= Call
	case "load":
		st.Flags |= Load
	case "analyze", "analyse", "vacuum", "cluster", "reindex":
		st.Flags |= Maintenance
	case "close":
		st.Flags |= CloseCursor
		if n := c.next(); !c.is(n, "all") {
			c.name(n)
		}
	case "drop":
		st.Flags |= Drop | SchemaChange
	case "alter":
		st.Flags |= SchemaChange
	case "explain":
		c.explain()
	}
}

// lowerKeyword copies word into buf in lower case (ASCII letters only, as
// eqFold compares) and reports false when it is longer than buf, so no
// keyword head looks for.
func lowerKeyword(word string, buf []byte) ([]byte, bool) {
	if len(word) > len(buf) {
		return nil, false
	}
	for i := 0; i < len(word); i++ {
		ch := word[i]
		if 'A' <= ch && ch <= 'Z' {
			ch += 'a' - 'A'
		}
		buf[i] = ch
	}
	return buf[:len(word)], true
}

// commit is COMMIT [AND [NO] CHAIN] or COMMIT PREPARED 'gid'.
func (c *classifier) commit() {
	if c.is(c.peek(), "prepared") {
		c.next()
		c.st.Flags |= CommitPrepared
		c.name(c.next())
		return
	}
	c.st.Flags |= Commit | c.chain()
}

// prepare is PREPARE name AS ... or PREPARE TRANSACTION 'gid'.
func (c *classifier) prepare() {
	if n := c.next(); c.is(n, "transaction") && c.peek().kind == tString {
		c.st.Flags |= PrepareTransaction
		c.name(c.next())
	} else {
		c.st.Flags |= Prepare
		c.name(n)
	}
}

// deallocate is DEALLOCATE [PREPARE] name or DEALLOCATE [PREPARE] ALL.
func (c *classifier) deallocate() {
	c.st.Flags |= Deallocate
	if n := c.skipOptional("prepare"); c.is(n, "all") {
		c.st.Flags |= DeallocateAll
	} else {
		c.name(n)
	}
}

// discard is DISCARD ALL, PLANS, SEQUENCES or TEMP[ORARY].
func (c *classifier) discard() {
	switch n := c.next(); {
	case c.is(n, "all"):
		c.st.Flags |= DiscardAll
	case c.is(n, "plans"):
		c.st.Flags |= DiscardPlans
	case c.is(n, "sequences"):
		c.st.Flags |= DiscardSequences
	case c.is(n, "temp"), c.is(n, "temporary"):
		c.st.Flags |= DiscardTemp
	}
}

// unlisten is UNLISTEN channel or UNLISTEN *.
func (c *classifier) unlisten() {
	c.st.Flags |= Unlisten
	if n := c.next(); c.isOp(n, "*") {
		c.setName("*")
	} else {
		c.name(n)
	}
}

// skipOptional takes the next token and, when it is the keyword kw followed
// by a name, the one after: RELEASE [SAVEPOINT] name, DEALLOCATE [PREPARE]
// name. Without a name after it, kw is itself the name.
func (c *classifier) skipOptional(kw string) token {
	n := c.next()
	if c.is(n, kw) && isWord(c.peek()) {
		n = c.next()
	}
	return n
}

// chain reads [WORK|TRANSACTION] [AND [NO] CHAIN] after COMMIT, END,
// ROLLBACK or ABORT.
func (c *classifier) chain() Flags {
	n := c.next()
	if c.is(n, "work") || c.is(n, "transaction") {
		n = c.next()
	}
	if c.is(n, "and") && c.is(c.next(), "chain") {
		return Chain
	}
	return 0
}

// rollback reads ROLLBACK PREPARED 'gid', ROLLBACK [WORK|TRANSACTION] TO
// [SAVEPOINT] name, or a plain ROLLBACK.
func (c *classifier) rollback() {
	st := &c.st
	if c.is(c.peek(), "prepared") {
		c.next()
		st.Flags |= RollbackPrepared
		c.name(c.next())
		return
	}
	if p := c.peek(); c.is(p, "work") || c.is(p, "transaction") {
		c.next()
	}
	if c.is(c.peek(), "to") {
		c.next()
		st.Flags |= RollbackTo
		c.name(c.skipOptional("savepoint"))
		return
	}
	st.Flags |= Rollback | c.chain()
}

// varFollows reports whether p, the token after a word, makes that word a
// parameter name: '.', '=' or TO follow names in SET and RESET.
func (c *classifier) varFollows(p token) bool {
	return c.isOp(p, ".") || c.isOp(p, "=") || c.is(p, "to")
}

// set reads SET [SESSION|LOCAL] … .
func (c *classifier) set() {
	st := &c.st
	t := c.next()
	local := false
	if c.is(t, "local") || c.is(t, "session") {
		p := c.peek()
		if !c.varFollows(p) && !(c.is(t, "session") && (c.is(p, "authorization") || c.is(p, "characteristics"))) {
			local = c.is(t, "local")
			t = c.next()
		}
	}
	if p := c.peek(); t.kind == tIdent && !c.varFollows(p) {
		switch {
		case c.is(t, "role"):
			st.Flags |= pick(local, SetRoleLocal, SetRole)
			c.setName("role")
			return
		case c.is(t, "session") && c.is(p, "authorization"):
			st.Flags |= pick(local, SetSessionAuthLocal, SetSessionAuth)
			c.setName("session_authorization")
			return
		case c.is(t, "session") && c.is(p, "characteristics"):
			st.Flags |= pick(local, SetParamLocal, SessionCharacteristics)
			return
		case c.is(t, "transaction"), c.is(t, "constraints"):
			st.Flags |= SetTransaction
			return
		case c.is(t, "time") && c.is(p, "zone"):
			c.param(local, "timezone")
			return
		case c.is(t, "names"):
			c.param(local, "client_encoding")
			return
		case c.is(t, "schema"):
			c.param(local, "search_path")
			return
		case c.is(t, "xml") && c.is(p, "option"):
			c.param(local, "xmloption")
			return
		}
	}
	c.variable(t, local, false)
}

// param flags a SET of the parameter name.
func (c *classifier) param(local bool, name string) {
	c.st.Flags |= pick(local, SetParamLocal, SetParam)
	c.setName(name)
}

// reset reads RESET … .
func (c *classifier) reset() {
	st := &c.st
	t := c.next()
	p := c.peek()
	switch {
	case c.is(t, "all"):
		st.Flags |= ResetAll
	case c.is(t, "time") && c.is(p, "zone"):
		st.Flags |= ResetParam
		c.setName("timezone")
	case c.is(t, "transaction") && c.is(p, "isolation"):
		st.Flags |= ResetParam
		c.setName("transaction_isolation")
	case c.is(t, "session") && c.is(p, "authorization"):
		st.Flags |= ResetSessionAuth
		c.setName("session_authorization")
	default:
		c.variable(t, false, true)
	}
}

// variable reads a parameter name (name[.name…]) starting at t and flags
// its SET or RESET. PostgreSQL looks parameters up ignoring case, so a
// quoted "Role" is the role too.
func (c *classifier) variable(t token, local, reset bool) {
	st := &c.st
	if !isWord(t) {
		st.Flags |= pick(reset, ResetParam, pick(local, SetParamLocal, SetParam))
		return
	}
	var buf [nameMax + 1]byte
	first, _ := appendIdent(buf[:0], c.src, t)
	var full []byte
	if c.text {
		full = append(full, first...)
	}
	dotted := false
	for c.isOp(c.peek(), ".") {
		c.next()
		n := c.next()
		if !isWord(n) {
			break
		}
		dotted = true
		if c.text {
			full = append(full, '.')
			full, _ = appendIdent(full, c.src, n)
		}
	}
	switch {
	case !dotted && eqFold(first, "role"):
		st.Flags |= pick(reset, ResetRole, pick(local, SetRoleLocal, SetRole))
		c.setName("role")
	case !dotted && eqFold(first, "session_authorization"):
		st.Flags |= pick(reset, ResetSessionAuth, pick(local, SetSessionAuthLocal, SetSessionAuth))
		c.setName("session_authorization")
	default:
		st.Flags |= pick(reset, ResetParam, pick(local, SetParamLocal, SetParam))
		if c.text {
			st.Name = string(full)
		}
	}
}

// declare reads DECLARE name [options] CURSOR [WITH|WITHOUT HOLD] FOR … .
func (c *classifier) declare() {
	st := &c.st
	c.name(c.next())
	for {
		t := c.next()
		switch {
		case c.is(t, "cursor"):
			st.Flags |= DeclareCursor
			if c.is(c.next(), "with") && c.is(c.next(), "hold") {
				st.Flags |= DeclareHold
			}
			return
		case c.is(t, "binary"), c.is(t, "insensitive"), c.is(t, "asensitive"),
			c.is(t, "no"), c.is(t, "scroll"):
		default:
			return
		}
	}
}

// create reads CREATE [OR REPLACE] [GLOBAL|LOCAL] TEMP|TEMPORARY …, or a
// CREATE whose first name is qualified by pg_temp.
func (c *classifier) create() {
	t := c.next()
	if c.is(t, "or") {
		c.next() // REPLACE
		t = c.next()
	}
	if c.is(t, "global") || c.is(t, "local") {
		t = c.next()
	}
	if c.is(t, "temp") || c.is(t, "temporary") {
		c.st.Flags |= CreateTemp
		return
	}
	for range 12 {
		if t.kind == tEOF || t.kind == tLParen {
			return
		}
		if isPgTemp(c.src, t) && c.isOp(c.peek(), ".") {
			c.st.Flags |= CreateTemp
			return
		}
		t = c.next()
	}
}

// isPgTemp reports whether t names the session's temporary schema: pg_temp
// or pg_temp_N.
func isPgTemp(src string, t token) bool {
	var buf [2*nameMax + 2]byte
	if !isWord(t) || t.end-t.start > 2*nameMax {
		return false
	}
	name, _ := appendIdent(buf[:0], src, t)
	if len(name) < 7 || string(name[:7]) != "pg_temp" {
		return false
	}
	if len(name) == 7 {
		return true
	}
	if name[7] != '_' || len(name) == 8 {
		return false
	}
	for _, d := range name[8:] {
		if !isDigit(d) {
			return false
		}
	}
	return true
}

// explain reads EXPLAIN [(options) | ANALYZE | VERBOSE …] and classifies
// what follows when it uses session state: EXECUTE of a prepared statement,
// or CREATE TEMP … AS.
func (c *classifier) explain() {
	t := c.next()
	if t.kind == tLParen {
		for depth := 1; depth > 0; {
			switch t = c.next(); t.kind {
			case tEOF:
				return
			case tLParen:
				depth++
			case tRParen:
				depth--
			}
		}
		t = c.next()
	}
	for c.is(t, "analyze") || c.is(t, "analyse") || c.is(t, "verbose") {
		t = c.next()
	}
	switch {
	case c.is(t, "execute"):
		c.st.Flags |= Execute
		c.name(c.next())
	case c.is(t, "create"):
		c.create()
	}
}

// words fills in the statement's leading words.
func (c *classifier) words() {
	st := &c.st
	for st.nwords < MaxWords {
		t := c.next()
		if !isWord(t) {
			return
		}
		st.words[st.nwords] = Word{Text: c.wordText(t), Quoted: t.kind == tQIdent}
		st.nwords++
	}
}

// wordText returns the text of identifier t, sharing the input or a static
// string when it can.
func (c *classifier) wordText(t token) string {
	w := c.src[t.start:t.end]
	if t.kind == tIdent && len(w) <= nameMax {
		upper := false
		for i := 0; i < len(w); i++ {
			if 'A' <= w[i] && w[i] <= 'Z' {
				upper = true
				break
			}
		}
		if !upper {
			return w
		}
		var buf [nameMax]byte
		for i := 0; i < len(w); i++ {
			c := w[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			buf[i] = c
		}
		if kw, ok := keywords[string(buf[:len(w)])]; ok {
			return kw
		}
		return string(buf[:len(w)])
	}
	b, _ := appendIdent(nil, c.src, t)
	return string(b)
}

// keywords holds common leading words, so folding them allocates nothing.
var keywords = func() map[string]string {
	m := map[string]string{}
	for _, w := range []string{
		"abort", "all", "alter", "analyze", "as", "authorization", "begin", "call",
		"characteristics", "checkpoint", "close", "cluster", "comment", "commit", "copy",
		"create", "cursor", "deallocate", "declare", "default", "delete", "discard", "do",
		"drop", "end", "execute", "explain", "fetch", "from", "function", "global", "grant",
		"hold", "insert", "into", "isolation", "listen", "load", "local", "lock", "merge",
		"move", "names", "none", "notify", "or", "plans", "prepare", "prepared", "procedure",
		"refresh", "reindex", "release", "replace", "reset", "revoke", "role", "rollback",
		"savepoint", "schema", "select", "sequences", "session", "set", "show", "start",
		"table", "temp", "temporary", "time", "to", "transaction", "truncate", "unlisten",
		"update", "vacuum", "values", "view", "with", "work", "zone",
	} {
		m[w] = w
	}
	return m
}()
