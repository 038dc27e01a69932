package pooler

import (
	"bytes"
	"encoding/binary"
	"slices"

	"github.com/pgquic/pgquic/internal/wire"
)

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

// checkSequencesLocked runs as the session starts a request on a: when
// it borrows the connection, and when it starts a new sync segment on one
// it still holds (a pipeline, a block). It records that the session's
// requests run there and pipelines DISCARD SEQUENCES ahead of this one
// when another client's requests may have left sequence state and this
// request may read some: reads says the current message may, and the
// rest of the client's batch, up to its Sync, is looked at too
// (batchReadsSequences), since a DISCARD cannot go between the statements
// of one batch: it would end their implicit transaction, and take away
// the client's own nextval from an earlier statement of the batch.
// body is the current message's when it is a Parse. s.mu must be held.
func (s *session) checkSequencesLocked(a *attachment, reads bool, body []byte) error {
	st := a.st
	switch {
	case st.seqBy == 0 || st.seqBy == s.id:
		st.seqBy = s.id
		return nil
	case !reads && !s.batchReadsSequences(body):
		st.seqBy = seqMixed
		return nil
	}
	st.seqBy = s.id
	return s.discardSequencesLocked(a)
}

// readsSequences reports whether a request with this classification may
// read sequence state while it holds the connection: it calls lastval or
// currval, may run any code, or keeps the connection for more than this
// request (it opens a block, or may pin the session: session state, an
// identity change); the later statements of such a request are then
// checked only at a sync segment's start (checkSequencesLocked).
func (info *sqlInfo) readsSequences() bool {
	return info.seqRead || info.pins.Opaque || info.begins || info.identity || info.pins.Holds != 0
}

// batchReadsSequences reports whether a message after the current one, up
// to the Sync that ends the client's extended-protocol batch, may read
// sequence state: a Parse whose text may (as parseReadsSequences judges
// it), a Bind of a statement that may, anything but Parse, Bind,
// Describe, Execute, Close and Flush. Only bytes already buffered are
// looked at: a batch whose Sync has not arrived (longer than the read
// buffer, or waiting behind a Flush for the first results) counts as
// reading, so a DISCARD is the price of not knowing, never a leak. A
// simple Query or FunctionCall is a request of its own. body is the
// current message's when it is a Parse. s.mu must be held.
func (s *session) batchReadsSequences(body []byte) bool {
	if s.curTyp == 'Q' || s.curTyp == 'F' {
		return false
	}
	tail := s.cr.Peek() // after a message the handler read whole
	if tail == nil {    // or the current message is still to be forwarded
		f := s.cr.Frames()
		if len(f) < s.msgLen {
			return true
		}
		tail = f[s.msgLen:]
	}
	// The statements parsed in the batch so far: a Bind of one of them is
	// judged by its Parse.
	var parsed [16][]byte
	n := 0
	if s.curTyp == 'P' {
		parsed[0], _, _ = wire.CString(body)
		n = 1
	}
	for {
		if len(tail) < wire.HeaderLen {
			return true
		}
		size := 1 + int(binary.BigEndian.Uint32(tail[1:wire.HeaderLen]))
		if size < wire.HeaderLen || len(tail) < size {
			return true
		}
		typ, body := tail[0], tail[wire.HeaderLen:size]
		tail = tail[size:]
		switch typ {
		case 'S':
			return false
		case 'D', 'E', 'C', 'H':
		case 'P':
			name, rest, ok := wire.CString(body)
			q, _, ok2 := wire.CString(rest)
			if !ok || !ok2 || n == len(parsed) {
				return true
			}
			if info := inspectSQL(q); info.readsSequences() || s.hiddenText(q, nil) {
				return true
			}
			parsed[n] = name
			n++
		case 'B':
			_, rest, ok := wire.CString(body)
			name, _, ok2 := wire.CString(rest)
			if !ok || !ok2 {
				return true
			}
			if slices.ContainsFunc(parsed[:n], func(p []byte) bool { return bytes.Equal(p, name) }) {
				continue
			}
			st := s.unnamed
			if len(name) != 0 {
				st = s.stmts[string(name)]
			}
			if st == nil || st.info.readsSequences() || s.hiddenText(st.text(), &st.hid) {
				return true
			}
		default:
			return true
		}
	}
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
	// The text is read by the catalog now, before the connection is
	// borrowed (which may wait while DDL commits): the attachment counts
	// from here (catalogAtHand).
	names := s.catalogAtHand()
	if u := s.unnamed; len(name) == 0 && u != nil && string(rest) == u.key {
		return u.info.readsSequences() || (len(q) > 0 && hiddenIn(names, q, &u.hid))
	}
	info := inspectSQL(q)
	hidden := len(q) > 0 && hiddenIn(names, q, nil)
	if info.pipe && !hidden {
		// Plain for the lanes too (scanBatch takes it as read). A text
		// naming code behind a name is left to scanBatch, which refuses
		// it: before, it was left here as plain, and such a Parse shared
		// a connection (TestHiddenParseNotPipelined).
		s.pipeText = lexedText{text: q, plain: true, fp: info.fp}
	}
	return info.readsSequences() || hidden
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
