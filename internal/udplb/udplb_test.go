package udplb

import (
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
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
