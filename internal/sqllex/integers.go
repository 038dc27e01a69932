package sqllex

import "strings"

// Span is the byte range [Start, End) of a token in a text.
type Span struct{ Start, End int }

// IntegerSpans appends to dst the spans of sql's integer constants that
// are a plain run of ASCII digits ("42", not "4_2", "4.2", "4e2", "0x2A"
// or "42abc", which the lexer takes as one token with what follows), in
// order. Nothing else of the text is a run of digits that a change of its
// value leaves the same kind of token: digits inside identifiers, strings,
// comments, parameters ($1) and dollar-quote tags are not constants.
//
// A text holding a backslash has none: with standard_conforming_strings
// off a backslash in a string moves the string's end, which may put a run
// of digits inside it, so Classify reads such a text twice (see there),
// and a number in one reading may be part of a string value in the other.
func IntegerSpans(sql string, dst []Span) []Span {
	if strings.IndexByte(sql, '\\') >= 0 {
		return dst
	}
	l := lexer{src: sql}
	for {
		t := l.next()
		switch t.kind {
		case tEOF, tBad:
			return dst
		case tNumber:
			if allDigits(sql[t.start:t.end]) {
				dst = append(dst, Span{t.start, t.end})
			}
		}
	}
}

// allDigits reports whether s is a non-empty run of ASCII digits.
func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return len(s) > 0
}

// SameButIntegers reports whether b is a with some of the integer
// constants at spans (IntegerSpans(a)) written with other digits, as a
// simple-protocol client's texts are (pgbench's "... WHERE aid = 12345;").
// Then b lexes as a does, token for token, but for those constants'
// values, so Classify, Fingerprint, StateKind and Statements give b what
// they give a: none of them reads a number's value. Why: the texts agree
// byte for byte outside runs of digits, and wherever a run differs, a's
// run is one of the spans, a token of its own. Up to such a run the lexer
// has read the same bytes in both texts but for earlier such runs, and an
// integer token leaves the lexer where it found it, so the run starts a
// number token in b too; the byte after it, the same in both, is one that
// ended a's number (no digit, letter, '_', '.' or 'e' that would have
// continued it), so it ends b's too.
func SameButIntegers(a, b string, spans []Span) bool {
	return sameButDigits(a, b, func(start, end int) bool { return isSpan(spans, start, end) })
}

// DifferInDigitsOnly reports whether a and b agree byte for byte but for
// the digits of runs of digits at the same places (after the same bytes):
// the cheap test of whether b may be a with other constants, before
// IntegerSpans reads a.
func DifferInDigitsOnly(a, b string) bool {
	return sameButDigits(a, b, func(int, int) bool { return true })
}

// sameButDigits reports whether a and b agree byte for byte outside runs
// of digits, and each run of a that differs from b's at the same place,
// [start, end) in a, is one that may.
func sameButDigits(a, b string, may func(start, end int) bool) bool {
	i, j := 0, 0
	for {
		// The common prefix up to the next digit (or the end).
		for i < len(a) && j < len(b) && a[i] == b[j] && !isDigit(a[i]) {
			i++
			j++
		}
		if i == len(a) || j == len(b) {
			return i == len(a) && j == len(b)
		}
		if !isDigit(a[i]) || !isDigit(b[j]) {
			return false
		}
		// A run of digits in each, from the same position after the
		// same bytes: equal, or a's is one that may differ.
		ei, ej := i, j
		for ei < len(a) && isDigit(a[ei]) {
			ei++
		}
		for ej < len(b) && isDigit(b[ej]) {
			ej++
		}
		if a[i:ei] != b[j:ej] && !may(i, ei) {
			return false
		}
		i, j = ei, ej
	}
}

// isSpan reports whether [start, end) is one of spans, which are in order.
func isSpan(spans []Span, start, end int) bool {
	lo, hi := 0, len(spans)
	for lo < hi {
		m := (lo + hi) / 2
		switch {
		case spans[m].Start < start:
			lo = m + 1
		case spans[m].Start > start:
			hi = m
		default:
			return spans[m].End == end
		}
	}
	return false
}
