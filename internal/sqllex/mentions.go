package sqllex

import "strings"

// MentionsAny reports whether sql may name one of idents or use one of ops,
// erring towards true. A pooler learns from the catalog which relations,
// types and operators carry user code the text does not show (triggers,
// rules, views that call user functions, user-defined operators…) and asks
// this before it trusts what Classify says about a text.
//
// An identifier counts as PostgreSQL records it: unquoted ones (keywords
// included) with ASCII letters folded to lower case, quoted and U&"…" ones
// with their escapes undone and case kept, both truncated to 63 bytes;
// each part of a qualified name a.b.c counts on its own. An operator
// counts when one of ops is a substring of it, since a user may define an
// operator whose symbol is part of a longer one and PostgreSQL's rules for
// where an operator ends are subtle; an empty element of ops so matches
// every operator. Names inside string constants, dollar quotes and
// comments do not count: a built-in that reads a relation named by a
// string ('v'::regclass passed to table_to_xml) or runs a query given as
// one (query_to_xml) is an OpaqueCall for Classify.
//
// Text that cannot be read reports true: an unterminated string, quoted
// identifier, comment or dollar quote, a U& escape PostgreSQL would
// reject, an unusable UESCAPE clause, or a U&"…" identifier too long to
// decode without allocating (over 640 bytes with its UESCAPE clause,
// which no 63-byte name needs). When a plain '…' string holds a
// backslash, the text is read a second time as PostgreSQL would read it
// with standard_conforming_strings off, and either reading's mention
// counts.
//
// With idents and ops both empty it returns false without reading sql. It
// does not allocate.
func MentionsAny(sql string, idents map[string]struct{}, ops []string) bool {
	if len(idents) == 0 && len(ops) == 0 {
		return false
	}
	l := lexer{src: sql}
	if mentions(&l, idents, ops) {
		return true
	}
	if !l.backslash {
		return false
	}
	l = lexer{src: sql, escapeStrings: true}
	return mentions(&l, idents, ops)
}

// mentionBuf is the room MentionsAny decodes an identifier in: enough for
// any U&"…" identifier whose name fits in 63 bytes even when every
// character is spelt as an escape (\+XXXXXX is eight bytes for one) and
// a UESCAPE clause follows.
const mentionBuf = 640

// mentions reads the rest of l's text for MentionsAny. After it returns
// false, l.backslash tells whether a second reading is needed.
func mentions(l *lexer, idents map[string]struct{}, ops []string) bool {
	var buf [mentionBuf]byte
	for {
		t := l.next()
		switch t.kind {
		case tEOF:
			return false
		case tBad:
			return true
		case tString:
			if t.esc == badEsc {
				// UESCAPE not followed by one simple character: the
				// clause may have swallowed a name, and PostgreSQL
				// rejects the text anyway.
				return true
			}
		case tIdent, tQIdent:
			// Only U& identifiers can be unreadable; other names need
			// decoding only when there are names to look for.
			if len(idents) == 0 && t.pre != 'U' {
				continue
			}
			name, ok := identName(&buf, l.src, t)
			if !ok {
				return true
			}
			if _, hit := idents[string(name)]; hit {
				return true
			}
		case tOp:
			op := l.src[t.start:t.end]
			for _, o := range ops {
				if strings.Contains(op, o) {
					return true
				}
			}
		}
	}
}

// identName returns the name of identifier t exactly as appendIdent gives
// it, decoded into buf so that nothing is allocated however long the
// token. It reports false when appendIdent would, and for a U&"…"
// identifier longer than buf.
func identName(buf *[mentionBuf]byte, src string, t token) ([]byte, bool) {
	switch {
	case t.end-t.start <= len(buf):
		// Decoding never lengthens a name, so it fits.
		return appendIdent(buf[:0], src, t)
	case t.kind == tIdent:
		// Folding keeps the length, and the cut at 63 bytes looks no
		// further than the 64th.
		t.end = t.start + nameMax + 1
		return appendIdent(buf[:0], src, t)
	case t.pre == 0:
		// A "…" identifier's only escape is "", which cannot fail:
		// appendValue may stop just past the 64th byte.
		b, st := appendValue(buf[:0], src, t, false, nameMax+1)
		return truncateName(b, 0), st != decodeBad
	}
	return nil, false
}
