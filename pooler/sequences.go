package pooler

import "github.com/pgquic/pgquic/internal/wire"

// Sequence state a server process keeps between transactions.
//
// nextval and setval leave their value in the server process: lastval()
// returns it, and currval(s) the one of s, until the process ends or runs
// DISCARD SEQUENCES. In transaction mode one process serves many clients,
// so a client calling lastval() would read another client's value (an id
// it was given, a count of rows it inserted). A pooler cannot tell which
// request called nextval: a column DEFAULT does, and so does any
// function. So it tracks, per server connection, whose requests may have
// left such a value (serverState.seqBy), and before a request that may
// read one (a text calling lastval or currval, an opaque one, a
// FunctionCall, one that keeps the connection past itself: readsSequences)
// on a connection another client's requests ran on since the last DISCARD
// SEQUENCES, it pipelines DISCARD SEQUENCES ahead of the request. The reader then gets 55000 "not yet defined in this session",
// as on a fresh connection, never the other client's value. A client
// that comes back to a connection only it used keeps its own values; one
// whose connection served another client meanwhile loses them, as it
// would with any transaction pooler that keeps clients apart.

// seqMixed is serverState.seqBy when requests of more than one client ran
// since the last DISCARD SEQUENCES (0: none has).
const seqMixed = ^uint64(0)

// lendSequences records that the session id borrows the connection, and
// reports whether DISCARD SEQUENCES must come before its request: reads
// says the request may read sequence state, and another client's
// requests may have left some.
func (st *serverState) lendSequences(id uint64, reads bool) (discard bool) {
	switch {
	case st.seqBy == 0 || st.seqBy == id:
	case reads:
		discard = true
	default:
		st.seqBy = seqMixed
		return false
	}
	st.seqBy = id
	return discard
}

// readsSequences reports whether a request with this classification may
// read sequence state while it holds the connection: it calls lastval or
// currval, may run any code, or keeps the connection for more than this
// request (it opens a block, or may pin the session: session state, an
// identity change), so that a later statement on it is never checked at
// a borrow. The statements after the first of one extended-protocol batch
// are not checked either: a DISCARD cannot go between them.
func (info *sqlInfo) readsSequences() bool {
	return info.seqRead || info.pins.Opaque || info.begins || info.identity || info.pins.Holds != 0
}

// parseReadsSequences is readsSequences for the text of a Parse (rest:
// its body after the statement name), which the connection is borrowed
// for before the statement is made: a request's first message is often
// its Parse. A text the session's unnamed statement has already is not
// read again; a plain one is left in s.pipeText for the handler (newStmt),
// so it is lexed once. s.mu must be held.
func (s *session) parseReadsSequences(name, rest []byte) bool {
	q, _, ok := wire.CString(rest)
	if !ok {
		return true // the handler refuses it
	}
	if u := s.unnamed; len(name) == 0 && u != nil && string(rest) == u.key {
		return u.info.readsSequences() || s.hiddenText(q, &u.hid)
	}
	info := inspectSQL(q)
	if info.pipe {
		s.pipeText = lexedText{text: q, plain: true, fp: info.fp}
	}
	return info.readsSequences() || s.hiddenText(q, nil)
}

// discardSequences is DISCARD SEQUENCES as a Query message.
var discardSequences = appendQuery(nil, "DISCARD SEQUENCES")

// discardSequencesLocked pipelines DISCARD SEQUENCES ahead of the
// request a has been borrowed for; its replies are the pooler's. s.mu
// must be held.
func (s *session) discardSequencesLocked(a *attachment) error {
	s.p.m.sequenceDiscards.Inc()
	s.push(a, entry{kind: eQuery, quiet: true})
	a.st.stmts.DropUnnamed() // a simple Query destroys the unnamed statement
	return s.writeServer(a, discardSequences)
}
