package quicwire

import (
	"net"
	"net/netip"
)

// PacketConn returns the UDP socket as quic-go's Transport should use it:
// on Linux (64-bit) a wrapper whose batched reads (recvmmsg) and writes
// (sendmsg) are raw system calls, elsewhere c itself.
//
// Why: every read and write through the net package is a syscall.Syscall,
// whose bookkeeping wakes the Go runtime's monitor thread (sysmon) when the
// process was idle just before; at a moderate query rate, where each query
// and each reply is a packet of its own, that is several extra wake-ups per
// query (internal/rawsock does the same for the pooler's TCP sockets, with
// the figures). The wrapper also keeps the source address of each peer
// instead of allocating one per received packet, as x/net's batch reader
// does, and builds the destination of a send on the stack.
//
// The wrapper implements quic-go's OOBCapablePacketConn and its batch
// reader (ReadBatch), so GSO, ECN and packet-info handling stay quic-go's:
// only the system calls change. Waiting still happens in the network
// poller, so deadlines and Close behave as on the plain socket.
func PacketConn(c *net.UDPConn) net.PacketConn { return newRawUDP(c) }

// addrCacheMax bounds the remembered peer addresses; past it the cache
// starts over (a server facing that many distinct peers allocates again,
// as it did without the cache).
const addrCacheMax = 4096

// addrCache maps a peer's address to the *net.UDPAddr handed to quic-go
// for every packet from it. quic-go never modifies the addresses it gets.
type addrCache map[netip.AddrPort]*net.UDPAddr

func (m *addrCache) get(ap netip.AddrPort) *net.UDPAddr {
	if a, ok := (*m)[ap]; ok {
		return a
	}
	if len(*m) >= addrCacheMax || *m == nil {
		*m = make(addrCache, 64)
	}
	a := net.UDPAddrFromAddrPort(ap)
	(*m)[ap] = a
	return a
}
