// Package quicwire holds the QUIC side of pgquic's wire contract that the
// server front (quicfront) and the client (quicclient) share: a stream as a
// net.Conn that finishes both halves on Close, the application error codes
// in quic-go's types, the certificate fingerprint clients pin, and the UDP
// socket buffer sizing both ends apply. It never imports the pooler.
package quicwire

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/pgproto"
)

// Conn adapts a *quic.Stream to net.Conn (and so io.ReadWriteCloser),
// which is what the pooler and pgx expect.
//
// quic-go forbids calling Stream.Close concurrently with Write, and a stream's
// credit only returns to the peer once both directions are finished, so the
// adapter serializes the send side with a mutex and always finishes both
// halves in Close.
type Conn struct {
	str    *quic.Stream
	local  net.Addr
	remote net.Addr
	// onClose runs once, after Close finished both halves. It may be nil.
	onClose func()

	wmu      sync.Mutex // serializes Write, CloseWrite and Close on the send side
	sendDone bool       // FIN queued or send side canceled; guarded by wmu

	// With a Coalescer (client side), small writes wait for it; nil on
	// the server, whose idle sessions should cost as little as possible.
	*coalescing

	peerReset atomic.Bool // the peer reset our receive side
	closeOnce sync.Once
}

var _ net.Conn = (*Conn)(nil)

// NewConn wraps str, a stream of conn. onClose, when not nil, runs once after
// Close or Abort finished both halves.
func NewConn(str *quic.Stream, conn *quic.Conn, onClose func()) *Conn {
	return &Conn{str: str, local: conn.LocalAddr(), remote: conn.RemoteAddr(), onClose: onClose}
}

// Stream returns the wrapped stream, for what net.Conn does not offer (its
// ID, Peek, its context).
func (c *Conn) Stream() *quic.Stream { return c.str }

// Read reads session bytes from the peer. io.EOF means the peer closed its
// send side (FIN).
func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.str.Read(p)
	if n > 0 && c.coalescing != nil {
		c.lastRead.Store(int64(time.Since(c.co.epoch)))
	}
	if err != nil {
		var se *quic.StreamError
		if errors.As(err, &se) && se.Remote {
			c.peerReset.Store(true)
		}
	}
	return n, err
}

// WaitRead blocks until the stream has bytes to read, or a Read would fail
// (FIN, reset, Close, deadline), without consuming anything: a session
// waiting for its client's next message need not hold a read buffer.
func (c *Conn) WaitRead() error {
	var b [1]byte
	_, err := c.str.Peek(b[:])
	return err
}

// Write sends session bytes; it fails with net.ErrClosed after CloseWrite or Close.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.sendDone {
		return 0, net.ErrClosed
	}
	if c.coalescing != nil {
		if err := c.pendingErr(); err != nil {
			return 0, err
		}
		if c.queue(p) {
			return len(p), nil
		}
		// Written at once: what is queued goes first.
		if err := c.writePending(); err != nil {
			return 0, err
		}
	}
	return c.str.Write(p)
}

// writePending writes the queued bytes with a blocking Write; wmu is held.
func (c *Conn) writePending() error {
	if c.coalescing == nil {
		return nil
	}
	if p := c.takePending(); len(p) > 0 {
		if _, err := c.str.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// CloseWrite closes the send side only (FIN), like (*net.TCPConn).CloseWrite:
// the peer reads io.EOF while this side can still read its answer.
func (c *Conn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.sendDone {
		return nil
	}
	c.sendDone = true
	if c.peerReset.Load() {
		c.str.CancelWrite(StreamCode(pgproto.QUICAborted))
		return nil
	}
	if err := c.writePending(); err != nil {
		c.str.CancelWrite(StreamCode(pgproto.QUICAborted))
		return err
	}
	_ = c.str.Close() // only fails for a stream the peer stopped; that still counts as done
	return nil
}

// Close finishes both halves so the stream's credit returns to the peer at
// once: the receive side is canceled (STOP_SENDING, no error) and the send
// side gets a FIN, or a reset if the peer reset the stream or a Write is still
// running. It is idempotent and safe to call concurrently with Read and Write.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		// Receive half first: it unblocks a pending Read and needs no lock.
		c.str.CancelRead(StreamCode(pgproto.QUICNoError))
		if !c.wmu.TryLock() {
			// A Write is running, maybe blocked on flow control. Closing in the
			// middle of a write cannot end cleanly: abort the send side, which
			// unblocks the Write, then take the lock.
			c.str.CancelWrite(StreamCode(pgproto.QUICAborted))
			c.wmu.Lock()
			c.sendDone = true
		} else if !c.sendDone {
			c.sendDone = true
			if c.peerReset.Load() || !c.sendQueued() {
				c.str.CancelWrite(StreamCode(pgproto.QUICAborted))
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

// Abort resets both halves with code; used when a stream is refused or a
// session is cut.
func (c *Conn) Abort(code pgproto.QUICErrorCode) {
	c.closeOnce.Do(func() {
		c.str.CancelRead(StreamCode(code))
		c.wmu.Lock()
		c.sendDone = true
		c.str.CancelWrite(StreamCode(code))
		c.wmu.Unlock()
		if c.onClose != nil {
			c.onClose()
		}
	})
}

// LocalAddr returns the local UDP address of the QUIC connection.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's UDP address of the QUIC connection.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both read and write deadlines of the stream.
func (c *Conn) SetDeadline(t time.Time) error { return c.str.SetDeadline(t) }

// SetReadDeadline sets the read deadline of the stream.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.str.SetReadDeadline(t) }

// SetWriteDeadline sets the write deadline of the stream.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.str.SetWriteDeadline(t) }

// StreamCode converts a wire-contract code for RESET_STREAM and STOP_SENDING.
func StreamCode(c pgproto.QUICErrorCode) quic.StreamErrorCode { return quic.StreamErrorCode(c) }

// AppCode converts a wire-contract code for CONNECTION_CLOSE.
func AppCode(c pgproto.QUICErrorCode) quic.ApplicationErrorCode {
	return quic.ApplicationErrorCode(c)
}

// Fingerprint returns the hex SHA-256 of a DER certificate: the value a
// client pins and a server with a generated certificate logs.
// It is front.Fingerprint, the spelling edge-trust files use too.
func Fingerprint(der []byte) string { return front.Fingerprint(der) }
