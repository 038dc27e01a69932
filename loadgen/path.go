package loadgen

import (
	"net"
	"sync"
	"time"

	"github.com/pgquic/pgquic/loadgen/wan"
)

// PathStats is what a client's transport saw of the network path since its
// sessions connected: TCP from each connection's TCP_INFO, summed; QUIC
// from quic-go's connection statistics, summed over the live connections.
type PathStats struct {
	// Retransmits counts retransmitted TCP segments (0 for QUIC, which
	// retransmits frames in new packets and counts LostPackets instead).
	Retransmits uint64
	// SentPackets counts packets (TCP segments, QUIC packets) sent.
	SentPackets uint64
	// LostPackets counts packets declared lost (QUIC), or TCP
	// retransmissions the receiver did not report as duplicates.
	LostPackets uint64
	// SRTT is the smoothed round-trip time, averaged over connections.
	SRTT time.Duration
	// Conns is the number of connections the figures cover.
	Conns int
}

// PathStats samples the path statistics of every connection the client
// opened (TCP connections closed since keep their last reading).
func (c *Clients) PathStats() PathStats {
	if c.quicPath != nil {
		return c.quicPath()
	}
	return c.tcp.stats()
}

// tcpConns remembers every TCP connection the client dialed, with its last
// TCP_INFO reading, so counters survive a reconnect.
type tcpConns struct {
	mu    sync.Mutex
	conns []*tcpConn
}

type tcpConn struct {
	conn net.Conn
	last wan.TCPPathInfo
}

func (t *tcpConns) add(c net.Conn) {
	t.mu.Lock()
	t.conns = append(t.conns, &tcpConn{conn: c})
	t.mu.Unlock()
}

func (t *tcpConns) stats() PathStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	var st PathStats
	var srtt time.Duration
	live := 0
	for _, c := range t.conns {
		if info, err := wan.TCPInfo(c.conn); err == nil {
			c.last = info
			srtt += info.SRTT
			live++
		}
		st.Retransmits += c.last.Retransmits
		st.SentPackets += c.last.SentPackets
		st.LostPackets += c.last.LostPackets
	}
	st.Conns = live
	if live > 0 {
		st.SRTT = srtt / time.Duration(live)
	}
	return st
}
