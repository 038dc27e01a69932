package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/internal/udpcapture"
	"github.com/pgquic/pgquic/quicclient"
)

// TestZeroRTTServe runs serve with zero_rtt: read-only and an edge-trusted
// client certificate over real QUIC and PostgreSQL: a new process (a
// fresh Dialer) with a ticket and a greeting in its session cache file
// sends its startup and first request in 0-RTT; the pooler answers a
// plain read before the handshake is confirmed (counted accepted, the
// connection reported 0-RTT) and runs a write once, after it.
// zeroRTTSetup runs serve with zero_rtt: read-only, trusting a client
// certificate as an edge, and a table z0 to write to. session opens one
// session as a new process would (a fresh ZeroRTT Dialer with local
// startup on the shared session cache file) through addr, runs sql, and
// returns the Dialer's Stats; rows counts z0's rows. other is a second
// replica on the same PostgreSQL with the same certificate and ticket
// keys (--tls-session-ticket-keys-file), as replicas behind one address.
func zeroRTTSetup(t *testing.T, ctx context.Context) (srv, other *server, session func(addr, sql string) quicclient.DialerStats, rows func() string) {
	cluster := pgtest.New(t, pgtest.Options{})
	if err := cluster.Exec(ctx, "CREATE TABLE z0 (v int)"); err != nil {
		t.Fatal(err)
	}
	cert, key, fp := clientCert(t)
	dir := t.TempDir()
	trust := filepath.Join(dir, "edges.txt")
	if err := os.WriteFile(trust, fmt.Appendf(nil, "%s %s postgres\n", fp, cluster.SuperUser), 0o600); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := writeCert(t, dir)
	keysFile := filepath.Join(dir, "ticket-keys")
	if err := os.WriteFile(keysFile, []byte(strings.Repeat("k", 64)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func() *server {
		cfg := testConfig(cluster.SuperURL("postgres"))
		cfg.EdgeTrust = trust
		cfg.ZeroRTT = config.ZeroRTTReadOnly
		cfg.TLSCert, cfg.TLSKey, cfg.TLSSessionTicketKeysFile = certFile, keyFile, keysFile
		srv, _, _ := startTestServer(t, cfg)
		return srv
	}
	srv, other = start(), start()
	cache := filepath.Join(dir, "session-cache")
	paths := map[string]string{}
	session = func(addr, sql string) quicclient.DialerStats {
		t.Helper()
		// The server's datagrams arrive 5 ms late, as on any real path:
		// over bare loopback a client may still be opening its 0-RTT
		// stream while quic-go processes the server's answer, an
		// unsynchronized access (quic-go issue 4303) the race detector
		// reports now and then.
		// One path per address for the whole test, closed at its end, so
		// every client's closing packet reaches the server.
		path, ok := paths[addr]
		if !ok {
			p, err := udpcapture.NewDelayed(addr, 5*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			path, paths[addr] = p.Addr(), p.Addr()
		}
		d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: path, Conns: 1,
			PinSHA256: srv.quic.Fingerprint(), CertFile: cert, KeyFile: key, LocalStartup: true,
			SessionCacheFile: cache, ZeroRTT: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		pcfg := quictest.PgConfigURL(t, d, fmt.Sprintf("postgres://%s@quic/postgres?sslmode=disable", cluster.SuperUser))
		c, err := pgconn.ConnectConfig(ctx, pcfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		if c.TxStatus() != 'I' {
			t.Fatalf("%s: status %q after it, want 'I'", sql, c.TxStatus())
		}
		waitFor(t, func() bool { return len(d.GreetingStore().LoadGreetings()) > 0 })
		// The 0-RTT outcome is recorded once the handshake completed,
		// about when the first answer arrives: give it a moment (a
		// session without a ticket has none).
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if st := d.Stats(); st.ZeroRTT+st.ZeroRTTRejected > 0 {
				break
			}
		}
		return d.Stats()
	}
	direct, err := pgconn.Connect(ctx, cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close(context.Background()) })
	rows = func() string {
		res, err := direct.Exec(ctx, "SELECT count(*) FROM z0").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		return string(res[0].Rows[0][0])
	}
	return srv, other, session, rows
}

// TestZeroRTTServe runs serve with zero_rtt: read-only and an edge-trusted
// client certificate over real QUIC and PostgreSQL: a new process (a
// fresh Dialer) with a ticket and a greeting in its session cache file
// sends its startup and first request in 0-RTT; the pooler answers a
// plain read before the handshake is confirmed (counted accepted, the
// connection reported 0-RTT) and runs a write once, after it.
func TestZeroRTTServe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	srv, _, session, rows := zeroRTTSetup(t, ctx)
	addr := srv.quic.Addr().String()
	session(addr, "SELECT 1") // no ticket, no greeting yet
	session(addr, "SELECT 1") // the greeting, a ticket
	accepted := func() float64 {
		return sum(scrape(t, srv), "pgquic_pooler_zero_rtt_requests_total", `outcome="accepted"`)
	}
	before := accepted()
	if st := session(addr, "SELECT count(*) FROM z0"); st.ZeroRTT != 1 {
		t.Fatalf("a new process with a ticket: %+v, want its connection's 0-RTT accepted", st)
	}
	if got := accepted(); got != before+1 {
		t.Fatalf("zero_rtt accepted %v -> %v, want one more", before, got)
	}
	session(addr, "INSERT INTO z0 VALUES (1)")
	if n := rows(); n != "1" {
		t.Fatalf("rows after a write in 0-RTT: %s, want exactly 1", n)
	}
}

// TestZeroRTTReplay captures the first flight of a client whose write
// went in 0-RTT (a UDP proxy on its path) and, once the genuine session
// is over, sends it again from a new socket, as an attacker would: the
// server takes it as a new 0-RTT connection and the pooler reads the
// write, but never runs it (the replayer cannot finish the handshake), and
// the replayed session ends, the pooler back to no clients.
func TestZeroRTTReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	srv, other, session, rows := zeroRTTSetup(t, ctx)
	addr := srv.quic.Addr().String()
	session(addr, "SELECT 1")
	session(addr, "SELECT 1")
	proxy, err := udpcapture.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	if st := session(proxy.Addr(), "INSERT INTO z0 VALUES (1)"); st.ZeroRTT != 1 {
		t.Fatalf("the genuine session: %+v, want 0-RTT accepted", st)
	}
	if n := rows(); n != "1" {
		t.Fatalf("rows after the genuine write: %s, want 1", n)
	}
	flight := proxy.FirstFlight()
	if len(flight) == 0 {
		t.Fatal("no first flight captured")
	}
	// Once to the same server and once to the other replica, which
	// shares the ticket keys.
	for _, to := range []*server{srv, other} {
		deferred := func() float64 {
			return sum(scrape(t, to), "pgquic_pooler_zero_rtt_requests_total", `outcome="deferred"`)
		}
		before := deferred()
		// Twice: the first may meet the genuine connection's IDs, which
		// the server still keeps for a moment after it closed.
		for range 2 {
			if err := udpcapture.Replay(ctx, to.quic.Addr().String(), flight, 500*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		// The replayed write reached the pooler and was held...
		for end := time.Now().Add(10 * time.Second); deferred() == before; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("the replayed write never reached the pooler at %s", to.quic.Addr())
			}
		}
		// ...until its connection died unconfirmed.
		deadline := time.Now().Add(30 * time.Second)
		for sum(scrape(t, to), "pgquic_pooler_clients") != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("pooler still has %v clients after the replay", sum(scrape(t, to), "pgquic_pooler_clients"))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if n := rows(); n != "1" {
		t.Fatalf("rows after replaying the write's flight: %s, want still 1", n)
	}

	// A read's flight replayed runs at most that read, read-only, once
	// per replay, and leaves nothing behind either.
	readProxy, err := udpcapture.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer readProxy.Close()
	if st := session(readProxy.Addr(), "SELECT count(*) FROM z0"); st.ZeroRTT != 1 {
		t.Fatalf("the genuine read: %+v, want 0-RTT accepted", st)
	}
	accepted := func() float64 {
		return sum(scrape(t, srv), "pgquic_pooler_zero_rtt_requests_total", `outcome="accepted"`)
	}
	before := accepted()
	for range 2 {
		if err := udpcapture.Replay(ctx, addr, readProxy.FirstFlight(), 500*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for sum(scrape(t, srv), "pgquic_pooler_clients") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("pooler still has %v clients after the read's replays", sum(scrape(t, srv), "pgquic_pooler_clients"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := accepted() - before; got > 2 {
		t.Fatalf("two replays of a read ran it %v times read-only, want at most 2", got)
	}
	if n := rows(); n != "1" {
		t.Fatalf("rows after replaying the read's flight: %s, want still 1", n)
	}
}
