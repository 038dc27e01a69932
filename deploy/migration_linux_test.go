//go:build linux

package deploy

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/pgquic/pgquic/loadgen/wan"
)

// TestReplicaMigrationPacket is TestReplicaMigration across the
// packet-level emulator at 150 ms: the Dialers live in the emulator's
// client network namespace, their datagrams cross its links as IP
// packets, and the server namespace's relay carries each client address's
// flow to the balancer. The rebinding is the balancer's, as in the other
// variants; the move is a new address (AddClientAddress, 198.18.0.3) and
// port inside the client namespace, which reaches the balancer, and so the
// replica, as a new flow.
func TestReplicaMigrationPacket(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, two pooler processes and the packet-level emulator")
	}
	if err := wan.PacketPermitted(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI must run packet mode: %v", err)
		}
		t.Skip(err)
	}
	replicaMigration(t, func(t *testing.T, balancer string) migrationPath {
		p, err := wan.StartPacket(wan.Config{Packet: true, Upstream: balancer, RTT: 150 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := p.Close(); err != nil {
				t.Error(err)
			}
		})
		return migrationPath{front: p.Addr(), rtt: 150 * time.Millisecond,
			in: func(fn func() error) error { return wan.InNetns(p.ClientNetns(), fn) },
			move: func() (net.IP, error) {
				a, err := p.AddClientAddress()
				return net.IP(a.AsSlice()), err
			},
			flows: func() uint64 { return p.Stats().UDPFlows }}
	})
}
