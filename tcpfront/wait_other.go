//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package tcpfront

import "net"

// withWait returns stream unchanged: without a way to look at the socket
// without reading it, a session keeps its read buffer while idle.
func withWait(stream, _ net.Conn) net.Conn { return stream }
