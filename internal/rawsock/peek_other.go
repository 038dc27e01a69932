//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package rawsock

import "syscall"

// Peek looks at a socket without consuming or waiting: recv(2) with
// MSG_PEEK|MSG_DONTWAIT into p (not empty). It reports the bytes seen (0 at
// end of file) or the call's error (EAGAIN when nothing is there).
func Peek(fd uintptr, p []byte) (int, error) {
	peeks.Add(1)
	for {
		n, _, err := syscall.Recvfrom(int(fd), p, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err != syscall.EINTR {
			return n, err
		}
	}
}
