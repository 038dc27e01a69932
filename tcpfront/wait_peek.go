//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package tcpfront

import (
	"net"
	"syscall"

	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/rawsock"
)

// waitConn is a plain TCP session's stream with front.ReadWaiter: the
// pooler waits for an idle session's next message without a read buffer
// (it goes back to a shared pool meanwhile), and the frames under that
// wait are few and small, so the GC shrinks the goroutine's stack back to
// 4 KiB after a query grew it. A session that switches to TLS reads
// through tls.Conn from then on, which does not wait this way: bytes of a
// record may already sit in the TLS layer, where a look at the socket
// cannot see them.
type waitConn struct {
	net.Conn
	rc     syscall.RawConn
	waitFn func(fd uintptr) bool // w.waitFD, bound once so a wait allocates nothing
	werr   error                 // what waitFD saw; owner only
	polled bool                  // waitFD has looked once in this wait; owner only
	peek   [1]byte
}

var _ front.ReadWaiter = (*waitConn)(nil)

// withWait returns stream, the session's stream over conn, with WaitRead
// when conn is a TCP socket; otherwise stream itself.
func withWait(stream, conn net.Conn) net.Conn {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return stream
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return stream
	}
	w := &waitConn{Conn: stream, rc: rc}
	w.waitFn = w.waitFD
	return w
}

// WaitRead blocks until the socket has bytes to read, or a read would
// fail (end of file, reset, closed, deadline), without consuming anything.
func (w *waitConn) WaitRead() error {
	w.werr, w.polled = nil, false
	if err := w.rc.Read(w.waitFn); err != nil {
		return err
	}
	return w.werr
}

// waitFD peeks at one byte without waiting: it tells the poller to wait
// (false) when nothing is there, and is done (true) when there are bytes,
// end of file or an error. Called again, the poller has seen the socket
// become readable (or end): it is done without a second look, so an idle
// session's wait costs the same system calls as the read it replaces
// (one recv that finds nothing, then the one that reads); a readiness
// that turns out empty only makes the read that follows wait.
func (w *waitConn) waitFD(fd uintptr) bool {
	if w.polled {
		return true
	}
	w.polled = true
	_, err := rawsock.Peek(fd, w.peek[:])
	if err == syscall.EAGAIN || err == syscall.EWOULDBLOCK {
		return false
	}
	w.werr = err
	return true
}
