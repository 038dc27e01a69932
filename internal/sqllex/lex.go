package sqllex

import "strings"

// tokKind is the lexical class of a token.
type tokKind uint8

const (
	tEOF    tokKind = iota // end of input
	tIdent                 // unquoted identifier or keyword
	tQIdent                // "quoted" or U&"quoted" identifier
	tString                // string constant: '…', E'…', N'…', U&'…', B'…', X'…'
	tDollar                // dollar-quoted string constant
	tNumber                // numeric constant
	tParam                 // positional parameter $n
	tOp                    // operator or other punctuation
	tSemi                  // ;
	tLParen                // (
	tRParen                // )
	tComma                 // ,
	tBad                   // unterminated string, identifier, comment or dollar quote; runs to the end of the input
)

// token is one lexical token: its class and its byte range in the input.
type token struct {
	kind tokKind
	// pre is the prefix of a string constant ('E', 'N', 'U', 'B', 'X', or 0
	// for a plain one) or of a quoted identifier ('U' or 0).
	pre byte
	// esc is the escape character of a U& token (set by UESCAPE); 0 means
	// the default backslash, badEsc an unusable UESCAPE clause.
	esc        byte
	start, end int
}

const badEsc = 0xff

// lexer splits PostgreSQL SQL text into tokens following the rules of
// PostgreSQL's own scanner (src/backend/parser/scan.l). It is a small value:
// copying it gives an independent cursor for lookahead.
type lexer struct {
	src string
	pos int
	// escapeStrings lexes plain '…' strings as PostgreSQL does with
	// standard_conforming_strings off: a backslash escapes the next byte.
	escapeStrings bool
	// backslash records that a plain '…' or N'…' string held a backslash,
	// so its end would move if standard_conforming_strings were off.
	backslash bool
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isLetter(c byte) bool { return 'a' <= c|0x20 && c|0x20 <= 'z' }

// isIdentStart reports whether c may start an identifier: a letter, an
// underscore or any byte of a multibyte character.
func isIdentStart(c byte) bool { return isLetter(c) || c == '_' || c >= 0x80 }

// isIdentCont reports whether c may continue an identifier; unlike a
// dollar-quote tag, an identifier may contain '$'.
func isIdentCont(c byte) bool { return isIdentStart(c) || isDigit(c) || c == '$' }

// isDolqCont reports whether c may continue a dollar-quote tag.
func isDolqCont(c byte) bool { return isIdentStart(c) || isDigit(c) }

// isOpChar reports whether c belongs to PostgreSQL's operator characters.
func isOpChar(c byte) bool {
	switch c {
	case '~', '!', '@', '#', '^', '&', '|', '`', '?', '+', '-', '*', '/', '%', '<', '>', '=':
		return true
	}
	return false
}

// next returns the next token, skipping white space and comments. At the end
// of the input it returns a tEOF token; an unterminated construct yields one
// tBad token that runs to the end.
func (l *lexer) next() token {
	s := l.src
	for l.pos < len(s) {
		c := s[l.pos]
		if isSpace(c) {
			l.pos++
			continue
		}
		if c != '-' && c != '/' {
			break
		}
		end, ok := commentEnd(s, l.pos)
		if !ok {
			return l.bad(l.pos)
		}
		if end == l.pos {
			break // an operator
		}
		l.pos = end
	}
	start := l.pos
	if start >= len(s) {
		return token{kind: tEOF, start: len(s), end: len(s)}
	}
	c := s[start]
	var c1, c2 byte
	if start+1 < len(s) {
		c1 = s[start+1]
	}
	if start+2 < len(s) {
		c2 = s[start+2]
	}
	if (c1 == '\'' || c1 == '&') && isLetter(c) {
		if t, ok := l.prefixed(start, c, c1, c2); ok {
			return t
		}
	}
	switch {
	case c == '\'':
		return l.str(start, 0, start)
	case c == '"':
		return l.qident(start, 0, start)
	case isIdentStart(c):
		j := start + 1
		for j < len(s) && isIdentCont(s[j]) {
			j++
		}
		l.pos = j
		return token{kind: tIdent, start: start, end: j}
	case isDigit(c) || (c == '.' && isDigit(c1)):
		l.pos = scanNumber(s, start)
		return token{kind: tNumber, start: start, end: l.pos}
	case c == '$':
		return l.dollar(start)
	case c == ';':
		return l.single(start, tSemi)
	case c == '(':
		return l.single(start, tLParen)
	case c == ')':
		return l.single(start, tRParen)
	case c == ',':
		return l.single(start, tComma)
	case c == ':' && (c1 == ':' || c1 == '='), c == '.' && c1 == '.':
		l.pos += 2
		return token{kind: tOp, start: start, end: l.pos}
	case isOpChar(c):
		l.pos = scanOperator(s, start)
		return token{kind: tOp, start: start, end: l.pos}
	}
	// '.', ':', '[', ']' and bytes PostgreSQL rejects stand alone.
	return l.single(start, tOp)
}

// single returns the one-byte token of kind k at start and moves l past
// it. It gives each of next's one-byte cases a single line, and is small
// enough to be inlined there.
func (l *lexer) single(start int, k tokKind) token {
	l.pos = start + 1
	return token{kind: k, start: start, end: l.pos}
}

// commentEnd returns the index after the "--" or "/* … */" comment that
// starts at i, or i when none does, and false when a block comment is
// unterminated. It is kept out of next, whose loop over white space runs
// before every token, because comments are rare.
func commentEnd(s string, i int) (int, bool) {
	if i+1 < len(s) {
		switch {
		case s[i] == '-' && s[i+1] == '-':
			return skipLineComment(s, i), true
		case s[i] == '/' && s[i+1] == '*':
			return skipBlockComment(s, i)
		}
	}
	return i, true
}

// prefixed lexes the string constant or quoted identifier with a letter
// prefix (E'…', N'…', B'…', X'…', U&'…', U&"…") that starts with c, c1 and
// c2 at start, and reports false when those bytes start none of them. It
// is split from next, which calls it only for a letter c before a quote
// or '&', so that an identifier is not tested against every prefix first.
func (l *lexer) prefixed(start int, c, c1, c2 byte) (token, bool) {
	switch {
	case c1 == '\'' && (c == 'e' || c == 'E'):
		return l.str(start, 'E', start+1), true
	case c1 == '\'' && (c == 'n' || c == 'N'):
		return l.str(start, 'N', start+1), true
	case c1 == '\'' && (c == 'b' || c == 'B'):
		return l.str(start, 'B', start+1), true
	case c1 == '\'' && (c == 'x' || c == 'X'):
		return l.str(start, 'X', start+1), true
	case (c == 'u' || c == 'U') && c1 == '&' && c2 == '\'':
		return l.str(start, 'U', start+2), true
	case (c == 'u' || c == 'U') && c1 == '&' && c2 == '"':
		return l.qident(start, 'U', start+2), true
	}
	return token{}, false
}

// bad returns a tBad token from start to the end of the input and moves the
// lexer there.
func (l *lexer) bad(start int) token {
	l.pos = len(l.src)
	return token{kind: tBad, start: start, end: len(l.src)}
}

// skipLineComment returns the index of the newline that ends the "--"
// comment starting at i, or the end of the input.
func skipLineComment(s string, i int) int {
	j := strings.IndexAny(s[i:], "\n\r")
	if j < 0 {
		return len(s)
	}
	return i + j
}

// skipBlockComment returns the index after the "/* … */" comment starting at
// i, honouring nesting as PostgreSQL does, and false when it is unterminated.
func skipBlockComment(s string, i int) (int, bool) {
	depth := 0
	for i < len(s) {
		switch {
		case s[i] == '/' && i+1 < len(s) && s[i+1] == '*':
			depth++
			i += 2
		case s[i] == '*' && i+1 < len(s) && s[i+1] == '/':
			depth--
			i += 2
			if depth == 0 {
				return i, true
			}
		default:
			i++
		}
	}
	return len(s), false
}

// scanNumber returns the end of the numeric constant starting at i. Letters
// that follow a number are swallowed with it, as PostgreSQL 15 and later
// report them as trailing junk in one token.
func scanNumber(s string, i int) int {
	j := i
	digits := func() {
		for j < len(s) && (isDigit(s[j]) || s[j] == '_') {
			j++
		}
	}
	if s[j] == '0' && j+1 < len(s) && strings.IndexByte("xXoObB", s[j+1]) >= 0 {
		j += 2
		for j < len(s) && (isDigit(s[j]) || isLetter(s[j]) || s[j] == '_') {
			j++
		}
	} else {
		digits()
		if j < len(s) && s[j] == '.' && !(j+1 < len(s) && s[j+1] == '.') {
			j++
			digits()
		}
		if j < len(s) && (s[j] == 'e' || s[j] == 'E') {
			k := j + 1
			if k < len(s) && (s[k] == '+' || s[k] == '-') {
				k++
			}
			if k < len(s) && isDigit(s[k]) {
				j = k
				digits()
			}
		}
	}
	if j < len(s) && isIdentStart(s[j]) {
		for j < len(s) && isIdentCont(s[j]) {
			j++
		}
	}
	return j
}

// scanOperator returns the end of the operator starting at i. As in
// PostgreSQL an operator stops before "--" or "/*", and a multi-character
// operator loses trailing '+' and '-' unless it holds one of ~!@#^&|`?%.
func scanOperator(s string, i int) int {
	j := i + 1
	for j < len(s) && isOpChar(s[j]) {
		if j+1 < len(s) && ((s[j] == '-' && s[j+1] == '-') || (s[j] == '/' && s[j+1] == '*')) {
			break
		}
		j++
	}
	if j-i > 1 && (s[j-1] == '+' || s[j-1] == '-') {
		if strings.IndexAny(s[i:j-1], "~!@#^&|`?%") < 0 {
			for j-i > 1 && (s[j-1] == '+' || s[j-1] == '-') {
				j--
			}
		}
	}
	return j
}

// dollar lexes what starts with '$' at i: a parameter ($1), a dollar-quoted
// string ($$…$$, $tag$…$tag$) or a lone '$'.
func (l *lexer) dollar(i int) token {
	s := l.src
	j := i + 1
	if j < len(s) && isDigit(s[j]) {
		for j < len(s) && (isDigit(s[j]) || s[j] == '_') {
			j++
		}
		l.pos = j
		return token{kind: tParam, start: i, end: j}
	}
	if j < len(s) && isIdentStart(s[j]) {
		for j < len(s) && isDolqCont(s[j]) {
			j++
		}
	}
	if j >= len(s) || s[j] != '$' {
		// Not a delimiter: PostgreSQL returns the '$' alone.
		l.pos = i + 1
		return token{kind: tOp, start: i, end: i + 1}
	}
	delim := s[i : j+1]
	k := strings.Index(s[j+1:], delim)
	if k < 0 {
		return l.bad(i)
	}
	l.pos = j + 1 + k + len(delim)
	return token{kind: tDollar, start: i, end: l.pos}
}

// str lexes a string constant with prefix pre whose opening quote is at q.
func (l *lexer) str(start int, pre byte, q int) token {
	backslash := pre == 'E' || (l.escapeStrings && (pre == 0 || pre == 'N'))
	end, ok, sawBackslash := scanQuoted(l.src, q, '\'', backslash)
	if !ok {
		return l.bad(start)
	}
	if sawBackslash && (pre == 0 || pre == 'N') {
		l.backslash = true
	}
	l.pos = end
	t := token{kind: tString, pre: pre, start: start, end: end}
	if pre == 'U' {
		l.uescape(&t)
	}
	return t
}

// qident lexes a quoted identifier with prefix pre whose opening quote is at q.
func (l *lexer) qident(start int, pre byte, q int) token {
	end, ok, _ := scanQuoted(l.src, q, '"', false)
	if !ok {
		return l.bad(start)
	}
	l.pos = end
	t := token{kind: tQIdent, pre: pre, start: start, end: end}
	if pre == 'U' {
		l.uescape(&t)
	}
	return t
}

// uescape absorbs a UESCAPE 'c' clause that follows a U& token into it.
func (l *lexer) uescape(t *token) {
	peek := *l
	kw := peek.next()
	if kw.kind != tIdent || !eqFold(l.src[kw.start:kw.end], "uescape") {
		return
	}
	lit := peek.next()
	if lit.kind == tBad {
		return // leave the unterminated literal to the main scan
	}
	*l = peek
	t.end = lit.end
	t.esc = badEsc
	if lit.kind == tString && lit.pre == 0 && lit.end-lit.start == 3 {
		c := l.src[lit.start+1]
		if !isSpace(c) && c != '\'' && c != '"' && c != '+' && !isHex(c) {
			t.esc = c
		}
	}
}

// scanQuoted scans a quoted run whose opening quote is at i and returns the
// index after the closing quote. A doubled quote stands for one quote; with
// backslash set, a backslash escapes the next byte. String constants (quote
// '\”) continue across a quote, white space holding a newline, and a quote,
// as in SQL. It reports false for an unterminated run and whether a
// backslash occurred.
func scanQuoted(s string, i int, quote byte, backslash bool) (end int, ok, sawBackslash bool) {
	j := i + 1
	for j < len(s) {
		c := s[j]
		switch {
		case c == '\\':
			sawBackslash = true
			if backslash {
				j += 2
				continue
			}
			j++
		case c == quote:
			if j+1 < len(s) && s[j+1] == quote {
				j += 2
				continue
			}
			if quote == '\'' {
				if k, ok := continuation(s, j+1); ok {
					j = k + 1
					continue
				}
			}
			return j + 1, true, sawBackslash
		default:
			j++
		}
	}
	return len(s), false, sawBackslash
}

// continuation reports whether s[i:] starts with white space that holds at
// least one newline (and possibly "--" comments) followed by a quote, which
// continues the string constant that ended just before i; it returns the
// index of that quote.
func continuation(s string, i int) (int, bool) {
	newline := false
	for i < len(s) {
		switch c := s[i]; {
		case c == '\n' || c == '\r':
			newline = true
			i++
		case isSpace(c):
			i++
		case c == '-' && i+1 < len(s) && s[i+1] == '-':
			i = skipLineComment(s, i)
		case c == '\'' && newline:
			return i, true
		default:
			return 0, false
		}
	}
	return 0, false
}

func isHex(c byte) bool { return isDigit(c) || ('a' <= c|0x20 && c|0x20 <= 'f') }

// eqFold reports whether s equals the lower-case ASCII word kw once ASCII
// letters in s are folded to lower case.
func eqFold[S ~string | ~[]byte](s S, kw string) bool {
	if len(s) != len(kw) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != kw[i] {
			return false
		}
	}
	return true
}
