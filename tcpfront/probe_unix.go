//go:build unix

package tcpfront

import (
	"fmt"
	"io"
	"syscall"
)

// probeRaw checks the socket with a non-blocking recv(MSG_PEEK|MSG_DONTWAIT):
// end of file or an error such as ECONNRESET means the client is gone; no
// data (EAGAIN) or unread data means it may still be there, after which the
// TCP state is checked where the platform tells it (a client that sent a
// last message, Terminate or a TLS close_notify, and then closed, leaves
// data ahead of its FIN). It goes through RawConn.Control, which, unlike
// RawConn.Read, does not wait for a Read in progress on the connection, so
// the watcher never blocks on a session that is reading its client.
func probeRaw(rc syscall.RawConn) func() error {
	return func() error {
		var res error
		if err := rc.Control(func(fd uintptr) {
			var buf [1]byte
			res = probeFD(int(fd), buf[:])
		}); err != nil {
			return fmt.Errorf("%w: %w", errClientGone, err)
		}
		return res
	}
}

func probeFD(fd int, buf []byte) error {
	for {
		n, _, err := syscall.Recvfrom(fd, buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
			return peerClosed(fd)
		case err != nil:
			return fmt.Errorf("%w: %w", errClientGone, err)
		case n == 0:
			return fmt.Errorf("%w: %w", errClientGone, io.EOF)
		default:
			return peerClosed(fd)
		}
	}
}
