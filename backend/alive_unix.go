//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package backend

import (
	"fmt"
	"io"
	"syscall"

	"github.com/pgquic/pgquic/internal/rawsock"
)

// peekFD looks at the socket without consuming or waiting: recv with
// MSG_PEEK|MSG_DONTWAIT. It is called through syscall.RawConn.Read and
// returns true so the runtime never parks the goroutine waiting for data.
// The recv is a raw system call (internal/rawsock): it runs at every
// Acquire and must not wake the Go runtime's monitor thread.
func (c *Conn) peekFD(fd uintptr) bool {
	c.peekN, c.peekErr = rawsock.Peek(fd, c.peekBuf[:])
	return true
}

// peekResult turns the last peek into a liveness verdict: EAGAIN means the
// socket is quiet (healthy); data, end of file or any other error means the
// connection must not be handed out.
func (c *Conn) peekResult() error {
	switch {
	case c.peekErr == syscall.EAGAIN:
		return nil
	case c.peekErr != nil:
		return fmt.Errorf("peek socket: %w", c.peekErr)
	case c.peekN == 0:
		return fmt.Errorf("server closed the connection: %w", io.EOF)
	default:
		return errUnsolicited
	}
}
