//go:build linux

package quicwire

import (
	"net"
	"syscall"
)

// effectiveUDPBuffers reports the usable receive and send buffer sizes. Linux
// reports twice the size it grants (the other half is bookkeeping), so the
// values are halved. When the plain setsockopt was capped by
// net.core.rmem_max/wmem_max, it tries the privileged SO_*BUFFORCE options,
// which succeed for root or CAP_NET_ADMIN.
func effectiveUDPBuffers(conn *net.UDPConn, want int) (rcv, snd int, ok bool) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var serr error
	cerr := raw.Control(func(fd uintptr) {
		get := func(opt int) int {
			v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, opt)
			if err != nil {
				serr = err
			}
			return v / 2
		}
		rcv, snd = get(syscall.SO_RCVBUF), get(syscall.SO_SNDBUF)
		if rcv < want {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, want)
			rcv = get(syscall.SO_RCVBUF)
		}
		if snd < want {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, want)
			snd = get(syscall.SO_SNDBUF)
		}
	})
	if cerr != nil || serr != nil {
		return 0, 0, false
	}
	return rcv, snd, true
}
