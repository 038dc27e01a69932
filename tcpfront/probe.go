package tcpfront

import (
	"errors"
	"net"
)

// errClientGone is what a probe reports for a client that closed or reset
// its end of the connection.
var errClientGone = errors.New("tcpfront: client closed the connection")

// newProbe returns the front.Peer.Probe for conn: a check, without reading
// from the connection or waiting, that the client is still there. It looks
// at the TCP socket itself, so it keeps working after the session switched
// to TLS on top of it. It returns nil (no probe) when conn is not a TCP
// connection or the platform offers no way to look.
func newProbe(conn net.Conn) func() error {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return probeRaw(rc)
}
