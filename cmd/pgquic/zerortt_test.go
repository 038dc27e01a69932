package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/quicclient"
)

// TestZeroRTTServe runs serve with zero_rtt: read-only and an edge-trusted
// client certificate over real QUIC and PostgreSQL: a new process (a
// fresh Dialer) with a ticket and a greeting in its session cache file
// sends its startup and first request in 0-RTT; the pooler answers a
// plain read before the handshake is confirmed (counted accepted, the
// connection reported 0-RTT) and runs a write once, after it.
func TestZeroRTTServe(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := cluster.Exec(ctx, "CREATE TABLE z0 (v int)"); err != nil {
		t.Fatal(err)
	}
	cert, key, fp := clientCert(t)
	dir := t.TempDir()
	trust := filepath.Join(dir, "edges.txt")
	if err := os.WriteFile(trust, fmt.Appendf(nil, "%s %s postgres\n", fp, cluster.SuperUser), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(cluster.SuperURL("postgres"))
	cfg.EdgeTrust = trust
	cfg.ZeroRTT = config.ZeroRTTReadOnly
	srv, _, _ := startTestServer(t, cfg)
	cache := filepath.Join(dir, "session-cache")

	session := func(sql string) quicclient.DialerStats {
		t.Helper()
		d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: srv.quic.Addr().String(), Conns: 1,
			PinSHA256: srv.quic.Fingerprint(), CertFile: cert, KeyFile: key, LocalStartup: true,
			SessionCacheFile: cache, ZeroRTT: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		pcfg, err := pgconn.ParseConfig(fmt.Sprintf("postgres://%s@quic/postgres?sslmode=disable", cluster.SuperUser))
		if err != nil {
			t.Fatal(err)
		}
		pcfg.DialFunc, pcfg.LookupFunc = d.DialFunc(), d.LookupFunc()
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
		st := d.Stats()
		waitFor(t, func() bool { return len(d.GreetingStore().LoadGreetings()) > 0 })
		return st
	}
	session("SELECT 1") // no ticket, no greeting yet
	session("SELECT 1") // the greeting, a ticket
	accepted := func() float64 {
		return sum(scrape(t, srv), "pgquic_pooler_zero_rtt_requests_total", `outcome="accepted"`)
	}
	before := accepted()
	if st := session("SELECT count(*) FROM z0"); st.ZeroRTT != 1 {
		t.Fatalf("a new process with a ticket: %+v, want its connection's 0-RTT accepted", st)
	}
	if got := accepted(); got != before+1 {
		t.Fatalf("zero_rtt accepted %v -> %v, want one more", before, got)
	}
	session("INSERT INTO z0 VALUES (1)")
	direct, err := pgconn.Connect(ctx, cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	res, err := direct.Exec(ctx, "SELECT count(*) FROM z0").ReadAll()
	if err != nil || string(res[0].Rows[0][0]) != "1" {
		t.Fatalf("rows after a write in 0-RTT: %v (%v), want exactly 1", res, err)
	}
}
