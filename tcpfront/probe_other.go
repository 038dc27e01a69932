//go:build !unix

package tcpfront

import "syscall"

// probeRaw offers no probe where recv(MSG_PEEK|MSG_DONTWAIT) is not available.
func probeRaw(syscall.RawConn) func() error { return nil }
