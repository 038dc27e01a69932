package wan

import (
	"net"
	"time"
)

// maxRxAge caps the receive age taken from a kernel timestamp, so that a
// stepped wall clock cannot hold or rush a packet by more than this.
const maxRxAge = time.Second

// plainTCPReader reads c without timestamps: the age is always 0, so delays
// count from the read.
func plainTCPReader(c *net.TCPConn) func([]byte) (int, time.Duration, error) {
	return func(buf []byte) (int, time.Duration, error) {
		n, err := c.Read(buf)
		return n, 0, err
	}
}
