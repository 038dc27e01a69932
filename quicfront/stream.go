package quicfront

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// streamConn adapts a *quic.Stream to net.Conn (and so io.ReadWriteCloser),
// which is what the pooler and pgx expect.
//
// quic-go forbids calling Stream.Close concurrently with Write, and a stream's
// credit only returns to the peer once both directions are finished, so the
// adapter serializes the send side with a mutex and always finishes both
// halves in Close.
type streamConn struct {
	str    *quic.Stream
	local  net.Addr
	remote net.Addr
	// onClose runs once, after Close finished both halves. It may be nil.
	onClose func()

	wmu      sync.Mutex // serializes Write, CloseWrite and Close on the send side
	sendDone bool       // FIN queued or send side canceled; guarded by wmu

	peerReset atomic.Bool // the peer reset our receive side
	closeOnce sync.Once
}

var _ net.Conn = (*streamConn)(nil)

func newStreamConn(str *quic.Stream, conn *quic.Conn, onClose func()) *streamConn {
	return &streamConn{str: str, local: conn.LocalAddr(), remote: conn.RemoteAddr(), onClose: onClose}
}

// Read reads session bytes from the peer. io.EOF means the peer closed its
// send side (FIN).
func (c *streamConn) Read(p []byte) (int, error) {
	n, err := c.str.Read(p)
	if err != nil {
		var se *quic.StreamError
		if errors.As(err, &se) && se.Remote {
			c.peerReset.Store(true)
		}
	}
	return n, err
}

// Write sends session bytes; it fails with net.ErrClosed after CloseWrite or Close.
func (c *streamConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.sendDone {
		return 0, net.ErrClosed
	}
	return c.str.Write(p)
}

// CloseWrite closes the send side only (FIN), like (*net.TCPConn).CloseWrite:
// the peer reads io.EOF while this side can still read its answer.
func (c *streamConn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.sendDone {
		return nil
	}
	c.sendDone = true
	if c.peerReset.Load() {
		c.str.CancelWrite(streamCode(ErrCodeAborted))
		return nil
	}
	_ = c.str.Close() // only fails for a stream the peer stopped; that still counts as done
	return nil
}

// Close finishes both halves so the stream's credit returns to the peer at
// once: the receive side is canceled (STOP_SENDING, no error) and the send
// side gets a FIN, or a reset if the peer reset the stream or a Write is still
// running. It is idempotent and safe to call concurrently with Read and Write.
func (c *streamConn) Close() error {
	c.closeOnce.Do(func() {
		// Receive half first: it unblocks a pending Read and needs no lock.
		c.str.CancelRead(streamCode(ErrCodeNoError))
		if !c.wmu.TryLock() {
			// A Write is running, maybe blocked on flow control. Closing in the
			// middle of a write cannot end cleanly: abort the send side, which
			// unblocks the Write, then take the lock.
			c.str.CancelWrite(streamCode(ErrCodeAborted))
			c.wmu.Lock()
			c.sendDone = true
		} else if !c.sendDone {
			c.sendDone = true
			if c.peerReset.Load() {
				c.str.CancelWrite(streamCode(ErrCodeAborted))
			} else {
				_ = c.str.Close()
			}
		}
		c.wmu.Unlock()
		if c.onClose != nil {
			c.onClose()
		}
	})
	return nil
}

// abort resets both halves with code; used when a stream is refused.
func (c *streamConn) abort(code ErrorCode) {
	c.closeOnce.Do(func() {
		c.str.CancelRead(streamCode(code))
		c.wmu.Lock()
		c.sendDone = true
		c.str.CancelWrite(streamCode(code))
		c.wmu.Unlock()
		if c.onClose != nil {
			c.onClose()
		}
	})
}

// LocalAddr returns the local UDP address of the QUIC connection.
func (c *streamConn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's UDP address of the QUIC connection.
func (c *streamConn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both read and write deadlines of the stream.
func (c *streamConn) SetDeadline(t time.Time) error { return c.str.SetDeadline(t) }

// SetReadDeadline sets the read deadline of the stream.
func (c *streamConn) SetReadDeadline(t time.Time) error { return c.str.SetReadDeadline(t) }

// SetWriteDeadline sets the write deadline of the stream.
func (c *streamConn) SetWriteDeadline(t time.Time) error { return c.str.SetWriteDeadline(t) }
