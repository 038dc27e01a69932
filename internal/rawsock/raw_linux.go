//go:build linux

package rawsock

import (
	"syscall"
	"unsafe"
)

const supported = true

// rawRead is read(2) without the scheduler's system call bookkeeping; p is
// not empty.
func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), 0
}

// rawWrite is write(2) without the scheduler's system call bookkeeping; p
// is not empty.
func rawWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), 0
}

// Peek looks at a socket without consuming or waiting: recv(2) with
// MSG_PEEK|MSG_DONTWAIT into p (not empty), as a raw system call. It reports
// the bytes seen (0 at end of file) or the call's error (EAGAIN when nothing
// is there).
func Peek(fd uintptr, p []byte) (int, error) {
	peeks.Add(1)
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			return int(n), nil
		case syscall.EINTR:
			continue
		default:
			return 0, e
		}
	}
}
