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
	replicaMigration(t, func(t *testing.T, balancer string) migrationPath {
		return migrationPath{front: balancer, move: func() (net.IP, error) { return net.IPv4(127, 0, 0, 2), nil }}
	})
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
	replicaMigration(t, func(t *testing.T, balancer string) migrationPath {
		relay, err := wan.New(wan.Config{Listen: "127.0.0.1:0", Upstream: balancer, RTT: 150 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := relay.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = relay.Close() })
		return migrationPath{front: relay.Addr(), rtt: 150 * time.Millisecond,
			move: func() (net.IP, error) { return net.IPv4(127, 0, 0, 2), nil }}
	})
}

// migrationPath is how the Dialers of the replica migration test reach
// the balancer.
type migrationPath struct {
	front string        // the address the Dialers dial
	rtt   time.Duration // the path's round trip
	// in runs fn where the clients live (nil: here), so a Dialer's
	// sockets, which it binds at its first dial and at a move, are there.
	in func(fn func() error) error
	// move returns the local address the Dialers move to.
	move func() (net.IP, error)
	// flows, when set, counts the client flows the path has carried, so
	// the test can check that each move arrived as a new one.
	flows func() uint64
}

// run runs fn where the path's clients live.
func (p migrationPath) run(fn func() error) error {
	if p.in == nil {
		return fn()
	}
	return p.in(fn)
}

// replicaMigration runs the replica migration test with the Dialers
// reaching the balancer by the path newPath returns for its address.
func replicaMigration(t *testing.T, newPath func(t *testing.T, balancer string) migrationPath) {
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
	path := newPath(t, lb.Addr().String())
	rtt := path.rtt

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
		d, pc := dialerThrough(t, path.front, cert, cluster, 1, migrationKeepAlive)
		ds = append(ds, d)
		for i := range sessionsPer {
			var c *pgconn.PgConn
			connect := func() (err error) { c, err = pgconn.ConnectConfig(ctx, pc); return err }
			if i == 0 {
				err = path.run(connect) // the Dialer binds its socket
			} else {
				err = connect()
			}
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
	to, err := path.move()
	if err != nil {
		t.Fatal(err)
	}
	var flowsBefore uint64
	if path.flows != nil {
		flowsBefore = path.flows()
	}
	moveAt := time.Now()
	for _, d := range ds {
		if err := path.run(func() error { return d.Migrate(ctx, &net.UDPAddr{IP: to}) }); err != nil {
			t.Fatalf("migrate to %s: %v", to, err)
		}
	}
	load.AwaitQueries(t, queriesIn(time.Second))
	awaitPast(moveAt.Add(time.Second + rtt))
	load.Stop()

	if path.flows != nil {
		if n := path.flows() - flowsBefore; n < uint64(len(ds)) {
			t.Errorf("the path carried %d new client flows after %d Dialers moved, want one each", n, len(ds))
		}
	}
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
