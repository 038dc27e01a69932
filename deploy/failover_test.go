package deploy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/internal/udplb"
	"github.com/pgquic/pgquic/quicclient"
	"github.com/pgquic/pgquic/quicfront"
)

// writeSharedKeys writes what replicas share: one certificate, a ticket
// keys file and a stateless-reset key file.
func writeSharedKeys(t *testing.T) (cert, key, tickets, reset string) {
	t.Helper()
	dir := t.TempDir()
	c, err := quicfront.GenerateSelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	tickets, reset = filepath.Join(dir, "tickets"), filepath.Join(dir, "reset")
	for path, content := range map[string][]byte{
		cert:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}),
		key:     pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		tickets: []byte(strings.Repeat("7", 64) + "\n"),
		reset:   []byte(strings.Repeat("5", 64) + "\n"),
	} {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cert, key, tickets, reset
}

// worker is one client session loop's record.
type worker struct {
	dialer   int
	errors   atomic.Int64
	lastOK   atomic.Int64 // unix nanoseconds when the last successful query started
	firstErr atomic.Int64 // unix nanoseconds of the first error after the kill
}

// TestReplicaFailover: two `pgquic serve` processes sharing a certificate,
// ticket keys and a stateless-reset key behind one UDP address (udplb);
// several quicclient Dialers (default keep-alive and idle timeout) run
// queries in a loop. One replica is killed with SIGKILL mid-load. Every
// client must recover on the other replica, long before the 60 s idle
// timeout: the balancer sends the orphaned connections' packets to the
// survivor, whose stateless reset (same key) ends them at once, and the
// Dialer re-dials. The error count and recovery time are reported.
func TestReplicaFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and two pooler processes")
	}
	cluster := pgtest.New(t, pgtest.Options{})
	cert, key, tickets, reset := writeSharedKeys(t)
	replica := func() *runningServe {
		return startServe(t, "--backend", cluster.SuperURL("postgres"), "--tcp-listen", "", "--quic-listen", "127.0.0.1:0",
			"--metrics-listen", "127.0.0.1:0", "--pool-size", "8", "--min-pool", "2",
			"--tls-cert", cert, "--tls-key", key,
			"--tls-session-ticket-keys-file", tickets, "--quic-stateless-reset-key-file", reset)
	}
	replicas := []*runningServe{replica(), replica()}
	lb, err := udplb.New("127.0.0.1:0", []string{replicas[0].quic, replicas[1].quic}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lb.Close() }) // after the Dialers' cleanup

	const dialers, workersPer = 8, 4
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var workers []*worker
	var ds []*quicclient.Dialer
	addDialer := func() {
		i := len(ds)
		d, pc := dialerThrough(t, lb.Addr().String(), cert, cluster, 2, 0)
		ds = append(ds, d)
		for range workersPer {
			w := &worker{dialer: i}
			workers = append(workers, w)
			wg.Go(func() { runWorker(loadCtx, pc, w) })
		}
	}
	for range dialers {
		addDialer()
	}
	defer func() { stopLoad(); wg.Wait() }()

	// Load runs on both replicas before the kill. The balancer places each
	// client address by its hash, so now and then (about 1 run in 128) all
	// eight Dialers land on one replica: another Dialer joins until both
	// carry flows, up to a bound no fair hash misses.
	everyWorkerServed := func() bool {
		return !slices.ContainsFunc(workers, func(w *worker) bool { return w.lastOK.Load() == 0 })
	}
	waitUntil(t, 60*time.Second, "every worker to complete a query", everyWorkerServed)
	flows := lb.Flows()
	for len(ds) < 4*dialers && (flows[0] == 0 || flows[1] == 0) {
		addDialer()
		waitUntil(t, 60*time.Second, "every worker to complete a query", everyWorkerServed)
		flows = lb.Flows()
	}
	if flows[0] == 0 || flows[1] == 0 {
		t.Fatalf("clients did not spread over both replicas with %d Dialers: flows %v", len(ds), flows)
	}
	time.Sleep(500 * time.Millisecond) // steady load before the kill: the scenario, not a wait for a state
	for _, w := range workers {
		w.errors.Store(0)
	}

	victim := 0
	if err := replicas[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// The kill counts from the victim's exit, not from the signal: on a
	// loaded machine the process can still answer for tens of
	// milliseconds after SIGKILL is sent, and a query it answers then is
	// not a recovery.
	exitErr := <-replicas[victim].done
	replicas[victim].done <- exitErr // for the cleanup's wait
	killed := time.Now()
	// Recovery: every worker completes a query that started after the kill.
	waitUntil(t, 90*time.Second, "every worker to complete a query after the kill", func() bool {
		return !slices.ContainsFunc(workers, func(w *worker) bool { return w.lastOK.Load() <= killed.UnixNano() })
	})
	var worst time.Duration
	var errs, hit int64
	for _, w := range workers {
		errs += w.errors.Load()
		if w.errors.Load() > 0 {
			hit++
			if d := time.Duration(w.lastOK.Load() - killed.UnixNano()); d > worst {
				worst = d
			}
		}
	}
	stopLoad()
	wg.Wait()
	t.Logf("killed replica %d carrying %d of %d client flows; %d of %d sessions saw errors, %d errors in all; "+
		"every session recovered, the last %.2f s after the kill; flows moved by the balancer: %d",
		victim, flows[victim], flows[0]+flows[1], hit, len(workers), errs, worst.Seconds(), lb.Failovers(victim))
	if hit == 0 {
		t.Error("no session saw an error: the killed replica carried no load")
	}
	// The shared reset key is what makes recovery fast: without it the
	// orphaned connections would wait for the 60 s idle timeout.
	if worst > 20*time.Second {
		t.Errorf("recovery took %v: the stateless reset did not reach the clients", worst)
	}
	if got := lb.Flows(); got[victim] != 0 {
		t.Errorf("flows still on the killed replica: %v", got)
	}
}

// dialerThrough returns a Dialer (closed when the test ends) with conns
// connections to the replicas behind addr (the balancer, or a relay in
// front of it) and a pgconn configuration for cluster's superuser that
// dials through it.
func dialerThrough(t *testing.T, addr, cert string, cluster *pgtest.Cluster, conns int, keepAlive time.Duration) (*quicclient.Dialer, *pgconn.Config) {
	t.Helper()
	// The certificate names 127.0.0.1, wherever addr points (a WAN
	// emulator's address, say).
	d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: addr, CAFile: cert, Conns: conns, KeepAlivePeriod: keepAlive,
		TLSConfig: &tls.Config{ServerName: "127.0.0.1"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	pc, err := pgconn.ParseConfig(fmt.Sprintf("postgres://%s:%s@127.0.0.1/postgres?sslmode=disable&connect_timeout=10", cluster.SuperUser, cluster.SuperPassword))
	if err != nil {
		t.Fatal(err)
	}
	pc.DialFunc, pc.LookupFunc = d.DialFunc(), d.LookupFunc()
	return d, pc
}

// runWorker runs SELECT 1 in a loop on one session, reconnecting after any
// error, until ctx ends.
func runWorker(ctx context.Context, pc *pgconn.Config, w *worker) {
	var c *pgconn.PgConn
	defer func() {
		if c != nil {
			_ = c.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if c == nil {
			var err error
			if c, err = pgconn.ConnectConfig(ctx, pc); err != nil {
				if ctx.Err() == nil {
					w.errors.Add(1)
					time.Sleep(10 * time.Millisecond) // back off before the next dial
				}
				c = nil
				continue
			}
		}
		started := time.Now()
		qctx, cancel := context.WithTimeout(ctx, 70*time.Second)
		_, err := c.Exec(qctx, "SELECT 1").ReadAll()
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.errors.Add(1)
			}
			_ = c.Close(context.Background())
			c = nil
			continue
		}
		w.lastOK.Store(started.UnixNano())
	}
}

// waitUntil polls cond until it holds or the timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
