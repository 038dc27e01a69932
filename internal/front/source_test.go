package front

import (
	"net"
	"testing"
)

// TestSource: IPv4 addresses count whole, IPv4-mapped ones as IPv4, IPv6
// ones by their /64, whatever the address type; other peers count by
// network and address, and a missing address is "unknown".
func TestSource(t *testing.T) {
	var nilTCP *net.TCPAddr
	var nilUDP *net.UDPAddr
	pipe, other := net.Pipe()
	defer pipe.Close()
	defer other.Close()
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{nil, "unknown"},
		{nilTCP, "unknown"},
		{nilUDP, "unknown"},
		{&net.TCPAddr{}, "unknown"},
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 5432}, "192.0.2.1"},
		{&net.UDPAddr{IP: net.ParseIP("192.0.2.2").To4(), Port: 1}, "192.0.2.2"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 1}, "192.0.2.1"},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8::1"), Port: 443}, "2001:db8::/64"},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8::ffff:ffff:ffff:ffff"), Port: 443}, "2001:db8::/64"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:0:1::1"), Port: 443}, "2001:db8:0:1::/64"},
		{&net.UDPAddr{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "eth0"}, "fe80::/64"},
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 1}, "::/64"},
		{&net.IPAddr{IP: net.ParseIP("192.0.2.7")}, "192.0.2.7"},
		{&net.IPAddr{IP: net.ParseIP("2001:db8:aa:bb:1:2:3:4")}, "2001:db8:aa:bb::/64"},
		{&net.UnixAddr{Name: "/run/pg.sock", Net: "unix"}, "unix:/run/pg.sock"},
		{pipe.RemoteAddr(), "pipe:pipe"},
		{otherAddr("[2001:db8::9]:5"), "2001:db8::/64"},
		{otherAddr("198.51.100.3:5"), "198.51.100.3"},
	} {
		if got := Source(tc.addr); got != tc.want {
			t.Errorf("Source(%#v) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

// otherAddr is an address type Source does not know, given as text.
type otherAddr string

func (a otherAddr) Network() string { return "other" }
func (a otherAddr) String() string  { return string(a) }
