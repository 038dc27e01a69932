package pooler

import (
	"bufio"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Writes to the client. Replies are buffered in a bufio.Writer that an idle
// session gives back to a shared pool, so thousands of idle sessions hold
// no write buffers.

// Buffer sizes. The client reader stays small because an idle session keeps
// it; the client writer is only busy while a server connection is attached.
const (
	clientReadBuf  = 4 << 10
	clientWriteBuf = 8 << 10
)

// flushClient flushes the client writer. An idle session's writer goes back
// to a shared pool, so thousands of idle sessions hold no write buffers.
func (s *session) flushClient() error {
	s.cwMu.Lock()
	defer s.cwMu.Unlock()
	if s.cw == nil {
		return nil
	}
	if err := s.cw.Flush(); err != nil {
		return err
	}
	if !s.busy.Load() {
		s.cw.Reset(nil)
		writerPool.Put(s.cw)
		s.cw = nil
	}
	return nil
}

// writerPool holds client write buffers between transactions.
var writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, clientWriteBuf) }}

// clientWriter returns the client writer, taking one from the pool when the
// session has none. cwMu must be held.
func (s *session) clientWriter() *bufio.Writer {
	if s.cw == nil {
		s.cw = writerPool.Get().(*bufio.Writer)
		s.cw.Reset(s.rwc)
	}
	return s.cw
}

// writeClient writes to the client buffer; callers hold s.mu when attached.
func (s *session) writeClient(b []byte) error {
	s.cwMu.Lock()
	defer s.cwMu.Unlock()
	_, err := s.clientWriter().Write(b)
	return err
}

// writeClientLocal writes a reply while no server is attached.
func (s *session) writeClientLocal(b []byte) error {
	return s.writeClient(b)
}

// writeRaw writes and flushes bytes during startup.
func (s *session) writeRaw(b []byte) error {
	if err := s.writeClient(b); err != nil {
		return err
	}
	return s.flushClient()
}

// send encodes, writes and flushes messages; used during startup and
// authentication, when no relay runs.
func (s *session) send(msgs ...pgproto3.BackendMessage) error {
	buf := s.scratch[:0]
	for _, m := range msgs {
		var err error
		if buf, err = m.Encode(buf); err != nil {
			return fmt.Errorf("encoding %T: %w", m, err)
		}
	}
	s.scratch = buf[:0]
	err := s.writeRaw(buf)
	s.trimScratch()
	return err
}
