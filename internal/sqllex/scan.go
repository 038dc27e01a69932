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
// BEGIN ATOMIC body of a routine, calls of set_config and advisory locks,
// and SELECT … INTO TEMP.
type stmtScan struct {
	src           string
	escapeStrings bool
	paren         int     // open parentheses
	begin         int     // open BEGIN ATOMIC (and CASE inside it) blocks
	ids           [4]byte // first letters of create/or/replace/function/procedure among the first words
	nids          int     // unquoted words seen
	afterInsert   bool    // the previous token was INSERT or MERGE
	into          bool    // the previous tokens were INTO [GLOBAL|LOCAL]
}

// token takes the next token of the statement; l is the lexer just past it.
func (ss *stmtScan) token(t token, l lexer) Flags {
	afterInsert, into := ss.afterInsert, ss.into
	ss.afterInsert, ss.into = false, false
	switch t.kind {
	case tBad:
		return Incomplete
	case tLParen:
		ss.paren++
	case tRParen:
		if ss.paren > 0 {
			ss.paren--
		}
	case tQIdent:
		if t.end-t.start < 40 && !ss.routine() {
			var buf [48]byte
			if name, ok := appendIdent(buf[:0], ss.src, t); ok {
				return ss.call(string(name), l)
			}
		}
	case tIdent:
		w := ss.src[t.start:t.end]
		k := loopKeyword(w)
		if ss.nids < len(ss.ids) {
			switch k {
			case kwCreate:
				ss.ids[ss.nids] = 'c'
			case kwOr:
				ss.ids[ss.nids] = 'o'
			case kwReplace:
				ss.ids[ss.nids] = 'r'
			case kwFunction:
				ss.ids[ss.nids] = 'f'
			case kwProcedure:
				ss.ids[ss.nids] = 'p'
			}
		}
		ss.nids++
		routine := ss.routine()
		if routine && ss.paren == 0 {
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
		switch {
		case k == kwInsert:
			ss.afterInsert = true
		case k == kwInto:
			ss.into = !afterInsert
		case into && k == kwLocal:
			ss.into = true
		case into && k == kwTemp:
			return CreateTemp
		case len(w) >= 10 && (w[0]|0x20 == 's' || w[0]|0x20 == 'p') && !routine:
			// A routine's body and defaults do not run when it is created.
			var buf [32]byte
			if len(w) < len(buf) {
				for i := 0; i < len(w); i++ {
					c := w[i]
					if 'A' <= c && c <= 'Z' {
						c += 'a' - 'A'
					}
					buf[i] = c
				}
				return ss.call(string(buf[:len(w)]), l)
			}
		}
	}
	return 0
}

// routine reports whether the statement so far starts
// CREATE [OR REPLACE] FUNCTION|PROCEDURE.
func (ss *stmtScan) routine() bool {
	id := ss.ids
	return id[0] == 'c' && (id[1] == 'f' || id[1] == 'p' ||
		(id[1] == 'o' && id[2] == 'r' && (id[3] == 'f' || id[3] == 'p')))
}

// call classifies a possible call of the function name (already folded);
// l is the lexer just past the name.
func (ss *stmtScan) call(name string, l lexer) Flags {
	switch name {
	case "set_config", "pg_advisory_lock", "pg_advisory_lock_shared",
		"pg_try_advisory_lock", "pg_try_advisory_lock_shared",
		"pg_advisory_unlock", "pg_advisory_unlock_shared", "pg_advisory_unlock_all":
	default:
		return 0
	}
	if l.next().kind != tLParen {
		return 0
	}
	switch name {
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
	literal bool  // the value is that one token, perhaps cast with ::
	present bool
}

// setConfig classifies set_config(setting_name, new_value, is_local) whose
// arguments start at l, positional or named.
func (ss *stmtScan) setConfig(l lexer) Flags {
	const unsure = SetConfig | UnsureIdentity | SetParam
	var args [3]arg
	for pos := 0; ; pos++ {
		t := l.next()
		if t.kind == tRParen && pos == 0 {
			break
		}
		slot := pos
		if t.kind == tIdent || t.kind == tQIdent {
			peek := l
			if p := peek.next(); p.kind == tOp && (ss.src[p.start:p.end] == "=>" || ss.src[p.start:p.end] == ":=") {
				var buf [48]byte
				name, _ := appendIdent(buf[:0], ss.src, t)
				switch string(name) {
				case "setting_name":
					slot = 0
				case "new_value":
					slot = 1
				case "is_local":
					slot = 2
				default:
					slot = -1
				}
				l = peek
				t = l.next()
			}
		}
		first, n, cast := t, 0, false
		depth := 0
		for ; ; t = l.next() {
			switch t.kind {
			case tEOF, tSemi, tBad:
				return unsure
			case tComma, tRParen:
				if depth == 0 {
					goto done
				}
			}
			if t.kind == tLParen || (t.kind == tOp && ss.src[t.start:t.end] == "[") {
				depth++
			}
			if t.kind == tRParen || (t.kind == tOp && ss.src[t.start:t.end] == "]") {
				depth--
			}
			if n == 1 && t.kind == tOp && ss.src[t.start:t.end] == "::" {
				cast = true
			}
			n++
		}
	done:
		if slot >= 0 && slot < len(args) {
			args[slot] = arg{tok: first, literal: n == 1 || cast, present: n > 0}
		}
		if t.kind == tRParen {
			break
		}
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
	local := false
	if a := args[2]; a.present && a.literal {
		switch a.tok.kind {
		case tIdent:
			local = eqFold(ss.src[a.tok.start:a.tok.end], "true")
		case tString, tDollar:
			var vb [16]byte
			if v, st := appendValue(vb[:0], ss.src, a.tok, ss.escapeStrings, 8); st == decodeOK {
				local, _ = parseBool(v)
			}
		}
	}
	switch {
	case st == decodeTooLong:
	case eqFold(name, "role"):
		return SetConfig | pick(local, SetRoleLocal, SetRole)
	case eqFold(name, "session_authorization"):
		return SetConfig | pick(local, SetSessionAuthLocal, SetSessionAuth)
	}
	return SetConfig | pick(local, SetParamLocal, SetParam)
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
)

// loopKeyword returns the watched keyword w is, if any.
func loopKeyword(w string) kw {
	switch len(w) {
	case 2:
		if eqFold(w, "or") {
			return kwOr
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
		}
	case 5:
		switch {
		case eqFold(w, "begin"):
			return kwBegin
		case eqFold(w, "merge"):
			return kwInsert
		case eqFold(w, "local"):
			return kwLocal
		}
	case 6:
		switch {
		case eqFold(w, "create"):
			return kwCreate
		case eqFold(w, "insert"):
			return kwInsert
		case eqFold(w, "global"):
			return kwLocal
		}
	case 7:
		if eqFold(w, "replace") {
			return kwReplace
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
		}
	}
	return kwNone
}
