package quicclient

import (
	"context"
	"crypto/tls"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/internal/quictest/quicserver"
	"github.com/pgquic/pgquic/internal/udplb"
	"github.com/pgquic/pgquic/quicfront"
)

// loopback2 is a second local address (Linux routes 127.0.0.0/8 to lo),
// the new network a Migrate moves to.
var loopback2 = &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}

// peerAddrs returns the current remote address of the sessions the
// handlers served after the first skip[i] of handler i, as the pooler
// would see it (quicfront's Peer.Addr follows the connection).
func peerAddrs(skip []int, hs ...*quictest.ScriptedPG) []string {
	var out []string
	for i, h := range hs {
		for _, p := range h.Peers()[skip[i]:] {
			out = append(out, p.Addr.String())
		}
	}
	return out
}

// closeThrough closes the Dialers when the test ends, waits until the
// servers behind lb saw their connections close, and closes lb: closing
// lb at once could drop the one CONNECTION_CLOSE each connection sends,
// and the servers would wait for the idle timeout.
func closeThrough(t *testing.T, lb *udplb.LB, regs []*prometheus.Registry, ds ...*Dialer) {
	t.Cleanup(func() {
		for _, d := range ds {
			_ = d.Close()
		}
		quictest.Eventually(t, 20*time.Second, "the servers' connections closed", func() bool {
			for _, r := range regs {
				if quictest.GaugeValue(t, r, "pgquic_quic_connections") != 0 {
					return false
				}
			}
			return true
		})
		_ = lb.Close()
	})
}

// tlsWith is a server TLS configuration with cert.
func tlsWith(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}}
}

// migrationRun opens sessions through d, runs a steady load, rebinds the
// balancer's flows (NAT rebinding) and then moves d to loopback2
// (Migrate), and checks that no query failed, no QUIC connection was
// re-dialed and no session was started again, that the servers saw each
// session's address change twice, and logs the latency blips.
func migrationRun(t *testing.T, d *Dialer, lb *udplb.LB, sessions int, hs ...*quictest.ScriptedPG) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	skip := make([]int, len(hs))
	for i, h := range hs {
		skip[i] = len(h.Peers())
	}
	var conns []*pgconn.PgConn
	for range sessions {
		conns = append(conns, quictest.Connect(t, ctx, d))
	}
	d.mu.Lock()
	var before []*clientConn
	for _, cc := range d.slots {
		if cc != nil {
			before = append(before, cc)
		}
	}
	d.mu.Unlock()
	started := func() (n int64) {
		for _, h := range hs {
			n += h.Sessions.Load()
		}
		return n
	}
	sessionsBefore := started()
	addrs0 := peerAddrs(skip, hs...)

	load := quictest.StartSteadyLoad(ctx, conns, 10*time.Millisecond)
	defer load.Stop()
	load.AwaitQueries(t, 20)

	rebindAt := time.Now()
	if n, err := lb.Rebind(); err != nil || n == 0 {
		t.Fatalf("rebind: %d flows, %v", n, err)
	}
	quictest.Eventually(t, 20*time.Second, "the servers see the rebound address", func() bool {
		return !slices.Equal(peerAddrs(skip, hs...), addrs0)
	})
	load.AwaitQueries(t, 50)
	addrs1 := peerAddrs(skip, hs...)

	moveAt := time.Now()
	if err := d.Migrate(ctx, loopback2); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	quictest.Eventually(t, 20*time.Second, "the servers see the new path", func() bool {
		a := peerAddrs(skip, hs...)
		for i := range a {
			if a[i] == addrs1[i] || a[i] == addrs0[i] {
				return false
			}
		}
		return true
	})
	load.AwaitQueries(t, 50)
	load.Stop()

	queries, errs := load.Queries()
	if len(errs) != 0 {
		t.Errorf("%d of %d queries failed, first: %v", len(errs), queries, errs[0])
	}
	if got := started(); got != sessionsBefore {
		t.Errorf("sessions started: %d, want %d (none re-established)", got, sessionsBefore)
	}
	d.mu.Lock()
	for _, cc := range before {
		if d.slots[cc.slot] != cc || cc.conn.Context().Err() != nil {
			t.Errorf("QUIC connection of slot %d was lost or re-dialed", cc.slot)
		}
		if !strings.HasPrefix(cc.conn.LocalAddr().String(), "127.0.0.2:") {
			t.Errorf("connection of slot %d is still on %s", cc.slot, cc.conn.LocalAddr())
		}
	}
	d.mu.Unlock()
	load.LogChanges(t, rebindAt, moveAt)
}

// TestMigrationSurvivesRebindingAndMove: one pooler behind a balancer that
// stands for a NAT. The NAT rebinds (new source port, the client unaware),
// then the client moves to another local address with Migrate (probed and
// switched): no query fails, the connection and sessions are the same.
func TestMigrationSurvivesRebindingAndMove(t *testing.T) {
	h := quictest.NewScriptedPG()
	s, reg := quicserver.Start(t, quicfront.ServerConfig{}, h)
	lb, err := udplb.New("127.0.0.1:0", []string{s.Addr().String()}, quictest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	d := newTestDialer(t, DialerConfig{Addr: lb.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 2})
	closeThrough(t, lb, []*prometheus.Registry{reg}, d)
	migrationRun(t, d, lb, 8, h)
}

// TestMigrationThroughCIDRouting: two replicas with server IDs 1 and 2
// behind the connection-ID-routing balancer. After the rebinding and the
// move each connection still reaches its replica (a 4-tuple hash would
// send the new path to either), routed by the ID in its connection IDs.
func TestMigrationThroughCIDRouting(t *testing.T) {
	cert, err := quicfront.GenerateSelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	h1, h2 := quictest.NewScriptedPG(), quictest.NewScriptedPG()
	tc := quicfront.ServerConfig{}
	tc.ServerID = 1
	tc.TLSConfig = tlsWith(cert)
	s1, reg1 := quicserver.Start(t, tc, h1)
	tc.ServerID = 2
	tc.TLSConfig = tlsWith(cert)
	s2, reg2 := quicserver.Start(t, tc, h2)
	lb, err := udplb.NewCIDRouting("127.0.0.1:0", []string{s1.Addr().String(), s2.Addr().String()}, []int{1, 2}, quictest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	// Dialers (each its own client address) until connections landed on
	// both replicas: the first Initial of each goes by a hash of its
	// random connection ID. ds[0] is the one that moves.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	newDialer := func() *Dialer {
		return newTestDialer(t, DialerConfig{Addr: lb.Addr().String(), PinSHA256: Fingerprint(cert.Certificate[0]), Conns: 1})
	}
	ds := []*Dialer{newDialer()}
	for len(ds) < 40 && (h1.Sessions.Load() == 0 || h2.Sessions.Load() == 0) {
		d := newDialer()
		ds = append(ds, d)
		c := quictest.Connect(t, ctx, d)
		if _, err := quictest.QueryInt(ctx, c, 1); err != nil {
			t.Fatal(err)
		}
	}
	closeThrough(t, lb, []*prometheus.Registry{reg1, reg2}, ds...)
	if h1.Sessions.Load() == 0 || h2.Sessions.Load() == 0 {
		t.Fatalf("sessions did not spread over both replicas: %d and %d", h1.Sessions.Load(), h2.Sessions.Load())
	}
	routed := lb.CIDRouted()
	if routed == 0 {
		t.Fatal("no datagram was routed by its connection ID")
	}
	migrationRun(t, ds[0], lb, 4, h1, h2)
	if lb.CIDRouted() <= routed {
		t.Error("the migrated connection was not routed by its connection ID")
	}
}
