package sqllex

// scan splits sql into statements, classifies each and calls f with it until
// f returns false. With text set it also fills in names and words, which may
// allocate. It reports whether a plain string held a backslash.
//
// Statements end at a semicolon outside parentheses and outside the
// BEGIN ATOMIC … END body of CREATE [OR REPLACE] FUNCTION|PROCEDURE, as
// psql splits them. PostgreSQL parses a whole simple Query before running
// any of it, so text that would split otherwise is a syntax error there and
// runs nothing.
func scan(sql string, escapeStrings, text bool, f func(Stmt) bool) bool {
	l := lexer{src: sql, escapeStrings: escapeStrings}
	var st Stmt
	var ss stmtScan
	open := false
	for {
		before := l
		t := l.next()
		if t.kind == tEOF {
			break
		}
		if t.kind == tSemi && ss.paren == 0 && ss.begin == 0 {
			if open {
				open = false
				if !f(st) {
					return l.backslash
				}
			}
			continue
		}
		if !open {
			open = true
			ss = stmtScan{src: sql, escapeStrings: escapeStrings}
			c := classifier{src: sql, l: before, text: text, escapeStrings: escapeStrings, st: Stmt{Start: t.start}}
			c.head()
			if text {
				c.l, c.peeked, c.done = before, false, false
				c.words()
			}
			st = c.st
		}
		st.End = t.end
		st.Flags |= ss.token(t, l)
	}
	if open {
		if ss.paren > 0 || ss.begin > 0 {
			st.Flags |= Incomplete
		}
		f(st)
	}
	return l.backslash
}

// stmtScan follows one statement token by token: parentheses, the
// BEGIN ATOMIC body of a routine, function calls (set_config, advisory
// locks, OtherBackend and OpaqueCall; see builtins.go), writes to
// pg_settings, and SELECT … INTO TEMP or INTO pg_temp.name.
type stmtScan struct {
	src           string
	escapeStrings bool
	paren         int     // open parentheses
	begin         int     // open BEGIN ATOMIC (and CASE inside it) blocks
	ids           [4]byte // first letters of create/or/replace/function/procedure among the first words
	nids          int     // unquoted words seen
	pending

	last      token // the previous token; kind tEOF at the start
	lastKw    kw    // the watched keyword last is, if any
	beforeDot token // the name before the last '.', when last is a '.' after a name; else kind tEOF
	qual      token // the qualifier of the name last ends (schema.name); kind tEOF when unqualified
	named     bool  // the name last ends follows a word that names it rather than calls it (INTO, TABLE, AS…)
}

// pending is what the previous tokens leave for the next one alone: each
// token takes it and clears it. It is a type of its own so that token can
// hand it to the keyword rules in one piece.
type pending struct {
	afterInsert bool // the previous token was INSERT or MERGE
	afterDelete bool // the previous token was DELETE
	into        bool // the previous tokens were INTO [GLOBAL|LOCAL] [TABLE], not after INSERT or MERGE
	target      bool // the next name is written to: after UPDATE [ONLY], INSERT/MERGE INTO, DELETE FROM [ONLY], pg_catalog.
}

// token takes the next token of the statement; l is the lexer just past it.
func (ss *stmtScan) token(t token, l lexer) Flags {
	p := ss.pending
	ss.pending = pending{}
	last, lastKw := ss.last, ss.lastKw
	ss.last, ss.lastKw = t, kwNone
	var f Flags
	switch t.kind {
	case tBad:
		return Incomplete
	case tLParen:
		ss.paren++
		if isWord(last) && !ss.routine() && !ss.named {
			f = ss.call(last, l)
		}
	case tRParen:
		if ss.paren > 0 {
			ss.paren--
		}
	case tOp:
		if ss.src[t.start:t.end] == "." {
			ss.beforeDot = token{kind: tEOF}
			if isWord(last) {
				ss.beforeDot = last
				ss.target = p.target
			}
		}
	case tQIdent:
		ss.chain(last, lastKw)
		switch {
		case p.into && isPgTemp(ss.src, t) && isDot(ss.src, l):
			return CreateTemp
		case p.target:
			f = ss.written(t, l)
		}
	case tIdent:
		ss.chain(last, lastKw)
		w := ss.src[t.start:t.end]
		var k kw
		if len(w) <= 6 {
			k = loopKeyword(w)
		} else {
			k = longLoopKeyword(w)
		}
		ss.lastKw = k
		// Only a letter is stored, never the 0 that ids holds already:
		// routine reads all four bytes of ids at once just below, and a
		// one-byte store right before that read stalls it (storing on
		// every word made Classify about a tenth slower).
		if c := routineLetter(k); c != 0 && ss.nids < len(ss.ids) {
			ss.ids[ss.nids] = c
		}
		ss.nids++
		if ss.paren == 0 && ss.routine() {
			ss.routineBlock(k, l)
		}
		// Most words are names and no watched keyword: they need the
		// rules below only when the words before them left something
		// pending.
		if k != kwNone || p.into || p.target {
			return ss.keyword(t, l, k, p)
		}
	}
	return f
}

// routineLetter returns the letter ids records for a leading word k of
// CREATE [OR REPLACE] FUNCTION|PROCEDURE, which routine reads, and 0 for
// any other word. It is a function of its own so that token stays short,
// and small enough to be inlined there.
func routineLetter(k kw) byte {
	switch k {
	case kwCreate:
		return 'c'
	case kwOr:
		return 'o'
	case kwReplace:
		return 'r'
	case kwFunction:
		return 'f'
	case kwProcedure:
		return 'p'
	}
	return 0
}

// routineBlock follows the BEGIN ATOMIC … END body of a routine being
// created, outside parentheses, for the word k that l is just past: CASE
// opens a block inside it that END closes too, so only the END of the
// outermost block lets a semicolon end the statement. It is kept apart
// from token because only CREATE FUNCTION|PROCEDURE needs it.
func (ss *stmtScan) routineBlock(k kw, l lexer) {
	switch k {
	case kwBegin:
		peek := l
		if n := peek.next(); n.kind == tIdent && eqFold(ss.src[n.start:n.end], "atomic") {
			ss.begin++
		}
	case kwCase:
		if ss.begin > 0 {
			ss.begin++
		}
	case kwEnd:
		if ss.begin > 0 {
			ss.begin--
		}
	}
}

// keyword applies the write-target and SELECT … INTO rules to the word t,
// the watched keyword k (or kwNone for a name), given what the words
// before it left pending in p; l is the lexer just past t. It is split
// from token, which calls it only for a watched keyword or when p asks
// for the next word, so that most names in a statement skip it.
func (ss *stmtScan) keyword(t token, l lexer, k kw, p pending) Flags {
	switch {
	case k == kwInsert:
		ss.afterInsert = true
	case k == kwDelete:
		ss.afterDelete = true
	case k == kwUpdate:
		ss.target = true
	case k == kwFrom && p.afterDelete:
		ss.target = true
	case k == kwOnly && p.target:
		ss.target = true
	case k == kwInto:
		ss.into = !p.afterInsert
		ss.target = p.afterInsert
		if !p.afterInsert {
			// SELECT … INTO name is CREATE TABLE … AS in disguise.
			return SchemaChange
		}
	case p.into && (k == kwLocal || k == kwTable):
		ss.into = true
	case p.into && k == kwTemp:
		return CreateTemp
	case p.into && isPgTemp(ss.src, t):
		if isDot(ss.src, l) {
			return CreateTemp
		}
	case p.target:
		return ss.written(t, l)
	}
	return 0
}

// isDot reports whether the next token of l is '.'.
func isDot(src string, l lexer) bool {
	n := l.next()
	return n.kind == tOp && src[n.start:n.end] == "."
}

// chain notes a name token that follows last: either the next part of a
// qualified name (after a '.') or the start of a new one, which is
// "named" when the word before it names an object rather than calls it.
func (ss *stmtScan) chain(last token, lastKw kw) {
	if last.kind == tOp && ss.src[last.start:last.end] == "." && ss.beforeDot.kind != tEOF {
		ss.qual = ss.beforeDot
		return
	}
	ss.qual = token{kind: tEOF}
	ss.named = namingKeyword(lastKw) || (last.kind == tOp && ss.src[last.start:last.end] == "::")
}

// written checks the name t that the statement writes to (UPDATE,
// INSERT/MERGE INTO, DELETE FROM): a write to pg_settings calls set_config
// for each row, for a name the text does not show. l is the lexer just
// past t.
func (ss *stmtScan) written(t token, l lexer) Flags {
	var buf [nameMax + 8]byte
	if t.end-t.start > nameMax+2 {
		return 0
	}
	name, ok := appendIdent(buf[:0], ss.src, t)
	if !ok {
		return 0
	}
	switch {
	case string(name) == "pg_catalog" && isDot(ss.src, l):
		ss.target = true
	case string(name) == "pg_settings" && (ss.qual.kind == tEOF || ss.qualIs("pg_catalog")):
		return SetConfig | UnsureIdentity | SetParam
	}
	return 0
}

// qualIs reports whether the current name's qualifier is schema.
func (ss *stmtScan) qualIs(schema string) bool {
	var buf [nameMax + 8]byte
	if ss.qual.end-ss.qual.start > nameMax+2 {
		return false
	}
	q, ok := appendIdent(buf[:0], ss.src, ss.qual)
	return ok && string(q) == schema
}

// routine reports whether the statement so far starts
// CREATE [OR REPLACE] FUNCTION|PROCEDURE.
func (ss *stmtScan) routine() bool {
	id := ss.ids
	return id[0] == 'c' && (id[1] == 'f' || id[1] == 'p' ||
		(id[1] == 'o' && id[2] == 'r' && (id[3] == 'f' || id[3] == 'p')))
}

// call classifies the call of the function named by the word t (qualified
// by ss.qual when that is set); l is the lexer just past the "(" after it.
func (ss *stmtScan) call(t token, l lexer) Flags {
	// Quoted names keep their case; unquoted ones are folded. A name
	// longer than any built-in's is no built-in.
	if t.end-t.start > 2*nameMax+2 || (ss.qual.kind != tEOF && ss.qual.end-ss.qual.start > 2*nameMax+2) {
		return OpaqueCall
	}
	var nb, qb [2*nameMax + 8]byte
	name, ok := appendIdent(nb[:0], ss.src, t)
	if !ok {
		return OpaqueCall
	}
	var qual []byte
	if ss.qual.kind != tEOF {
		if qual, ok = appendIdent(qb[:0], ss.src, ss.qual); !ok {
			return OpaqueCall
		}
	}
	f, special := callFlags(name, qual, t.kind == tQIdent)
	if !special {
		return f
	}
	switch string(name) {
	case "set_config":
		return ss.setConfig(l)
	case "pg_advisory_unlock", "pg_advisory_unlock_shared", "pg_advisory_unlock_all":
		return AdvisoryUnlock
	}
	return AdvisoryLock
}

// arg is one argument of a set_config call.
type arg struct {
	tok     token // the first token of its value
	literal bool  // the value is exactly that one token, perhaps cast to a harmless type (see castState)
	present bool
}

// castState follows the tokens of a set_config argument after its first:
// only casts may follow a constant for it to count as one, that is "::"
// type, where type is text, varchar, bool or boolean, perhaps qualified
// by pg_catalog, without a modifier or []. Anything else (an operator, a
// keyword such as AND or COLLATE, a second constant, a call) makes the
// value unknown; so does a cast to any other type, which may change the
// value ('roleX'::varchar(4) is 'role') or run a user-defined cast.
type castState uint8

const (
	castDone  castState = iota // after the constant or a complete cast
	castColon                  // after "::": a type name must follow
	castQual                   // after pg_catalog: "." must follow
	castDot                    // after "pg_catalog.": a type name must follow
	castBad                    // not a constant
)

// next moves the state over token t.
func (c castState) next(src string, t token) castState {
	switch c {
	case castDone:
		if t.kind == tOp && src[t.start:t.end] == "::" {
			return castColon
		}
	case castColon, castDot:
		var buf [nameMax + 8]byte
		if !isWord(t) || t.end-t.start > nameMax+2 {
			break
		}
		name, ok := appendIdent(buf[:0], src, t)
		if !ok {
			break
		}
		switch string(name) {
		case "text", "varchar", "bool", "boolean":
			return castDone
		case "pg_catalog":
			if c == castColon {
				return castQual
			}
		}
	case castQual:
		if t.kind == tOp && src[t.start:t.end] == "." {
			return castDot
		}
	}
	return castBad
}

// setConfig classifies set_config(setting_name, new_value, is_local) whose
// arguments start at l (just past the parenthesis), positional or named.
// The name counts only when it is exactly one string constant, perhaps
// cast to text or varchar; is_local only when it is one boolean or string
// constant, perhaps cast to bool, boolean or text: otherwise the name is
// unknown (UnsureIdentity) and the change is taken to last for the
// session.
func (ss *stmtScan) setConfig(l lexer) Flags {
	const unsure = SetConfig | UnsureIdentity | SetParam
	var args [3]arg
	if !ss.setConfigArgs(l, &args) {
		return unsure
	}
	a := args[0]
	if !a.present || !a.literal || (a.tok.kind != tString && a.tok.kind != tDollar) {
		return unsure
	}
	var buf [32]byte
	name, st := appendValue(buf[:0], ss.src, a.tok, ss.escapeStrings, 24)
	if st == decodeBad {
		return unsure
	}
	local := ss.isLocal(args[2])
	switch {
	case st == decodeTooLong:
	case eqFold(name, "role"):
		return SetConfig | pick(local, SetRoleLocal, SetRole)
	case eqFold(name, "session_authorization"):
		return SetConfig | pick(local, SetSessionAuthLocal, SetSessionAuth)
	}
	return SetConfig | pick(local, SetParamLocal, SetParam)
}

// setConfigArgs reads the arguments of a set_config call that start at l
// (just past the parenthesis) into their slots in args: setting_name,
// new_value and is_local, by position or by name. An argument is present
// when it has a token, and literal only when casts alone follow its first
// one (see castState). It reports false when the text ends before the
// call does, which leaves every argument unknown. It is kept apart from
// setConfig so that reading the arguments and judging them can be read,
// and changed, one at a time; args is filled in place rather than
// returned, which would copy it.
func (ss *stmtScan) setConfigArgs(l lexer, args *[3]arg) bool {
	for pos := 0; ; pos++ {
		t := l.next()
		if t.kind == tRParen && pos == 0 {
			return true
		}
		slot := pos
		if t.kind == tIdent || t.kind == tQIdent {
			if named, ok := ss.argName(t, &l); ok {
				slot = named
				t = l.next()
			}
		}
		first, n, cast := t, 0, castDone
		depth := 0
	value:
		for ; ; t = l.next() {
			switch t.kind {
			case tEOF, tSemi, tBad:
				return false
			case tComma, tRParen:
				if depth == 0 {
					break value
				}
			}
			if n > 0 {
				cast = cast.next(ss.src, t)
			}
			if t.kind == tLParen || (t.kind == tOp && ss.src[t.start:t.end] == "[") {
				depth++
			}
			if t.kind == tRParen || (t.kind == tOp && ss.src[t.start:t.end] == "]") {
				depth--
			}
			n++
		}
		if slot >= 0 && slot < len(args) {
			args[slot] = arg{tok: first, literal: cast == castDone, present: n > 0}
		}
		if t.kind == tRParen {
			return true
		}
	}
}

// argName reads a named argument's "name =>" or "name :=" when the word t
// starts one, moving l past the arrow, and returns its slot in
// setConfigArgs, -1 for a name set_config does not have. It reports false,
// leaving l alone, when t is the start of a positional value. Named
// arguments are rare, so they get a function of their own.
func (ss *stmtScan) argName(t token, l *lexer) (slot int, ok bool) {
	peek := *l
	if p := peek.next(); p.kind != tOp || (ss.src[p.start:p.end] != "=>" && ss.src[p.start:p.end] != ":=") {
		return 0, false
	}
	*l = peek
	var buf [48]byte
	name, _ := appendIdent(buf[:0], ss.src, t)
	switch string(name) {
	case "setting_name":
		return 0, true
	case "new_value":
		return 1, true
	case "is_local":
		return 2, true
	}
	return -1, true
}

// isLocal reports whether the is_local argument a of set_config makes the
// change last only for the transaction: only one boolean or string
// constant, perhaps cast to a harmless type, is read; anything else counts
// as false, the session-level change, which the pooler must undo. It is
// split from setConfig because it is the one argument read as a boolean.
func (ss *stmtScan) isLocal(a arg) bool {
	if !a.present || !a.literal {
		return false
	}
	switch a.tok.kind {
	case tIdent:
		return eqFold(ss.src[a.tok.start:a.tok.end], "true")
	case tString, tDollar:
		var vb [16]byte
		if v, st := appendValue(vb[:0], ss.src, a.tok, ss.escapeStrings, 8); st == decodeOK {
			local, _ := parseBool(v)
			return local
		}
	}
	return false
}

func pick(local bool, ifLocal, ifSession Flags) Flags {
	if local {
		return ifLocal
	}
	return ifSession
}

// parseBool reads a boolean as PostgreSQL's boolin does: surrounding white
// space ignored, any case, unambiguous prefixes of true, false, yes, no,
// and on, off, 1, 0.
func parseBool(v []byte) (val, ok bool) {
	for len(v) > 0 && isSpace(v[0]) {
		v = v[1:]
	}
	for len(v) > 0 && isSpace(v[len(v)-1]) {
		v = v[:len(v)-1]
	}
	prefix := func(word string, min int) bool {
		if len(v) < min || len(v) > len(word) {
			return false
		}
		return eqFold(v, word[:len(v)])
	}
	switch {
	case prefix("true", 1), prefix("yes", 1), prefix("on", 2), len(v) == 1 && v[0] == '1':
		return true, true
	case prefix("false", 1), prefix("no", 1), prefix("off", 2), len(v) == 1 && v[0] == '0':
		return false, true
	}
	return false, false
}

// kw names the words the statement scan watches for.
type kw uint8

const (
	kwNone kw = iota
	kwCreate
	kwOr
	kwReplace
	kwFunction
	kwProcedure
	kwBegin
	kwCase
	kwEnd
	kwInsert // INSERT or MERGE
	kwInto
	kwLocal // LOCAL or GLOBAL
	kwTemp  // TEMP or TEMPORARY
	kwDelete
	kwUpdate
	kwFrom
	kwOnly
	kwTable
	// Words after which a name is named, not called (see namingKeyword).
	kwAs
	kwReferences
	kwView
	kwWith
	kwRecursive
	kwExists
	kwRoutine
	kwAggregate
	kwPrepare
	kwExecute
	kwCopy
	kwVacuum
	kwAnalyze
	kwCall
)

// namingKeyword reports whether a name right after k is an object being
// named or defined, so a "(" after it opens a column or argument list,
// not a call: INSERT INTO t (a), CREATE TABLE t (a), AS t (a), WITH c (x)
// AS, REFERENCES t (a), DROP FUNCTION f (int), PREPARE p (int), COPY t (a).
// CALL p (…) is Call already.
func namingKeyword(k kw) bool {
	switch k {
	case kwInto, kwTable, kwOnly, kwFunction, kwProcedure, kwAs, kwReferences, kwView, kwWith,
		kwRecursive, kwExists, kwRoutine, kwAggregate, kwPrepare, kwExecute, kwCopy, kwVacuum, kwAnalyze, kwCall:
		return true
	}
	return false
}

// loopKeyword returns the watched keyword w, of at most six letters, is,
// if any; longLoopKeyword takes the longer words. token picks one of the
// two by length, rather than loopKeyword calling longLoopKeyword, so that
// neither makes a call: a function that makes none needs no stack check
// and no frame, which counts for a function run on every word.
func loopKeyword(w string) kw {
	switch len(w) {
	case 2:
		switch {
		case eqFold(w, "or"):
			return kwOr
		case eqFold(w, "as"):
			return kwAs
		}
	case 3:
		if eqFold(w, "end") {
			return kwEnd
		}
	case 4:
		switch {
		case eqFold(w, "case"):
			return kwCase
		case eqFold(w, "into"):
			return kwInto
		case eqFold(w, "temp"):
			return kwTemp
		case eqFold(w, "from"):
			return kwFrom
		case eqFold(w, "only"):
			return kwOnly
		case eqFold(w, "view"):
			return kwView
		case eqFold(w, "with"):
			return kwWith
		case eqFold(w, "copy"):
			return kwCopy
		case eqFold(w, "call"):
			return kwCall
		}
	case 5:
		switch {
		case eqFold(w, "begin"):
			return kwBegin
		case eqFold(w, "merge"):
			return kwInsert
		case eqFold(w, "local"):
			return kwLocal
		case eqFold(w, "table"):
			return kwTable
		}
	case 6:
		switch {
		case eqFold(w, "create"):
			return kwCreate
		case eqFold(w, "insert"):
			return kwInsert
		case eqFold(w, "global"):
			return kwLocal
		case eqFold(w, "delete"):
			return kwDelete
		case eqFold(w, "update"):
			return kwUpdate
		case eqFold(w, "exists"):
			return kwExists
		case eqFold(w, "vacuum"):
			return kwVacuum
		}
	}
	return kwNone
}

// longLoopKeyword is loopKeyword for words of seven letters or more. It is
// split off so that loopKeyword stays short.
func longLoopKeyword(w string) kw {
	switch len(w) {
	case 7:
		switch {
		case eqFold(w, "replace"):
			return kwReplace
		case eqFold(w, "routine"):
			return kwRoutine
		case eqFold(w, "prepare"):
			return kwPrepare
		case eqFold(w, "execute"):
			return kwExecute
		case eqFold(w, "analyze"), eqFold(w, "analyse"):
			return kwAnalyze
		}
	case 8:
		if eqFold(w, "function") {
			return kwFunction
		}
	case 9:
		switch {
		case eqFold(w, "procedure"):
			return kwProcedure
		case eqFold(w, "temporary"):
			return kwTemp
		case eqFold(w, "recursive"):
			return kwRecursive
		case eqFold(w, "aggregate"):
			return kwAggregate
		}
	case 10:
		if eqFold(w, "references") {
			return kwReferences
		}
	}
	return kwNone
}
