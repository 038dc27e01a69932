package pooler_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/pooler"
)

// startingHarness serves pipe sessions from chosen source addresses on a
// harness pooler, so a test can play many client hosts.
type startingHarness struct {
	*harness
	ctx     context.Context
	wg      sync.WaitGroup
	clients []net.Conn
}

// serve starts a session from src on an in-memory pipe and returns the
// client end, which the test closes to end the session.
func (sh *startingHarness) serve(t *testing.T, src net.Addr) net.Conn {
	t.Helper()
	client, server := net.Pipe()
	sh.wg.Add(1)
	go func() {
		defer sh.wg.Done()
		_ = sh.pooler.Serve(sh.ctx, server, pooler.Peer{Addr: src, Transport: "pipe"})
	}()
	_ = client.SetDeadline(time.Now().Add(time.Minute))
	t.Cleanup(func() { _ = client.Close() })
	sh.clients = append(sh.clients, client)
	return client
}

// closeAll ends every session started so far.
func (sh *startingHarness) closeAll() {
	for _, c := range sh.clients {
		_ = c.Close()
	}
}

// stall starts a session from src that sends its StartupMessage and then
// stays silent in the middle of SCRAM: it holds a startup slot until closed.
func (sh *startingHarness) stall(t *testing.T, src net.Addr) net.Conn {
	t.Helper()
	c := sh.serve(t, src)
	if _, err := c.Write(startupMessage()); err != nil {
		t.Fatalf("session from %v: writing the startup packet: %v", src, err)
	}
	if m, err := readServerMsg(c); err != nil || !m.isSASLRequest() {
		t.Fatalf("session from %v: want AuthenticationSASL, got %v %v", src, m, err)
	}
	return c
}

// refused starts a session from src and returns what the server says
// before hanging up, which it must do without reading anything.
func (sh *startingHarness) refused(t *testing.T, src net.Addr) serverMsg {
	t.Helper()
	c := sh.serve(t, src)
	m, err := readServerMsg(c)
	if err != nil {
		t.Fatalf("session from %v: want an ErrorResponse, got %v", src, err)
	}
	if _, err := readServerMsg(c); err == nil {
		t.Fatalf("session from %v: the server kept talking after refusing", src)
	}
	return m
}

// waitStarting polls until n sessions hold startup slots.
func (sh *startingHarness) waitStarting(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for sh.pooler.StartingSessions() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions starting, want %d", sh.pooler.StartingSessions(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func tcpSource(ip string) net.Addr {
	return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}
}

// TestPreauthStartingLimits: sessions that have not authenticated are
// bounded per source (client IP) and in all, both refused with FATAL 53300
// before anything is read; a source's slots come back when its sessions
// end, and an authenticated client gets in once the starting ones are gone.
func TestPreauthStartingLimits(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), cfg: pooler.Config{
		Auth:                 scramAuthenticator(t),
		MaxStartingClients:   4,
		MaxStartingPerSource: 2,
		StartupTimeout:       time.Minute,
	}})
	sh := &startingHarness{harness: h, ctx: testCtx(t, 2*time.Minute)}
	t.Cleanup(sh.wg.Wait) // runs after the pipes close (cleanups run last first)
	ctx := sh.ctx

	wantRefusal := func(m serverMsg, msg string) {
		t.Helper()
		if m.errorField('S') != "FATAL" || m.errorField('C') != "53300" || m.errorField('M') != msg {
			t.Fatalf("got %v, want FATAL 53300 %q", m, msg)
		}
	}
	a, b, c, d := tcpSource("10.0.0.1"), tcpSource("10.0.0.2"), &net.UDPAddr{IP: net.ParseIP("2001:db8::3"), Port: 1}, tcpSource("10.0.0.4")

	a1 := sh.stall(t, a)
	sh.stall(t, tcpSource("::ffff:10.0.0.1")) // the same host as a, IPv4-mapped
	wantRefusal(sh.refused(t, a), "too many connections still authenticating from 10.0.0.1")
	sh.stall(t, b)
	sh.stall(t, c)
	sh.waitStarting(t, 4)
	wantRefusal(sh.refused(t, d), "too many connections still authenticating")

	// A real client over TCP is refused too while every slot is taken.
	_, err := pgconn.Connect(ctx, h.url())
	if code := pgCode(err); code != "53300" {
		t.Fatalf("pgx connect with every startup slot taken: %v (code %q), want 53300", err, code)
	}

	// A session that ends gives its slot back to its source.
	_ = a1.Close()
	sh.waitStarting(t, 3)
	a3 := sh.stall(t, a)
	sh.waitStarting(t, 4)

	// Sessions without an address share the source "unknown".
	_ = a3.Close()
	sh.waitStarting(t, 3)
	sh.stall(t, nil)
	sh.waitStarting(t, 4)
	wantRefusal(sh.refused(t, nil), "too many connections still authenticating")

	// Once the starting sessions are gone, authenticated clients get in and
	// hold no startup slot.
	sh.closeAll()
	sh.waitStarting(t, 0)
	conns := make([]*pgconn.PgConn, 5) // more than MaxStartingClients, one after another
	for i := range conns {
		conn, err := pgconn.Connect(ctx, h.url())
		if err != nil {
			t.Fatalf("authenticated client %d after the starting sessions left: %v", i, err)
		}
		defer conn.Close(context.Background())
		conns[i] = conn
	}
	if res := conns[4].ExecParams(ctx, "select 1", nil, nil, nil, nil).Read(); res.Err != nil {
		t.Fatal(res.Err)
	}
	if n := h.pooler.StartingSessions(); n != 0 {
		t.Fatalf("%d sessions still counted as starting after logging in", n)
	}
}

// TestPreauthStartingPerSourceIPv6Prefix: IPv6 clients count against
// MaxStartingPerSource by their /64, so a host cannot dodge the limit by
// using many addresses of its prefix, while a neighbouring /64 is another
// source.
func TestPreauthStartingPerSourceIPv6Prefix(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), cfg: pooler.Config{
		Auth:                 scramAuthenticator(t),
		MaxStartingClients:   10,
		MaxStartingPerSource: 2,
		StartupTimeout:       time.Minute,
	}})
	sh := &startingHarness{harness: h, ctx: testCtx(t, 2*time.Minute)}
	t.Cleanup(sh.wg.Wait)
	sh.stall(t, tcpSource("2001:db8::1"))
	sh.stall(t, tcpSource("2001:db8::ffff:2"))
	m := sh.refused(t, tcpSource("2001:db8::3"))
	if m.errorField('C') != "53300" || m.errorField('M') != "too many connections still authenticating from 2001:db8::/64" {
		t.Fatalf("third session from 2001:db8::/64: %v, want FATAL 53300 naming the /64", m)
	}
	sh.stall(t, tcpSource("2001:db8:0:1::1")) // the next /64
	sh.waitStarting(t, 3)
	sh.closeAll()
	sh.waitStarting(t, 0)
}
