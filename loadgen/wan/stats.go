package wan

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of what a relay has carried and dropped since it
// started. "Up" is client to upstream, "Down" upstream to client. For UDP,
// Received = Packets + Lost + QueueDrops + the datagrams still waiting, so a
// test or a report can account for every datagram.
type Stats struct {
	UDP UDPStats `json:"udp"`
	TCP TCPStats `json:"tcp"`
	// Packet holds packet mode's counters; nil in relay mode.
	Packet *PacketStats `json:"packet,omitempty"`
}

// UDPStats counts datagrams.
type UDPStats struct {
	Up   UDPDirection `json:"up"`
	Down UDPDirection `json:"down"`
	// Flows is the number of client mappings open now.
	Flows int64 `json:"flows"`
	// FlowsTotal counts mappings ever opened.
	FlowsTotal uint64 `json:"flows_total"`
	// FlowDrops counts datagrams from new sources dropped because
	// MaxUDPFlows mappings were open, or because an upstream socket could
	// not be opened.
	FlowDrops uint64 `json:"flow_drops"`
}

// UDPDirection counts one direction's datagrams.
type UDPDirection struct {
	// Received counts datagrams read by the relay.
	Received uint64 `json:"received"`
	// Packets and Bytes count datagrams delivered after their delay.
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
	// Lost counts datagrams dropped by the emulated loss.
	Lost uint64 `json:"lost"`
	// QueueDrops counts datagrams dropped because their flow already held
	// MaxQueueBytes.
	QueueDrops uint64 `json:"queue_drops"`
	// WriteErrors counts datagrams the kernel refused to send (for example
	// ECONNREFUSED after the upstream port closed).
	WriteErrors uint64 `json:"write_errors"`
	// Late sums and bounds how far past its delivery time each datagram was
	// sent (Late.Total/Packets is the mean): the emulator's own error.
	Late Lateness `json:"late"`
}

// Lateness measures how far behind schedule deliveries were: the relay's own
// timing error, which a report can print beside the configured RTT. It
// grows when the relay's process is short of CPU.
type Lateness struct {
	// Total is the sum over deliveries; divide by their count for the mean.
	Total time.Duration `json:"total_ns"`
	// Max is the largest single lateness.
	Max time.Duration `json:"max_ns"`
}

// TCPStats counts connections and the chunks (one read each) they carried.
type TCPStats struct {
	Up   TCPDirection `json:"up"`
	Down TCPDirection `json:"down"`
	// Conns is the number of relayed connections open now.
	Conns int64 `json:"conns"`
	// ConnsTotal counts connections accepted.
	ConnsTotal uint64 `json:"conns_total"`
	// DialErrors counts accepted connections whose upstream dial failed;
	// they are reset once the emulated handshake time has passed.
	DialErrors uint64 `json:"dial_errors"`
}

// TCPDirection counts one direction of every TCP connection.
type TCPDirection struct {
	// Chunks and Bytes count data delivered after its delay; a chunk is
	// what one read returned.
	Chunks uint64 `json:"chunks"`
	Bytes  uint64 `json:"bytes"`
	// Stalls counts reads that waited because MaxQueueBytes were already
	// held back in that direction (the sender is then slowed by TCP flow
	// control, nothing is dropped).
	Stalls uint64 `json:"stalls"`
	// Late sums and bounds how far past its delivery time each chunk was
	// written (Late.Total/Chunks is the mean).
	Late Lateness `json:"late"`
}

// counters are the live counters behind Stats.
type counters struct {
	udpUp, udpDown               udpCounters
	udpFlows                     atomic.Int64
	udpFlowsTotal, udpFlowDrops  atomic.Uint64
	tcpUp, tcpDown               tcpCounters
	tcpConns                     atomic.Int64
	tcpConnsTotal, tcpDialErrors atomic.Uint64
}

type udpCounters struct {
	received, packets, bytes, lost, queueDrops, writeErrors atomic.Uint64
	late                                                    lateCounter
}

type tcpCounters struct {
	chunks, bytes, stalls atomic.Uint64
	late                  lateCounter
}

// lateCounter accumulates Lateness.
type lateCounter struct {
	total, max atomic.Int64
}

// add records the lateness of n deliveries whose latenesses sum to total
// and peak at peak.
func (l *lateCounter) add(total, peak int64) {
	l.total.Add(total)
	for {
		m := l.max.Load()
		if peak <= m || l.max.CompareAndSwap(m, peak) {
			return
		}
	}
}

func (l *lateCounter) snapshot() Lateness {
	return Lateness{Total: time.Duration(l.total.Load()), Max: time.Duration(l.max.Load())}
}

func (c *udpCounters) snapshot() UDPDirection {
	return UDPDirection{
		Received:    c.received.Load(),
		Packets:     c.packets.Load(),
		Bytes:       c.bytes.Load(),
		Lost:        c.lost.Load(),
		QueueDrops:  c.queueDrops.Load(),
		WriteErrors: c.writeErrors.Load(),
		Late:        c.late.snapshot(),
	}
}

func (c *tcpCounters) snapshot() TCPDirection {
	return TCPDirection{Chunks: c.chunks.Load(), Bytes: c.bytes.Load(), Stalls: c.stalls.Load(), Late: c.late.snapshot()}
}

func (c *counters) snapshot() Stats {
	return Stats{
		UDP: UDPStats{
			Up:         c.udpUp.snapshot(),
			Down:       c.udpDown.snapshot(),
			Flows:      c.udpFlows.Load(),
			FlowsTotal: c.udpFlowsTotal.Load(),
			FlowDrops:  c.udpFlowDrops.Load(),
		},
		TCP: TCPStats{
			Up:         c.tcpUp.snapshot(),
			Down:       c.tcpDown.snapshot(),
			Conns:      c.tcpConns.Load(),
			ConnsTotal: c.tcpConnsTotal.Load(),
			DialErrors: c.tcpDialErrors.Load(),
		},
	}
}

// PacketStats is what a packet-mode emulator counted, per direction ("up"
// is client to server).
type PacketStats struct {
	Up   LinkStats `json:"up"`
	Down LinkStats `json:"down"`
	// TCPConns and UDPFlows count what the server-side relay carried to
	// the upstream; DialErrors the TCP connections the upstream refused.
	TCPConns   uint64 `json:"tcp_conns"`
	UDPFlows   uint64 `json:"udp_flows"`
	DialErrors uint64 `json:"dial_errors"`
}

// Since returns what was counted after base, an earlier snapshot of the
// same emulator: every counter as the difference; the maxima stay as they
// are (they cannot be split), so they may come from before base.
func (s *PacketStats) Since(base *PacketStats) *PacketStats {
	d := *s
	d.Up, d.Down = s.Up.since(base.Up), s.Down.since(base.Down)
	d.TCPConns -= min(d.TCPConns, base.TCPConns)
	d.UDPFlows -= min(d.UDPFlows, base.UDPFlows)
	d.DialErrors -= min(d.DialErrors, base.DialErrors)
	return &d
}

func (l LinkStats) since(b LinkStats) LinkStats {
	sub := func(a, b uint64) uint64 { return a - min(a, b) }
	l.Received, l.Delivered, l.Bytes = sub(l.Received, b.Received), sub(l.Delivered, b.Delivered), sub(l.Bytes, b.Bytes)
	l.Lost, l.BurstLost, l.QueueDrops = sub(l.Lost, b.Lost), sub(l.BurstLost, b.BurstLost), sub(l.QueueDrops, b.QueueDrops)
	l.Reordered, l.WriteErrors = sub(l.Reordered, b.Reordered), sub(l.WriteErrors, b.WriteErrors)
	l.QueueDelay.Total = max(l.QueueDelay.Total-b.QueueDelay.Total, 0)
	l.Late.Total = max(l.Late.Total-b.Late.Total, 0)
	return l
}
