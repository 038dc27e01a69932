package quicwire_test

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/pgquic/pgquic/internal/quicwire"
)

// batchReader is quic-go's batch reader interface, which PacketConn's
// result implements on Linux.
type batchReader interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
}

// oobWriter is the write half of quic-go's OOBCapablePacketConn.
type oobWriter interface {
	WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (n, oobn int, err error)
}

// TestPacketConnRoundTrip sends datagrams through PacketConn's WriteMsgUDP
// and reads them in one batch with its ReadBatch, over IPv4 and IPv6
// loopback: contents, lengths and the sender's address must arrive, the
// same sender must come back as the same address value (no allocation per
// packet), and the read must honour deadlines and Close.
func TestPacketConnRoundTrip(t *testing.T) {
	for _, network := range []string{"udp4", "udp6"} {
		t.Run(network, func(t *testing.T) {
			host := "127.0.0.1"
			if network == "udp6" {
				host = "::1"
			}
			recv, err := net.ListenUDP(network, &net.UDPAddr{IP: net.ParseIP(host)})
			if err != nil {
				t.Skipf("no %s loopback: %v", network, err)
			}
			send, err := net.ListenUDP(network, &net.UDPAddr{IP: net.ParseIP(host)})
			if err != nil {
				t.Fatal(err)
			}
			defer send.Close()
			rpc, spc := quicwire.PacketConn(recv), quicwire.PacketConn(send)
			br, ok := rpc.(batchReader)
			if !ok {
				t.Skip("raw UDP system calls are not used on this platform")
			}
			w := spc.(oobWriter)
			to := recv.LocalAddr().(*net.UDPAddr)
			payloads := []string{"a", "bb", "a longer datagram"}
			for _, p := range payloads {
				if n, _, err := w.WriteMsgUDP([]byte(p), nil, to); err != nil || n != len(p) {
					t.Fatalf("WriteMsgUDP(%q) = %d, %v", p, n, err)
				}
			}
			ms := make([]ipv4.Message, 8)
			for i := range ms {
				ms[i].Buffers = [][]byte{make([]byte, 1500)}
				ms[i].OOB = make([]byte, 128)
			}
			var got []string
			var addrs []net.Addr
			_ = recv.SetReadDeadline(time.Now().Add(5 * time.Second))
			for len(got) < len(payloads) {
				n, err := br.ReadBatch(ms, 0)
				if err != nil {
					t.Fatalf("ReadBatch: %v", err)
				}
				for _, m := range ms[:n] {
					got = append(got, string(m.Buffers[0][:m.N]))
					addrs = append(addrs, m.Addr)
				}
			}
			for i, p := range payloads {
				if got[i] != p {
					t.Fatalf("datagram %d = %q, want %q", i, got[i], p)
				}
				if addrs[i].String() != send.LocalAddr().String() {
					t.Fatalf("datagram %d from %v, want %v", i, addrs[i], send.LocalAddr())
				}
				if addrs[i] != addrs[0] {
					t.Fatalf("datagram %d's sender is a new address value", i)
				}
			}
			_ = recv.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, err := br.ReadBatch(ms, 0); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("ReadBatch past the deadline: %v, want os.ErrDeadlineExceeded", err)
			}
			_ = recv.SetReadDeadline(time.Time{})
			done := make(chan error, 1)
			go func() {
				_, err := br.ReadBatch(ms, 0)
				done <- err
			}()
			_ = recv.Close()
			if err := <-done; !errors.Is(err, net.ErrClosed) {
				t.Fatalf("ReadBatch after Close: %v, want net.ErrClosed", err)
			}
			if _, _, err := w.WriteMsgUDP([]byte("x"), nil, &net.UDPAddr{IP: net.ParseIP("2001:db8::1"), Port: 9}); network == "udp4" && err == nil {
				t.Fatal("WriteMsgUDP to an IPv6 address on an IPv4 socket succeeded")
			}
		})
	}
}
