package quicwire

import (
	"bytes"
	"net"
	"net/netip"
	"strconv"
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
// does, and writes the destination of a send into one reused sockaddr.
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

// peerKey is a sender's address as the kernel reported it: IPv4 addresses
// in the first four bytes (v4 set), IPv6 with their scope (interface index).
type peerKey struct {
	ip    [16]byte
	port  uint16
	scope uint32
	v4    bool
}

// addrCache maps a peer's address to the *net.UDPAddr handed to quic-go
// for every packet from it. quic-go never modifies the addresses it gets.
type addrCache map[peerKey]*net.UDPAddr

func (m *addrCache) get(k peerKey) *net.UDPAddr {
	if a, ok := (*m)[k]; ok {
		return a
	}
	if len(*m) >= addrCacheMax || *m == nil {
		*m = make(addrCache, 64)
	}
	var a *net.UDPAddr
	if k.v4 {
		a = net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.AddrFrom4([4]byte(k.ip[:4])), k.port))
	} else {
		a = &net.UDPAddr{IP: net.IP(bytes.Clone(k.ip[:])), Port: int(k.port), Zone: zoneName(k.scope)}
	}
	(*m)[k] = a
	return a
}

// zoneName returns the name of the interface with index, or the index in
// decimal as the net package writes a zone it cannot name; "" for none.
func zoneName(index uint32) string {
	if index == 0 {
		return ""
	}
	if ifi, err := net.InterfaceByIndex(int(index)); err == nil {
		return ifi.Name
	}
	return strconv.FormatUint(uint64(index), 10)
}

// zoneIndex is zoneName's inverse: the interface index of a zone given by
// name or number, 0 when unknown.
func zoneIndex(zone string) uint32 {
	if zone == "" {
		return 0
	}
	if ifi, err := net.InterfaceByName(zone); err == nil {
		return uint32(ifi.Index)
	}
	n, _ := strconv.ParseUint(zone, 10, 32)
	return uint32(n)
}
