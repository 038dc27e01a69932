package sqllex

// Function bodies.
//
// A trigger, a view or a column default that calls a user-defined
// function runs its body where the client's text does not show it. The
// pooler can still vouch for such a function when its body, read as
// text, can change nothing in the session: an audit trigger that INSERTs
// a row, a trigger that sets NEW.updated_at. RoutineBodyHarmless decides
// that for the body of a LANGUAGE sql or plpgsql function.
//
// PL/pgSQL is not SQL, so the statement-level reading of Classify cannot
// be trusted on it: "IF x THEN SET search_path = y; END IF" is one
// statement to the lexer, which starts with IF, and its SET goes unseen.
// What holds in any language is the token-level reading: a call of a
// function is a name followed by "(" wherever it stands, and a keyword is
// a token. So a body is harmless only when
//   - every call in it is of a harmless built-in (no OpaqueCall, SetConfig,
//     advisory lock or OtherBackend flag, nothing unterminated or read two
//     ways), and Classify finds nothing but what PL/pgSQL's own syntax
//     produces (its BEGIN and END blocks, SELECT … INTO a variable, its
//     cursors, NOTIFY);
//   - it holds none of the keywords of the statements that change the
//     session or the catalog, wherever they stand: EXECUTE (dynamic SQL,
//     which hides anything), RESET, LISTEN, UNLISTEN, PREPARE,
//     DEALLOCATE, DISCARD, LOAD, CALL, COPY, CREATE, ALTER, DROP, COMMIT,
//     ROLLBACK, SAVEPOINT, RELEASE, HOLD, IMPORT, SECURITY;
//   - SET and DO stand only where UPDATE … SET and ON CONFLICT … DO do:
//     right after a name (UPDATE t SET, UPDATE t AS x SET, DO UPDATE SET),
//     and for DO after ")" or CONFLICT too, never where a statement may
//     start (after ";", a block keyword, a label, or at the start).
// A name of a keyword can be a column or variable name too; a body using
// one is taken as unsafe, which costs the pooler a probe, never a leak.

// bodyAllowed are the flags PL/pgSQL's syntax produces in Classify's
// statement-level reading without changing the session: its BEGIN and
// END (read as transaction control), SELECT … INTO a variable (read as
// SELECT INTO a table, which a CREATE keyword would be needed for
// otherwise), its cursors, which end with the transaction, and NOTIFY.
const bodyAllowed = Begin | Commit | SchemaChange | DeclareCursor | CloseCursor | Notify

// bodyDenied are the keywords of statements that may change the session
// or the catalog wherever they stand in a body.
var bodyDenied = map[string]struct{}{
	"execute": {}, "reset": {}, "listen": {}, "unlisten": {}, "prepare": {},
	"deallocate": {}, "discard": {}, "load": {}, "call": {}, "copy": {},
	"create": {}, "alter": {}, "drop": {}, "commit": {}, "rollback": {},
	"savepoint": {}, "release": {}, "hold": {}, "import": {}, "security": {},
}

// blockWords are PL/pgSQL keywords after which a statement may start
// without a semicolon between them.
var blockWords = map[string]struct{}{
	"begin": {}, "then": {}, "else": {}, "loop": {}, "declare": {}, "exception": {},
}

// RoutineBodyHarmless reports whether body, the source of a LANGUAGE sql
// or plpgsql function (pg_proc.prosrc), provably leaves the session as it
// found it, by the rules above. It does not allocate.
func RoutineBodyHarmless(body string) bool {
	if Classify(body).Flags&^bodyAllowed != 0 {
		return false
	}
	l := lexer{src: body}
	if !bodyTokensHarmless(&l) {
		return false
	}
	if !l.backslash {
		return true
	}
	l = lexer{src: body, escapeStrings: true}
	return bodyTokensHarmless(&l)
}

// bodyTokensHarmless reads l's text for RoutineBodyHarmless.
func bodyTokensHarmless(l *lexer) bool {
	var buf [mentionBuf]byte
	prevName := false        // the token before was a name, not a block keyword
	prevCloseOrConf := false // ... or ")" or CONFLICT, which DO may follow
	for {
		t := l.next()
		switch t.kind {
		case tEOF:
			return true
		case tBad:
			return false
		case tIdent, tQIdent:
			name, ok := identName(&buf, l.src, t)
			if !ok {
				return false
			}
			if t.kind == tIdent {
				w := string(name) // no allocation: used as a map key only
				if _, denied := bodyDenied[w]; denied {
					return false
				}
				switch w {
				case "set":
					if !prevName {
						return false
					}
				case "do":
					if !prevName && !prevCloseOrConf {
						return false
					}
				}
				_, block := blockWords[w]
				prevName, prevCloseOrConf = !block, w == "conflict"
				continue
			}
			prevName, prevCloseOrConf = true, false
		case tRParen:
			prevName, prevCloseOrConf = false, true
		default:
			prevName, prevCloseOrConf = false, false
		}
	}
}
