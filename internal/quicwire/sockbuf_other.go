//go:build !linux

package quicwire

import "net"

// effectiveUDPBuffers cannot inspect socket buffers portably outside Linux;
// quic-go's own check and warning apply there.
func effectiveUDPBuffers(conn *net.UDPConn, want int) (rcv, snd int, ok bool) {
	return 0, 0, false
}
