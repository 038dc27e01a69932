package pooler

import (
	"context"
	"time"

	"github.com/pgquic/pgquic/internal/wire"
	"github.com/pgquic/pgquic/pooler/lanes"
)

// Writes to the attached server. Handling a client message stages the
// frames it produces while s.mu is held; sendOut writes them once the lock
// is released, and flushAll pushes them out before the owner waits for the
// client again.

// writeServer stages frame (or, when frame is nil, the current client
// message itself) for a's server. Nothing is written while s.mu is held:
// sendOut does the writing once the lock is released.
func (s *session) writeServer(a *attachment, frame []byte) error {
	if a.replay != nil {
		f, err := s.recordFrame(a, frame)
		if err != nil {
			return err
		}
		frame = f
	}
	s.outAtt = a
	if frame == nil {
		s.outFwd = true
		return nil
	}
	s.out = append(s.out, frame...)
	return nil
}

// sendOut writes what handling the last client message staged. It runs
// without s.mu because a write to the server may block until the server
// reads, and a server busy sending replies reads only once they are drained
// by the relay, which needs s.mu: holding it here could deadlock a large
// pipeline. For the same reason a write that reaches the socket while
// replies are due first makes sure a relay goroutine is reading them. A
// cancel still in flight for the connection is waited for first
// (awaitCancels).
func (s *session) sendOut(ctx context.Context) error {
	s.trimScratch()
	a := s.outAtt
	if a == nil {
		return nil
	}
	if s.cancelsOut.Load() != 0 {
		if err := s.awaitCancels(ctx, a); err != nil {
			s.dropOut()
			return err
		}
	}
	s.outAtt = nil
	conn := a.conn
	n := len(s.out)
	if s.outFwd {
		n += s.msgLen
	}
	if n > conn.W.Available() {
		s.mu.Lock()
		if !a.released && !a.relaying && a.pending() > 0 && a.rider == nil {
			// (A request on a shared connection is read inline once
			// complete, in its turn: the session must not read its
			// client meanwhile, or its next request would follow others'
			// on that connection.)
			s.startRelayLocked(a)
		}
		s.mu.Unlock()
	}
	if s.wlocked && s.wconn != conn {
		if err := s.wconn.W.Flush(); err != nil {
			s.serverWriteFailed(err)
		}
		s.wlocked, s.wconn = false, nil
		s.wmu.Unlock()
	}
	if !s.wlocked {
		s.wmu.Lock()
		s.wlocked, s.wconn = true, conn
	}
	var err error
	if len(s.out) > 0 {
		if _, werr := conn.W.Write(s.out); werr != nil {
			err = &wire.WriteError{Err: werr}
		}
		if cap(s.out) > maxKeptBuf {
			s.out = nil // do not pin a large buffer after a big message
		} else {
			s.out = s.out[:0]
		}
	}
	fwd := s.outFwd
	s.outFwd = false
	if err == nil && fwd {
		err = s.cr.Forward(conn.W)
	}
	return err
}

// dropOut forgets staged output after a failed message.
func (s *session) dropOut() {
	s.outAtt, s.outFwd = nil, false
	s.out = s.out[:0]
	s.trimScratch()
}

// maxKeptBuf bounds the staging buffers (out, scratch) a session keeps
// between messages: one grown for a single large message is dropped rather
// than held for the rest of the session.
const maxKeptBuf = 64 << 10

// trimScratch drops the scratch buffer if a large message grew it. Frames
// built in it have been copied to s.out by then (writeServer).
func (s *session) trimScratch() {
	if cap(s.scratch) > maxKeptBuf {
		s.scratch = nil
	}
}

// serverWriteFailed handles a failed write to the attached server: the
// connection is closed, so the reply reader fails too and tells the client
// (FATAL 08006) instead of waiting for replies that will never come.
func (s *session) serverWriteFailed(err error) {
	s.log.Warn("writing to server failed", "err", err)
	s.mu.Lock()
	if a := s.att; a != nil && !a.released {
		a.destroy = true
		_ = a.conn.NetConn().Close()
	}
	s.mu.Unlock()
}

// flushAll pushes buffered bytes to the server and to the client. A request
// written on a shared server connection is complete by then (pipeline.go):
// the next client's may follow it. With readNext, the caller reads the
// replies at once if serveReplies will (the owner's loop): the flush to the
// server may then be left to that read (see flushOnRead).
func (s *session) flushAll(readNext bool) error {
	var rd *lanes.Rider
	if a := s.att; a != nil && a.rider != nil {
		rd = a.endWrite() // before the flush, which may wait for the server to read
	}
	if s.wlocked {
		var err error
		deferred := readNext && s.flushOnRead(rd)
		if !deferred {
			err = s.wconn.W.Flush()
		}
		s.wlocked = false
		s.wconn = nil
		s.wmu.Unlock()
		if err != nil {
			s.serverWriteFailed(err)
		}
		if deferred {
			rd = nil // the read's flush ends the writing (doneWriting)
		}
	}
	if rd != nil {
		rd.DoneWriting(s.p.laneLimits())
	}
	return s.flushClient()
}

// flushOnRead leaves the flush of the owner's writes to the server to the
// read of their replies that serveReplies makes next on the owner
// (relayInline), and reports whether it did (backend.Conn.FlushOnRead):
// that read sends them from inside its wait in the poller and saves the
// system call that would find nothing before the reply.
//
// Only when that read comes at once (the owner reads next, a reply is due,
// and on a shared connection the request's replies are the next to be
// read: a request behind others' is flushed now, so the server has it
// while it answers theirs), and only for a client whose last request took
// over flushOnReadAfter. A read that comes right after the write finds a
// quick reply already there about half the time on loopback (pgbench -S),
// and then needs no wait at all, where the deferred read always waits: for
// such replies the two ways cost the same system calls (measured), so the
// plain one stays. rd, when not nil, is the rider whose writing ends with
// the flush: the next request may then be written behind it.
//
// Nothing may wait for the client between now and that flush: on a shared
// connection the next client's request is written only after it, so a
// client too slow to read what it was sent would hold up another client.
// Between here and the read the owner only flushes the client writer
// (flushAll, relayOne), which costs nothing when it is empty; so a flush
// is deferred only when the client writer holds nothing.
func (s *session) flushOnRead(rd *lanes.Rider) bool {
	s.mu.Lock()
	a := s.att
	ok := s.slowReplies && a != nil && a.conn == s.wconn && s.readsInlineLocked(a) &&
		(a.rider == nil || a.rider.Leads())
	s.mu.Unlock()
	if !ok || !s.clientFlushed() {
		return false
	}
	var then func()
	if rd != nil {
		then = s.doneWritingFn
	}
	if !a.conn.FlushOnRead(then) {
		return false
	}
	s.flushRider = rd
	return true
}

// clientFlushed reports whether the client writer holds no bytes, so that
// flushing it cannot wait for the client.
func (s *session) clientFlushed() bool {
	s.cwMu.Lock()
	defer s.cwMu.Unlock()
	return s.cw == nil || s.cw.Buffered() == 0
}

// flushOnReadAfter is how long a client's last request must have taken to
// answer for flushOnRead to defer the next flush: far above what a reply
// from a server on the same host takes to a quick query (tens of
// microseconds), far below a WAN's round trip.
const flushOnReadAfter = time.Millisecond

// doneWriting ends the writing of the request whose flush flushOnRead left
// to the read of its reply; that read runs it once it has flushed.
func (s *session) doneWriting() {
	rd := s.flushRider
	s.flushRider = nil
	rd.DoneWriting(s.p.laneLimits())
}

func appendQuery(dst []byte, sql string) []byte {
	dst = wire.AppendHeader(dst, 'Q', len(sql)+1)
	dst = append(dst, sql...)
	return append(dst, 0)
}
