package front

import (
	"net"
	"net/netip"
)

// IPv6SourceBits is the prefix length an IPv6 client is keyed on as a
// source: one /64 is what a single host or LAN is given (RFC 6177; SLAAC
// hosts pick any address in it), so counting each address apart would let
// one client be 2^64 sources.
const IPv6SourceBits = 64

// Source names the source a client counts against for the per-source
// limits (the pooler's MaxStartingPerSource, the QUIC front's connections
// per source), so both key a client the same way: an IPv4 address whole
// ("192.0.2.1"), an IPv4-mapped IPv6 address as its IPv4 address, any other
// IPv6 address as its /64 prefix ("2001:db8::/64", zone dropped); a peer
// with no IP address by its network and address ("unix:/run/x.sock"); a
// nil address (or an IP-less TCP or UDP one) as "unknown".
func Source(a net.Addr) string {
	var ip net.IP
	switch v := a.(type) {
	case nil:
		return "unknown"
	case *net.TCPAddr:
		if v == nil {
			return "unknown"
		}
		ip = v.IP
	case *net.UDPAddr:
		if v == nil {
			return "unknown"
		}
		ip = v.IP
	case *net.IPAddr:
		if v == nil {
			return "unknown"
		}
		ip = v.IP
	default:
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			return sourceOfAddr(ap.Addr())
		}
		return a.Network() + ":" + a.String()
	}
	if addr, ok := netip.AddrFromSlice(ip); ok {
		return sourceOfAddr(addr)
	}
	return "unknown"
}

// sourceOfAddr keys one IP address (see Source).
func sourceOfAddr(addr netip.Addr) string {
	addr = addr.Unmap().WithZone("")
	if addr.Is4() {
		return addr.String()
	}
	p, err := addr.Prefix(IPv6SourceBits)
	if err != nil {
		return addr.String() // not reached: every IPv6 address has a /64
	}
	return p.String()
}
