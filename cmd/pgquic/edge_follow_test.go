//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/internal/udplb"
	"github.com/pgquic/pgquic/loadgen/wan"
)

var edgeReady = regexp.MustCompile(`pgquic edge ready.* listen=(\S+)`)

// TestEdgeFollowRouteMoves: `pgquic edge --follow-route` in a network
// namespace of its own, reaching the pooler over a veth pair through a
// UDP relay in a second namespace (the pooler itself stays on loopback).
// During a steady load through the edge its address changes as a network
// change does it: a new address and a more specific route whose source is
// the new address, then the old address removed. The edge notices the new
// source, moves its connection there with a validated migration, logs and
// counts the move; no query fails and the pooler starts no new session.
func TestEdgeFollowRouteMoves(t *testing.T) {
	if err := wan.PacketPermitted(); err != nil {
		t.Skipf("network namespaces: %v", err)
	}
	cluster := pgtest.New(t, pgtest.Options{})
	cfg := testConfig(cluster.SuperURL("postgres"))
	srv, _, _ := startTestServer(t, cfg)

	pid := os.Getpid()
	nsE, nsP := fmt.Sprintf("pgqmv-%d-e", pid), fmt.Sprintf("pgqmv-%d-p", pid)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{nsE, nsP} {
		ip("netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() }) // takes the veth along
		ip("-n", ns, "link", "set", "lo", "up")
	}
	ip("-n", nsE, "link", "add", "vE", "type", "veth", "peer", "name", "vP", "netns", nsP)
	ip("-n", nsE, "addr", "add", "198.18.7.2/24", "dev", "vE")
	ip("-n", nsP, "addr", "add", "198.18.7.1/24", "dev", "vP")
	ip("-n", nsE, "link", "set", "vE", "up")
	ip("-n", nsP, "link", "set", "vP", "up")

	// The relay's front socket lives in the pooler's namespace; its
	// upstream sockets, opened later by other threads, on loopback.
	var relay *udplb.LB
	if err := wan.InNetns(nsP, func() error {
		var err error
		relay, err = udplb.New("198.18.7.1:0", []string{srv.quic.Addr().String()}, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close() })

	logs := &lockedBuffer{}
	cmd := exec.Command("ip", "netns", "exec", nsE, os.Args[0], "edge", "--listen", "127.0.0.1:0",
		"--pooler", relay.Addr().String(), "--pin", srv.quic.Fingerprint(), "--conns", "1",
		"--follow-route", "200ms", "--keep-alive", "1s")
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("edge logs:\n%s", logs.String())
		}
	})
	var listen string
	waitFor(t, func() bool {
		if m := edgeReady.FindStringSubmatch(logs.String()); m != nil {
			listen = m[1]
		}
		return listen != ""
	})

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	host, port, _ := net.SplitHostPort(listen)
	pc, err := pgconn.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s:%s/postgres?sslmode=disable",
		cluster.SuperUser, cluster.SuperPassword, host, port))
	if err != nil {
		t.Fatal(err)
	}
	pc.DialFunc = wan.DialInNetns(nsE, (&net.Dialer{}).DialContext)
	var conns []*pgconn.PgConn
	for range 4 {
		c, err := pgconn.ConnectConfig(ctx, pc)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		conns = append(conns, c)
	}
	// The first check moves the connection from the socket bound to any
	// address to one bound to the route's source, 198.18.7.2.
	moved := func(to string) bool {
		return regexp.MustCompile(`connections moved" .*to=` + regexp.QuoteMeta(to) + ` `).MatchString(logs.String())
	}
	waitFor(t, func() bool { return moved("198.18.7.2") })
	sessionsBefore := scrape(t, srv)[`pgquic_pooler_sessions_total{transport="quic"}`]

	load := quictest.StartSteadyLoad(ctx, conns, 10*time.Millisecond)
	defer load.Stop()
	load.AwaitQueries(t, 100)
	moveAt := time.Now()
	ip("-n", nsE, "addr", "add", "198.18.7.3/32", "dev", "vE")
	ip("-n", nsE, "route", "add", "198.18.7.1/32", "dev", "vE", "src", "198.18.7.3")
	waitFor(t, func() bool { return moved("198.18.7.3") })
	load.AwaitQueries(t, 100)
	ip("-n", nsE, "addr", "del", "198.18.7.2/24", "dev", "vE")
	load.AwaitQueries(t, 200)
	load.Stop()

	queries, errs := load.Queries()
	if len(errs) != 0 {
		t.Errorf("%d of %d queries failed, first: %v", len(errs), queries, errs[0])
	}
	if after := scrape(t, srv)[`pgquic_pooler_sessions_total{transport="quic"}`]; after != sessionsBefore {
		t.Errorf("the pooler started %v sessions during the run, want none", after-sessionsBefore)
	}
	if n := strings.Count(logs.String(), `connections moved" `); n != 2 {
		t.Errorf("%d moves logged, want 2 (to the bound source, then to the new one)", n)
	}
	if strings.Contains(logs.String(), "not every connection moved") {
		t.Error("a move failed")
	}
	median, worst := load.Blip(moveAt)
	t.Logf("move to a new source address: worst latency in the second after it %v (median %v); %d queries, %d failed",
		worst.Round(time.Microsecond), median.Round(time.Microsecond), queries, len(errs))
}
