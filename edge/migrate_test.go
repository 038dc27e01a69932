package edge

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/internal/quictest/quicserver"
	"github.com/pgquic/pgquic/internal/udplb"
	"github.com/pgquic/pgquic/quicclient"
	"github.com/pgquic/pgquic/quicfront"
)

// TestEdgeSurvivesAddressChanges: local clients of an edge whose QUIC
// connection goes through a NAT keep their sessions while the NAT rebinds
// (the edge unaware) and while the edge's Dialer moves to another local
// address: no query fails and no new session reaches the server.
func TestEdgeSurvivesAddressChanges(t *testing.T) {
	h := quictest.NewScriptedPG()
	s, reg := quicserver.Start(t, quicfront.ServerConfig{}, h)
	nat, err := udplb.New("127.0.0.1:0", []string{s.Addr().String()}, quictest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	d := newTestDialer(t, quicclient.DialerConfig{Addr: nat.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 1})
	e, _ := startEdge(t, Config{Dialer: d})
	// Closed last: the Dialer's CONNECTION_CLOSE must cross the NAT.
	t.Cleanup(func() {
		_ = d.Close()
		quictest.Eventually(t, 20*time.Second, "the server's connection closed", func() bool {
			return quictest.GaugeValue(t, reg, "pgquic_quic_connections") == 0
		})
		_ = nat.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conns []*pgconn.PgConn
	for range 4 {
		c, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://u@%s/db?sslmode=disable", e.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		conns = append(conns, c)
	}
	started := h.Sessions.Load()
	load := quictest.StartSteadyLoad(ctx, conns, 10*time.Millisecond)
	defer load.Stop()
	load.AwaitQueries(t, 20)
	if n, err := nat.Rebind(); err != nil || n != 1 {
		t.Fatalf("rebind: %d flows, %v", n, err)
	}
	load.AwaitQueries(t, 40)
	if err := d.Migrate(ctx, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}); err != nil {
		t.Fatal(err)
	}
	load.AwaitQueries(t, 40)
	load.Stop()
	if queries, errs := load.Queries(); len(errs) != 0 {
		t.Errorf("%d of %d queries failed, first: %v", len(errs), queries, errs[0])
	}
	if got := h.Sessions.Load(); got != started {
		t.Errorf("sessions started: %d, want %d", got, started)
	}
	if st := d.Stats(); st.Conns != 1 {
		t.Errorf("the edge has %d QUIC connections, want its 1", st.Conns)
	}
}
