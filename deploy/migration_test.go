package deploy

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/internal/udplb"
	"github.com/pgquic/pgquic/loadgen/wan"
	"github.com/pgquic/pgquic/quicclient"
)

// migrationKeepAlive is the Dialers' KeepAlivePeriod. After a NAT
// rebinding the replica learns the client's new address only from the
// client's next packet; a connection whose sessions all wait for answers
// the replica sent to the old address (lost) has nothing unacknowledged,
// so the client sends nothing until its keep-alive (quic-go: the last
// packet received plus max(KeepAlivePeriod, 1.5 PTO); 15 s by default).
// A short one bounds that stall; see deploy/README.md.
const migrationKeepAlive = 250 * time.Millisecond

// TestReplicaMigration: two `pgquic serve` processes with server IDs 1
// and 2 (--quic-server-id) behind the connection-ID-routing balancer;
// several Dialers run a steady query load against PostgreSQL. The client
// addresses change twice: the balancer rebinds every flow (a NAT
// rebinding: the replicas see new source ports) and then every Dialer
// moves to 127.0.0.2 (Migrate). No query fails, no session is opened
// again (each replica's session count is unchanged), and the latency
// around each change is logged and stays under 2 s. The replicas are
// started with QLOGDIR passed on, so setting it traces every connection
// (both ends).
func TestReplicaMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and two pooler processes")
	}
	replicaMigration(t, 0)
}

// TestReplicaMigrationWAN is TestReplicaMigration with the clients 150 ms
// away: the Dialers reach the balancer through the WAN emulator's relay
// mode (a user-space UDP relay delaying each datagram by half the round
// trip each way, one flow per client address, so a Dialer's move to
// 127.0.0.2 reaches the balancer, and so the replica, from a new address).
func TestReplicaMigrationWAN(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and two pooler processes")
	}
	replicaMigration(t, 150*time.Millisecond)
}

// replicaMigration runs the replica migration test with the clients rtt
// away from the balancer (0: on loopback, directly).
func replicaMigration(t *testing.T, rtt time.Duration) {
	cluster := pgtest.New(t, pgtest.Options{})
	cert, key, tickets, reset := writeSharedKeys(t)
	replica := func(id int) *runningServe {
		return startServe(t, "--backend", cluster.SuperURL("postgres"), "--tcp-listen", "", "--quic-listen", "127.0.0.1:0",
			"--metrics-listen", "127.0.0.1:0", "--pool-size", "8", "--min-pool", "2",
			"--tls-cert", cert, "--tls-key", key, "--quic-server-id", strconv.Itoa(id),
			"--tls-session-ticket-keys-file", tickets, "--quic-stateless-reset-key-file", reset)
	}
	replicas := []*runningServe{replica(1), replica(2)}
	lb, err := udplb.NewCIDRouting("127.0.0.1:0", []string{replicas[0].quic, replicas[1].quic}, []int{1, 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lb.Close() }) // after the Dialers' cleanup
	front := lb.Addr().String()
	if rtt > 0 {
		relay, err := wan.New(wan.Config{Listen: "127.0.0.1:0", Upstream: front, RTT: rtt}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := relay.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = relay.Close() })
		front = relay.Addr()
	}

	// At least 6 Dialers of 3 sessions, more until both replicas carry
	// some: each connection's first Initial goes by a hash of its random
	// connection ID.
	const minDialers, maxDialers, sessionsPer = 6, 30, 3
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sessions := func() []float64 {
		var n []float64
		for _, r := range replicas {
			n = append(n, scrapeMetric(t, r.metrics, `pgquic_pooler_sessions_total{transport="quic"}`))
		}
		return n
	}
	var ds []*quicclient.Dialer
	var conns []*pgconn.PgConn
	for len(ds) < minDialers || (len(ds) < maxDialers && slices.Contains(sessions(), 0)) {
		d, pc := dialerThrough(t, front, cert, cluster, 1, migrationKeepAlive)
		ds = append(ds, d)
		for range sessionsPer {
			c, err := pgconn.ConnectConfig(ctx, pc)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			conns = append(conns, c)
		}
	}
	before := sessions()
	if slices.Contains(before, 0) {
		t.Fatalf("sessions did not spread over both replicas: %v", before)
	}

	load := quictest.StartSteadyLoad(ctx, conns, 20*time.Millisecond)
	defer load.Stop()
	perQuery := 20*time.Millisecond + rtt // a session's pace
	queriesIn := func(d time.Duration) int { return int(d/perQuery) * len(conns) }
	load.AwaitQueries(t, queriesIn(time.Second))
	rebindAt := time.Now()
	if n, err := lb.Rebind(); err != nil || n == 0 {
		t.Fatalf("rebind: %d flows, %v", n, err)
	}
	load.AwaitQueries(t, queriesIn(time.Second/3))
	awaitPast(rebindAt.Add(2 * time.Second)) // the blip's queries all finished
	moveAt := time.Now()
	for _, d := range ds {
		if err := d.Migrate(ctx, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	load.AwaitQueries(t, queriesIn(time.Second))
	awaitPast(moveAt.Add(time.Second + rtt))
	load.Stop()

	queries, errs := load.Queries()
	if len(errs) != 0 {
		t.Errorf("%d of %d queries failed, first: %v", len(errs), queries, errs[0])
	}
	if after := sessions(); after[0] != before[0] || after[1] != before[1] {
		t.Errorf("sessions started per replica: %v before, %v after (none should be re-established)", before, after)
	}
	for _, d := range ds {
		if st := d.Stats(); st.Conns != 1 {
			t.Errorf("a Dialer has %d connections, want its 1", st.Conns)
		}
	}
	if lb.CIDRouted() == 0 {
		t.Error("nothing was routed by connection ID")
	}
	load.LogChanges(t, rebindAt, moveAt)
	// Bounds a noisy machine keeps: the stall after the rebinding is the
	// keep-alive plus a path validation, the move a path validation.
	for _, at := range []time.Time{rebindAt, moveAt} {
		if _, worst := load.Blip(at); worst > 2*time.Second {
			t.Errorf("a query around the address change at %v took %v (bound 2 s)", at.Format("15:04:05.000"), worst)
		}
	}
}

// awaitPast returns once t has passed.
func awaitPast(t time.Time) { time.Sleep(time.Until(t)) }

// scrapeMetric reads one series (name and labels as exposed) from a
// /metrics endpoint; 0 when it is not exposed (yet).
func scrapeMetric(t *testing.T, addr, name string) float64 {
	t.Helper()
	code, body, err := httpGet("http://" + addr + "/metrics")
	if err != nil || code != 200 {
		t.Fatalf("metrics of %s: %d %v", addr, code, err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}
