package sqllex

import (
	"unicode/utf8"
)

// nameMax is the longest identifier PostgreSQL keeps: NAMEDATALEN-1 bytes.
const nameMax = 63

// decodeStatus tells how decoding a token went.
type decodeStatus uint8

const (
	decodeOK      decodeStatus = iota
	decodeTooLong              // the value passed the caller's limit
	decodeBad                  // an escape PostgreSQL would reject
)

// appendValue appends the value of the string constant, dollar-quoted string
// or quoted identifier t to b, undoing quotes and escapes as PostgreSQL
// does, and stops with decodeTooLong once the value passes limit bytes.
// escapeStrings gives plain strings backslash escapes, as
// standard_conforming_strings=off does. Identifiers are neither folded nor
// truncated here.
func appendValue(b []byte, src string, t token, escapeStrings bool, limit int) ([]byte, decodeStatus) {
	if t.kind == tDollar {
		open := 1
		for src[t.start+open] != '$' {
			open++
		}
		body := src[t.start+open+1 : t.end-open-1]
		if len(body) > limit {
			return append(b, body[:limit]...), decodeTooLong
		}
		return append(b, body...), decodeOK
	}
	q := t.start
	switch t.pre {
	case 'E', 'N', 'B', 'X':
		q++
	case 'U':
		q += 2
	}
	quote := src[q]
	backslash := t.kind == tString && (t.pre == 'E' || (escapeStrings && (t.pre == 0 || t.pre == 'N')))
	base := len(b)
	st := decodeOK
	rawLimit := limit
	if t.pre == 'U' {
		rawLimit = t.end - t.start // escapes are decoded after the loop
	}
	j := q + 1
	for j < t.end {
		if len(b)-base > rawLimit {
			return b[:base+limit], decodeTooLong
		}
		c := src[j]
		switch {
		case c == '\\' && backslash:
			b, j, st = appendEscape(b, src, j, t.end)
			if st != decodeOK {
				return b, st
			}
		case c == quote:
			if j+1 < t.end && src[j+1] == quote {
				b = append(b, quote)
				j += 2
				continue
			}
			if quote == '\'' {
				if k, ok := continuation(src, j+1); ok && k < t.end {
					j = k + 1
					continue
				}
			}
			j = t.end // closing quote; a UESCAPE clause may follow
		default:
			b = append(b, c)
			j++
		}
	}
	if t.pre == 'U' {
		b, st = unicodeUnescape(b, base, t.esc)
	}
	if len(b)-base > limit {
		return b[:base+limit], decodeTooLong
	}
	return b, st
}

// appendEscape decodes the backslash escape at src[j] of an E'…' string and
// returns the index after it.
func appendEscape(b []byte, src string, j, end int) ([]byte, int, decodeStatus) {
	j++ // the backslash
	if j >= end {
		return b, j, decodeBad
	}
	c := src[j]
	switch {
	case '0' <= c && c <= '7':
		v, k := 0, j
		for k < end && k < j+3 && '0' <= src[k] && src[k] <= '7' {
			v = v*8 + int(src[k]-'0')
			k++
		}
		return append(b, byte(v)), k, decodeOK
	case c == 'x' && j+1 < end && isHex(src[j+1]):
		v, k := 0, j+1
		for k < end && k < j+3 && isHex(src[k]) {
			v = v*16 + hexVal(src[k])
			k++
		}
		return append(b, byte(v)), k, decodeOK
	case c == 'u' || c == 'U':
		n := 4
		if c == 'U' {
			n = 8
		}
		r, k, ok := hexRune(src, j+1, end, n)
		if !ok {
			return b, k, decodeBad
		}
		if 0xD800 <= r && r < 0xDC00 { // high surrogate: a low one must follow
			if k+1 < end && src[k] == '\\' && (src[k+1] == 'u' || src[k+1] == 'U') {
				n = 4
				if src[k+1] == 'U' {
					n = 8
				}
				lo, k2, ok := hexRune(src, k+2, end, n)
				if ok && 0xDC00 <= lo && lo < 0xE000 {
					return utf8.AppendRune(b, 0x10000+(r-0xD800)<<10+(lo-0xDC00)), k2, decodeOK
				}
			}
			return b, k, decodeBad
		}
		if !validRune(r) {
			return b, k, decodeBad
		}
		return utf8.AppendRune(b, r), k, decodeOK
	}
	switch c {
	case 'b':
		c = '\b'
	case 'f':
		c = '\f'
	case 'n':
		c = '\n'
	case 'r':
		c = '\r'
	case 't':
		c = '\t'
	case 'v':
		c = '\v'
	}
	return append(b, c), j + 1, decodeOK
}

// unicodeUnescape decodes, in place, the escapes of a U&'…' or U&"…" value
// held in b[base:], whose escape character is esc (0 for backslash).
func unicodeUnescape(b []byte, base int, esc byte) ([]byte, decodeStatus) {
	if esc == badEsc {
		return b, decodeBad
	}
	if esc == 0 {
		esc = '\\'
	}
	// Every escape is at least as long as what it stands for, so the output
	// is written over input already read.
	in := b[base:]
	out := b[:base]
	for i := 0; i < len(in); {
		if in[i] != esc {
			out = append(out, in[i])
			i++
			continue
		}
		if i+1 < len(in) && in[i+1] == esc {
			out = append(out, esc)
			i += 2
			continue
		}
		var r rune
		var ok bool
		if i+1 < len(in) && in[i+1] == '+' {
			r, i, ok = hexRune(in, i+2, len(in), 6)
		} else {
			r, i, ok = hexRune(in, i+1, len(in), 4)
		}
		if !ok {
			return out, decodeBad
		}
		if 0xD800 <= r && r < 0xDC00 {
			var lo rune
			ok = false
			if i < len(in) && in[i] == esc {
				if i+1 < len(in) && in[i+1] == '+' {
					lo, i, ok = hexRune(in, i+2, len(in), 6)
				} else {
					lo, i, ok = hexRune(in, i+1, len(in), 4)
				}
			}
			if !ok || lo < 0xDC00 || lo >= 0xE000 {
				return out, decodeBad
			}
			r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
		} else if !validRune(r) {
			return out, decodeBad
		}
		out = utf8.AppendRune(out, r)
	}
	return out, decodeOK
}

// hexRune reads exactly n hex digits of s starting at i (before end).
func hexRune[S ~string | ~[]byte](s S, i, end, n int) (rune, int, bool) {
	if i+n > end {
		return 0, i, false
	}
	var r rune
	for k := i; k < i+n; k++ {
		if !isHex(s[k]) {
			return 0, k, false
		}
		r = r<<4 | rune(hexVal(s[k]))
	}
	return r, i + n, true
}

func hexVal(c byte) int {
	if isDigit(c) {
		return int(c - '0')
	}
	return int(c|0x20-'a') + 10
}

// validRune reports whether r is a code point PostgreSQL accepts in an
// escape: not zero, not a surrogate, not past U+10FFFF.
func validRune(r rune) bool {
	return r > 0 && r <= utf8.MaxRune && !(0xD800 <= r && r < 0xE000)
}

// appendIdent appends the name of identifier t to b as PostgreSQL records
// it: unquoted identifiers with ASCII letters folded to lower case, quoted
// ones with escapes undone, both truncated to 63 bytes without splitting a
// UTF-8 character. It reports false for an escape PostgreSQL would reject.
func appendIdent(b []byte, src string, t token) ([]byte, bool) {
	base := len(b)
	if t.kind == tIdent {
		for i := t.start; i < t.end; i++ {
			c := src[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			b = append(b, c)
		}
	} else {
		var st decodeStatus
		b, st = appendValue(b, src, t, false, t.end-t.start)
		if st != decodeOK {
			return b, false
		}
	}
	return truncateName(b, base), true
}

// truncateName cuts the name held in b[base:] to 63 bytes, as PostgreSQL
// does, without splitting a UTF-8 character.
func truncateName(b []byte, base int) []byte {
	if n := len(b) - base; n > nameMax {
		cut := base + nameMax
		for cut > base && b[cut]&0xC0 == 0x80 {
			cut--
		}
		b = b[:cut]
	}
	return b
}
