//go:build linux

package loadgen

import (
	"os"
	"testing"
	"time"

	"github.com/pgquic/pgquic/loadgen/wan"
)

// TestPacketPathStats runs both transports through a packet-mode path with
// 2% loss each way: the sessions' sockets live in the client namespace (the
// host has no route to the path's address), every query is accounted for,
// TCP reports retransmissions and QUIC lost packets, and both see the
// path's round trip.
func TestPacketPathStats(t *testing.T) {
	if err := wan.PacketPermitted(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	st := newStack(t)
	const rtt = 40 * time.Millisecond
	for _, tc := range []struct {
		name string
		cfg  ClientConfig
	}{
		{"tcp", ClientConfig{Transport: TCP, Addr: st.tcpAddr, Conns: 10, PinSHA256: st.pin}},
		{"quic", ClientConfig{Transport: QUIC, Addr: st.quicAddr, Conns: 2, Streams: 5, PinSHA256: st.pin}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := wan.StartPacket(wan.Config{Packet: true, Upstream: tc.cfg.Addr, RTT: rtt, Loss: 0.02}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			tc.cfg.Password = "postgres"
			tc.cfg.Relay, tc.cfg.Netns = p.Addr(), p.ClientNetns()
			c := connect(t, tc.cfg)
			r, _ := runShort(t, c, Constant(200, 3*time.Second))
			if r.Scheduled != r.Completed+r.Errors+r.Unfinished || r.Completed < r.Scheduled*9/10 {
				t.Fatalf("scheduled %d completed %d errors %d unfinished %d (%v)", r.Scheduled, r.Completed, r.Errors, r.Unfinished, r.FirstError)
			}
			ps := c.PathStats()
			if ps.SentPackets == 0 || ps.SRTT < rtt*9/10 || ps.SRTT > 3*rtt {
				t.Errorf("path stats %+v: want packets and an srtt near %v", ps, rtt)
			}
			switch tc.cfg.Transport {
			case TCP:
				if ps.Retransmits == 0 {
					t.Errorf("no TCP retransmissions across 2%% loss: %+v", ps)
				}
			case QUIC:
				if ps.LostPackets == 0 {
					t.Errorf("QUIC declared no packet lost across 2%% loss: %+v", ps)
				}
			}
			if es := p.Stats(); es.Up.Lost == 0 || es.Down.Lost == 0 {
				t.Errorf("emulator drops %+v", es)
			}
		})
	}
}
