//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package backend

// peekFD is unavailable on this platform; initRaw still binds it, so it
// reports a quiet socket and the round-trip health check decides.
func (c *Conn) peekFD(fd uintptr) bool { return true }

// peekResult always reports a healthy socket on this platform.
func (c *Conn) peekResult() error { return nil }
