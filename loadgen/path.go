package loadgen

import (
	"net"
	"slices"
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
	mu      sync.Mutex
	conns   []*tcpConn
	retired PathStats // counters of connections that left conns
	// retiredSRTT sums the last smoothed RTT of retiredN retired
	// connections: with a session per query none may be live when sampled.
	retiredSRTT time.Duration
	retiredN    int
}

type tcpConn struct {
	conn net.Conn
	last wan.TCPPathInfo
}

func (t *tcpConns) add(c net.Conn) *tcpConn {
	tc := &tcpConn{conn: c}
	t.mu.Lock()
	t.conns = append(t.conns, tc)
	t.mu.Unlock()
	return tc
}

// retire reads tc's counters a last time, adds them to the totals and
// forgets it; call it before the connection closes.
func (t *tcpConns) retire(tc *tcpConn) {
	info, err := wan.TCPInfo(tc.conn)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil {
		tc.last = info
	}
	t.retired.Retransmits += tc.last.Retransmits
	t.retired.SentPackets += tc.last.SentPackets
	t.retired.LostPackets += tc.last.LostPackets
	if tc.last.SRTT > 0 {
		t.retiredSRTT += tc.last.SRTT
		t.retiredN++
	}
	if i := slices.Index(t.conns, tc); i >= 0 {
		t.conns[i] = t.conns[len(t.conns)-1]
		t.conns = t.conns[:len(t.conns)-1]
	}
}

// retiringConn is a session-per-query TCP connection: its Close retires it
// from tcpConns first.
type retiringConn struct {
	net.Conn
	t    *tcpConns
	tc   *tcpConn
	once sync.Once
}

func (r *retiringConn) Close() error {
	r.once.Do(func() { r.t.retire(r.tc) })
	return r.Conn.Close()
}

func (t *tcpConns) stats() PathStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.retired
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
	switch {
	case live > 0:
		st.SRTT = srtt / time.Duration(live)
	case t.retiredN > 0:
		st.SRTT = t.retiredSRTT / time.Duration(t.retiredN)
	}
	return st
}
