package quicfront

import (
	"log/slog"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/front"
)

// liveAddr is the Peer.Addr the sessions of one QUIC connection get: the
// connection's current remote address, read at every use. A QUIC
// connection survives a change of the client's address (NAT rebinding, or
// the client moving to another path, which quic-go validates with
// PATH_CHALLENGE before it sends there), so the address a session was
// started from may no longer be the client's: logs, SHOW CLIENTS and the
// pooler's per-source accounting then follow the connection instead of
// naming an address the client left. Its String is the *net.UDPAddr's.
type liveAddr struct{ conn *quic.Conn }

// Network returns "udp".
func (liveAddr) Network() string { return "udp" }

// String returns the connection's current remote address, host:port.
func (a liveAddr) String() string { return a.conn.RemoteAddr().String() }

// followSource moves sc's MaxConnsPerSource count to the source of its
// current remote address when the client's address changed since it was
// last looked at (at admission, then at each new stream and whenever a
// connection is refused for its source), and logs the move. s.mu held.
func (s *Server) followSource(sc *serverConn, log *slog.Logger) {
	src := front.Source(sc.conn.RemoteAddr())
	if src == sc.source {
		return
	}
	if s.bySource[sc.source]--; s.bySource[sc.source] <= 0 {
		delete(s.bySource, sc.source)
	}
	log.Info("QUIC client address changed; the connection's source follows it",
		"from_source", sc.source, "source", src, "remote", sc.conn.RemoteAddr().String())
	sc.source = src
	s.bySource[src]++
}

// resyncSources brings every connection's source up to date (followSource)
// before a connection is refused for its source's count, so a client that
// moved away is not counted where it no longer is. s.mu held.
func (s *Server) resyncSources() {
	for sc := range s.conns {
		s.followSource(sc, s.log)
	}
}
