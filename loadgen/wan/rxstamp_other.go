//go:build !linux

package wan

import (
	"net"
	"net/netip"
	"syscall"
	"time"
)

// stampOOB is 0 where the kernel's receive timestamps are not used.
const stampOOB = 0

// enableRxStamps reports false: receive timestamps are read on Linux only,
// elsewhere delays count from the relay's read.
func enableRxStamps(syscall.Conn) bool { return false }

// readUDPStamped reads one datagram; its age is always 0 here.
func readUDPStamped(c *net.UDPConn, buf, _ []byte) (int, netip.AddrPort, time.Duration, error) {
	n, from, err := c.ReadFromUDPAddrPort(buf)
	return n, from, 0, err
}

// stampedTCPReader is the plain reader here.
func stampedTCPReader(c *net.TCPConn) func([]byte) (int, time.Duration, error) {
	return plainTCPReader(c)
}
