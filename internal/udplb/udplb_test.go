package udplb

import (
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/quiclb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo is a UDP server that answers every datagram with its tag.
func echo(t *testing.T, tag byte) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDP([]byte{tag}, from)
		}
	}()
	return c
}

// ask sends a datagram from c and returns the tag of the backend that answered.
func ask(t *testing.T, c *net.UDPConn) (byte, error) {
	t.Helper()
	if _, err := c.Write([]byte("ping")); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	b := make([]byte, 10)
	n, err := c.Read(b)
	if err != nil || n != 1 {
		return 0, err
	}
	return b[0], nil
}

// TestFailover: clients spread over both backends and stay on theirs;
// when one backend's port closes, its clients move to the other.
func TestFailover(t *testing.T) {
	a, b := echo(t, 'a'), echo(t, 'b')
	defer b.Close()
	lb, err := New("127.0.0.1:0", []string{a.LocalAddr().String(), b.LocalAddr().String()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	var clients []*net.UDPConn
	seen := map[byte]int{}
	for range 16 {
		c, err := net.DialUDP("udp", nil, lb.Addr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
		tag, err := ask(t, c)
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := ask(t, c); again != tag {
			t.Fatalf("a client moved from %c to %c while both are up", tag, again)
		}
		seen[tag]++
	}
	if seen['a'] == 0 || seen['b'] == 0 {
		t.Fatalf("clients did not spread: %v", seen)
	}
	a.Close()
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range clients {
		for {
			// The first packets to the closed port are lost (that is how
			// the balancer learns); clients retransmit, as QUIC does.
			if tag, err := ask(t, c); err == nil && tag == 'b' {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a client did not move to the live backend; flows %v", lb.Flows())
			}
		}
	}
	if got := lb.Failovers(0); got != int64(seen['a']) {
		t.Errorf("failovers from a: %d, want %d", got, seen['a'])
	}
	if f := lb.Flows(); f[0] != 0 || f[1] != len(clients) {
		t.Errorf("flows %v after failover", f)
	}
}

// askWith sends pkt from c and returns the tag of the backend that answered.
func askWith(t *testing.T, c *net.UDPConn, pkt []byte) byte {
	t.Helper()
	for range 20 { // the first datagrams to a closed port are lost
		if _, err := c.Write(pkt); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		b := make([]byte, 10)
		if n, err := c.Read(b); err == nil && n == 1 {
			return b[0]
		}
	}
	t.Fatal("no answer")
	return 0
}

// TestCIDRouting: a short-header packet whose connection ID carries server
// ID 2 reaches backend 2 from every client address; Initial packets go by
// a hash of their DCID (the same DCID, the same backend, from any
// address); when backend 2 is down its IDs go to a backend up.
func TestCIDRouting(t *testing.T) {
	a, b := echo(t, 'a'), echo(t, 'b')
	defer a.Close()
	lb, err := NewCIDRouting("127.0.0.1:0", []string{a.LocalAddr().String(), b.LocalAddr().String()}, []int{1, 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	cid, err := quiclb.NewCID(2)
	if err != nil {
		t.Fatal(err)
	}
	short := append([]byte{0x40}, cid...)
	initial := append([]byte{0xc0, 0, 0, 0, 1, 8, 9, 8, 7, 6, 5, 4, 3, 2}, make([]byte, 20)...)
	var initialTag byte
	for i := range 8 {
		c, err := net.DialUDP("udp", nil, lb.Addr().(*net.UDPAddr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if tag := askWith(t, c, short); tag != 'b' {
			t.Fatalf("client %d: server ID 2 reached %c", i, tag)
		}
		tag := askWith(t, c, initial)
		if i > 0 && tag != initialTag {
			t.Fatalf("client %d: one Initial DCID reached %c and %c", i, initialTag, tag)
		}
		initialTag = tag
	}
	if lb.CIDRouted() < 8 {
		t.Errorf("routed by server ID: %d datagrams, want 8", lb.CIDRouted())
	}
	b.Close()
	c, err := net.DialUDP("udp", nil, lb.Addr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tag := askWith(t, c, short); tag != 'a' {
		t.Fatalf("with backend 2 down its server ID reached %c", tag)
	}
	if _, err := NewCIDRouting("127.0.0.1:0", []string{"127.0.0.1:1"}, []int{1, 2}, nil); err == nil {
		t.Error("two server IDs for one backend accepted")
	}
}

// TestRebind: after Rebind a backend sees the client from a new source
// port, and the client still gets its answers.
func TestRebind(t *testing.T) {
	srv, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	from := make(chan string, 100)
	go func() {
		buf := make([]byte, 1500)
		for {
			_, addr, err := srv.ReadFromUDP(buf)
			if err != nil {
				return
			}
			from <- addr.String()
			_, _ = srv.WriteToUDP([]byte{'s'}, addr)
		}
	}()
	lb, err := New("127.0.0.1:0", []string{srv.LocalAddr().String()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	c, err := net.DialUDP("udp", nil, lb.Addr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	askWith(t, c, []byte("ping"))
	var first string
	for len(from) > 0 {
		first = <-from
	}
	if n, err := lb.Rebind(); n != 1 || err != nil {
		t.Fatalf("rebind: %d, %v", n, err)
	}
	askWith(t, c, []byte("ping"))
	// The backend recorded the sender before it answered: the last one
	// recorded is the one after Rebind.
	var again string
	for len(from) > 0 {
		again = <-from
	}
	if again == first {
		t.Errorf("the backend still sees %s after Rebind", again)
	}
}
