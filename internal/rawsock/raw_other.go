//go:build !linux

package rawsock

import "syscall"

// Elsewhere Wrap keeps the net package's own reads and writes.
const supported = false

func rawRead(uintptr, []byte) (int, syscall.Errno)  { return 0, syscall.ENOSYS }
func rawWrite(uintptr, []byte) (int, syscall.Errno) { return 0, syscall.ENOSYS }
