// Package sqllex reads PostgreSQL SQL text far enough to tell what each
// statement does to the session: it splits a simple Query string (or a
// Parse's query text) into statements and classifies each by its leading
// keywords, so a pooler can notice SET ROLE, SET of parameters, DEALLOCATE,
// DISCARD, transaction control and the like.
//
// It is a real lexer, following PostgreSQL's scanner (scan.l): comments
// ("--" and nested "/* */"), string constants ('…' with ” escapes, E'…'
// with backslash escapes, U&'…', N'…', B'…', X'…', and their continuation
// across newlines), dollar quotes ($$…$$, $tag$…$tag$), quoted identifiers
// ("…" with "" escapes, U&"…") and operators are recognised, so keywords
// inside any of them never count. Only the first keywords of a statement
// decide what it is, so "CREATE FUNCTION … SET role = x" or "EXPLAIN SET"
// are not identity changes; function calls (set_config, advisory locks,
// pg_terminate_backend and the like, and calls of anything but a harmless
// PostgreSQL built-in, see builtins.go) and writes to pg_settings are
// found anywhere in a statement.
//
// What the text cannot show, the user code that the catalog attaches to
// relations, types and operators (triggers, rules, views calling user
// functions, user-defined operators), a caller looks up itself:
// MentionsAny tells whether a text names one of a set of objects or uses
// one of a list of operators, and HarmlessBuiltin whether a built-in
// function that such an object calls is one the lexer calls plain.
//
// Plain '…' strings are read as with standard_conforming_strings on (the
// default since PostgreSQL 9.1). When a backslash in one means the text
// would split differently with it off, the result carries Ambiguous. The
// text is taken to be UTF-8 or another encoding whose multibyte characters
// never contain ASCII bytes.
package sqllex

import (
	"iter"
	"strings"
)

// MaxWords is the number of leading words a Stmt keeps.
const MaxWords = 6

// Word is one leading word of a statement: a keyword or identifier.
type Word struct {
	// Text is the word as PostgreSQL reads it: unquoted words folded to
	// lower case, quoted identifiers with their quotes and escapes undone
	// and case kept; both truncated to 63 bytes.
	Text string
	// Quoted reports a quoted identifier, which is never a keyword.
	Quoted bool
}

// Stmt describes one statement of the text given to Statements.
type Stmt struct {
	// Start and End delimit the statement in the text: sql[Start:End] runs
	// from its first token to the end of its last, without the semicolon
	// that ends it. Statements come in order and never overlap.
	Start, End int
	// Flags says what the statement does; see the Flags constants.
	Flags Flags
	// Name is the object the statement names, read as PostgreSQL reads it:
	// the parameter of SET and RESET ("role", "session_authorization",
	// "timezone" for TIME ZONE, "client_encoding" for NAMES, "search_path"
	// for SCHEMA, "xmloption" for XML OPTION, dotted custom names joined
	// with '.'), the statement of PREPARE, EXECUTE and DEALLOCATE, the
	// cursor of DECLARE, the channel of LISTEN, UNLISTEN ("*" for all) and
	// NOTIFY, the savepoint of SAVEPOINT, RELEASE and ROLLBACK TO, or the
	// transaction identifier of PREPARE TRANSACTION and COMMIT/ROLLBACK
	// PREPARED. It is empty for ALL forms and for other statements.
	Name string

	words  [MaxWords]Word
	nwords int
}

// Words returns the statement's leading keywords and identifiers (at most
// MaxWords), stopping at the first token of another kind: "SET search_path
// TO x" gives set, search_path, to, x; "SELECT * FROM t" gives select.
func (s *Stmt) Words() []Word { return s.words[:s.nwords] }

// Summary is what Classify reports about a whole text.
type Summary struct {
	// Flags is the union of every statement's flags.
	Flags Flags
	// Statements counts the non-empty statements; PostgreSQL runs them one
	// after the other when they arrive in one simple Query.
	Statements int
}

// Statements returns the non-empty statements of sql in order, each with its
// byte range, flags, name and leading words. Empty statements (";;" or only
// comments) are skipped. An unterminated construct runs to the end of the
// text and belongs to the last statement, which then carries Incomplete.
// When the text would split differently with standard_conforming_strings
// off, the statements are those of the standard reading and each carries
// Ambiguous.
func Statements(sql string) iter.Seq[Stmt] {
	return func(yield func(Stmt) bool) {
		var amb Flags
		if strings.IndexByte(sql, '\\') >= 0 {
			if std := summarize(sql, false); std.backslash && summarize(sql, true).sig != std.sig {
				amb = Ambiguous
			}
		}
		scan(sql, false, true, func(st Stmt) bool {
			st.Flags |= amb
			return yield(st)
		})
	}
}

// Classify returns the union of the flags of sql's statements and their
// number, without allocating. When the statements would differ with
// standard_conforming_strings off, the flags of both readings are merged
// and Ambiguous is set.
func Classify(sql string) Summary {
	std := summarize(sql, false)
	s := Summary{Flags: std.flags, Statements: std.count}
	if std.backslash {
		if alt := summarize(sql, true); alt.sig != std.sig {
			s.Flags |= alt.flags | Ambiguous
			s.Statements = max(s.Statements, alt.count)
		}
	}
	return s
}

// summary is the result of one classifying pass.
type summary struct {
	flags     Flags
	count     int
	sig       uint64 // hash of every statement's range and flags
	backslash bool   // a plain string held a backslash
}

func summarize(sql string, escapeStrings bool) summary {
	var s summary
	s.sig = 14695981039346656037
	s.backslash = scan(sql, escapeStrings, false, func(st Stmt) bool {
		s.flags |= st.Flags
		s.count++
		for _, v := range [3]uint64{uint64(st.Start), uint64(st.End), uint64(st.Flags)} {
			s.sig = (s.sig ^ v) * 1099511628211
		}
		return true
	})
	return s
}

// Fingerprint hashes sql's shape: its keywords, identifiers, operators and
// punctuation, with constants (strings, dollar-quoted strings, numbers) and
// comments left out and unquoted words folded to lower case. Texts that
// differ only in their literal values, as a simple-protocol client's
// queries do, share a fingerprint, so a pooler can keep statistics per kind
// of query without keeping the texts. It does not allocate.
func Fingerprint(sql string) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	l := lexer{src: sql}
	for {
		t := l.next()
		if t.kind == tEOF {
			return h
		}
		h = (h ^ uint64(t.kind)) * prime
		switch t.kind {
		case tString, tDollar, tNumber:
			continue
		}
		for i := t.start; i < t.end; i++ {
			c := sql[i]
			if t.kind == tIdent && 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			h = (h ^ uint64(c)) * prime
		}
	}
}
