package quicclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/quicwire"
)

// 0-RTT (DialerConfig.ZeroRTT): a connection dialed with a session ticket
// carries its first streams' bytes in 0-RTT packets, before the handshake
// completed. When the server refuses them (its ticket keys changed, or it
// does not accept 0-RTT at all), quic-go drops those streams and every
// byte sent on them: the server never saw any. earlyConn is the session's
// net.Conn on such a connection: it keeps what the application wrote
// until the handshake completed, and after a rejection opens a new stream
// on the same connection (NextConnection) and sends those bytes again, in
// 1-RTT, once. The application sees neither the rejection nor the resend.

// earlyConn is a session stream opened before its connection's handshake
// completed.
type earlyConn struct {
	qc   *quic.Conn
	wrap func(*quic.Stream) *quicwire.Conn // a new stream's net.Conn, releasing nothing
	done func()                            // releases the stream's slot, once

	mu      sync.Mutex
	cur     *quicwire.Conn
	gen     int    // streams opened so far, minus one: a rejection is recovered once
	sent    []byte // written while the handshake may still reject them
	settled bool   // the handshake completed and the stream works: sent is dropped
	rd, wd  time.Time
}

func newEarlyConn(qc *quic.Conn, str *quic.Stream, wrap func(*quic.Stream) *quicwire.Conn, release func()) *earlyConn {
	return &earlyConn{qc: qc, wrap: wrap, done: sync.OnceFunc(release), cur: wrap(str)}
}

// conn returns the current stream's conn and its generation.
func (e *earlyConn) conn() (*quicwire.Conn, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur, e.gen
}

// settle drops the kept bytes once the handshake completed and an
// operation on the stream succeeded after it: then 0-RTT was accepted (or
// the stream is already the 1-RTT one).
func (e *earlyConn) settle(gen int) {
	select {
	case <-e.qc.HandshakeComplete():
	default:
		return
	}
	e.mu.Lock()
	if e.gen == gen {
		e.settled, e.sent = true, nil
	}
	e.mu.Unlock()
}

// recoverRejected replaces the stream of generation gen, which quic-go
// dropped with the rejected 0-RTT data, by a new one, and writes on it what
// was written before; a later generation means another caller did it.
func (e *earlyConn) recoverRejected(gen int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gen != gen {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), rejectRecoveryTimeout)
	defer cancel()
	next, err := e.qc.NextConnection(ctx)
	if err != nil {
		return fmt.Errorf("quicclient: 0-RTT rejected and the handshake failed: %w", err)
	}
	str, err := next.OpenStreamSync(ctx)
	if err != nil {
		return fmt.Errorf("quicclient: 0-RTT rejected; open its stream again: %w", err)
	}
	old := e.cur
	e.cur, e.gen, e.settled = e.wrap(str), e.gen+1, true
	_ = old.Close()
	_ = e.cur.SetReadDeadline(e.rd)
	_ = e.cur.SetWriteDeadline(e.wd)
	sent := e.sent
	e.sent = nil
	if _, err := e.cur.Write(sent); err != nil {
		return fmt.Errorf("quicclient: 0-RTT rejected; send its data again: %w", err)
	}
	return nil
}

// rejectRecoveryTimeout bounds the wait for the handshake after a 0-RTT
// rejection and the opening of the replacement stream.
const rejectRecoveryTimeout = 30 * time.Second

func (e *earlyConn) Read(p []byte) (int, error) {
	for {
		c, gen := e.conn()
		n, err := c.Read(p)
		if err != nil && errors.Is(err, quic.Err0RTTRejected) {
			if err := e.recoverRejected(gen); err != nil {
				return 0, err
			}
			continue
		}
		if n > 0 {
			e.settle(gen)
		}
		return n, err
	}
}

func (e *earlyConn) Write(p []byte) (int, error) {
	e.mu.Lock()
	if !e.settled {
		e.sent = append(e.sent, p...)
	}
	c, gen := e.cur, e.gen
	e.mu.Unlock()
	n, err := c.Write(p)
	if err != nil && errors.Is(err, quic.Err0RTTRejected) {
		// p is in sent (a stream of a later generation is settled and
		// never rejected): the recovery writes it.
		if err := e.recoverRejected(gen); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	if err == nil {
		e.settle(gen)
	}
	return n, err
}

// CloseWrite sends FIN on the current stream.
func (e *earlyConn) CloseWrite() error {
	c, _ := e.conn()
	return c.CloseWrite()
}

// Close closes the current stream and releases its slot.
func (e *earlyConn) Close() error {
	c, _ := e.conn()
	err := c.Close()
	e.done()
	return err
}

// Abort resets the current stream with code and releases its slot.
func (e *earlyConn) Abort(code pgproto.QUICErrorCode) {
	c, _ := e.conn()
	c.Abort(code)
	e.done()
}

func (e *earlyConn) LocalAddr() net.Addr  { c, _ := e.conn(); return c.LocalAddr() }
func (e *earlyConn) RemoteAddr() net.Addr { c, _ := e.conn(); return c.RemoteAddr() }

func (e *earlyConn) SetDeadline(t time.Time) error {
	if err := e.SetReadDeadline(t); err != nil {
		return err
	}
	return e.SetWriteDeadline(t)
}

func (e *earlyConn) SetReadDeadline(t time.Time) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rd = t
	return e.cur.SetReadDeadline(t)
}

func (e *earlyConn) SetWriteDeadline(t time.Time) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.wd = t
	return e.cur.SetWriteDeadline(t)
}
