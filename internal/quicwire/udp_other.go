//go:build !(linux && (amd64 || arm64))

package quicwire

import "net"

// newRawUDP returns c unchanged: raw UDP system calls are implemented for
// 64-bit Linux only.
func newRawUDP(c *net.UDPConn) net.PacketConn { return c }
