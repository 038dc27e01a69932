package sqllex

// Held is a set of kinds of session state that live on one server
// connection and cannot be moved to another: a pooler that lends
// connections per transaction must keep a client that holds any of them
// on its connection (or refuse the statement), and may let it go once the
// server holds none of them any more.
type Held uint8

// Kinds of session state a pooler cannot move between server connections.
const (
	// HeldTemp is a temporary table, view, sequence, function or type.
	HeldTemp Held = 1 << iota
	// HeldListen is a LISTEN registration: notifications are delivered to
	// the server session that listens.
	HeldListen
	// HeldAdvisory is a session-level advisory lock.
	HeldAdvisory
	// HeldCursor is a cursor declared WITH HOLD, which outlives its
	// transaction.
	HeldCursor
	// HeldPrepare is a statement prepared with SQL PREPARE.
	HeldPrepare

	// HeldAll holds every kind.
	HeldAll = HeldTemp | HeldListen | HeldAdvisory | HeldCursor | HeldPrepare
)

var heldNames = [...]string{"temp_table", "listen", "advisory_lock", "cursor_with_hold", "prepare"}

// Names returns the kinds in h in a fixed order, as short snake_case words
// fit for a metric label or a log attribute.
func (h Held) Names() []string {
	var out []string
	for i, n := range heldNames {
		if h&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

// stateFlags holds every flag Holds, Releases or Opaque look at.
const stateFlags = CreateTemp | Listen | AdvisoryLock | DeclareHold | Prepare |
	DiscardAll | DiscardTemp | Drop | Unlisten | AdvisoryUnlock | CloseCursor | Deallocate |
	DoBlock | Call | OpaqueCall | Execute

// Holds returns the kinds of session state statements with flags f may
// leave behind: CREATE TEMP (and pg_temp objects, SELECT … INTO TEMP),
// LISTEN, a session advisory lock call, DECLARE … WITH HOLD and SQL
// PREPARE. It says what may be created, not what surely was: a statement
// that fails or is rolled back creates nothing, which a caller that errs
// towards keeping the connection can ignore.
func (f Flags) Holds() Held {
	if f&stateFlags == 0 {
		return 0
	}
	var h Held
	if f&CreateTemp != 0 {
		h |= HeldTemp
	}
	if f&Listen != 0 {
		h |= HeldListen
	}
	if f&AdvisoryLock != 0 {
		h |= HeldAdvisory
	}
	if f&DeclareHold != 0 {
		h |= HeldCursor
	}
	if f&Prepare != 0 {
		h |= HeldPrepare
	}
	return h
}

// Releases returns the kinds of session state statements with flags f may
// drop: DISCARD ALL every kind, DISCARD TEMP and DROP temporary objects,
// UNLISTEN registrations, pg_advisory_unlock* advisory locks, CLOSE
// cursors, DEALLOCATE prepared statements. Whether anything is left
// afterwards can only be known by asking the server.
func (f Flags) Releases() Held {
	if f&stateFlags == 0 {
		return 0
	}
	var h Held
	if f&DiscardAll != 0 {
		h |= HeldAll
	}
	if f&(DiscardTemp|Drop) != 0 {
		h |= HeldTemp
	}
	if f&Unlisten != 0 {
		h |= HeldListen
	}
	if f&AdvisoryUnlock != 0 {
		h |= HeldAdvisory
	}
	if f&CloseCursor != 0 {
		h |= HeldCursor
	}
	if f&Deallocate != 0 {
		h |= HeldPrepare
	}
	return h
}

// Opaque reports statements whose effect on the session the text does not
// show: DO blocks, CALL and calls of functions that are not known
// harmless built-ins (OpaqueCall) run code that may create temporary
// tables, LISTEN, take advisory locks, or change the identity and
// run-time parameters for the session, and EXECUTE runs a statement
// prepared earlier (PREPARE p AS SELECT set_config(…)) whose text it does
// not carry. A caller must find out from the server what they did.
func (f Flags) Opaque() bool { return f&(DoBlock|Call|OpaqueCall|Execute|Maintenance) != 0 }

// StateKind names the first statement of sql that may leave session state
// behind (see Flags.Holds), for log lines and error messages: "CREATE
// TEMP", "SELECT INTO TEMP", "LISTEN", "pg_advisory_lock", "DECLARE WITH
// HOLD", "PREPARE", or for a ProcessState call the functions that flag
// covers. It returns "" when no statement does. It allocates nothing.
func StateKind(sql string) string {
	kind := ""
	scan(sql, false, false, func(st Stmt) bool {
		kind = stmtStateKind(sql, st)
		return kind == ""
	})
	if kind == "" {
		// Only the reading with standard_conforming_strings off holds
		// state (see Classify): name it by its flags.
		kind = flagsStateKind(Classify(sql).Flags)
	}
	return kind
}

// stmtStateKind names what in st may hold session state.
func stmtStateKind(sql string, st Stmt) string {
	if st.Flags&CreateTemp != 0 {
		l := lexer{src: sql[st.Start:st.End]}
		if t := l.next(); t.kind == tIdent && eqFold(l.src[t.start:t.end], "select") {
			return "SELECT INTO TEMP"
		}
	}
	return flagsStateKind(st.Flags)
}

func flagsStateKind(f Flags) string {
	switch {
	case f&CreateTemp != 0:
		return "CREATE TEMP"
	case f&Listen != 0:
		return "LISTEN"
	case f&AdvisoryLock != 0:
		return "pg_advisory_lock"
	case f&DeclareHold != 0:
		return "DECLARE WITH HOLD"
	case f&Prepare != 0:
		return "PREPARE"
	case f&ProcessState != 0:
		return "a call of setseed, pg_backup_start, a replication slot or origin function or dblink_connect"
	}
	return ""
}
