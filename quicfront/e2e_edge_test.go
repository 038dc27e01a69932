package quicfront_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgquic/pgquic/edge"
	"github.com/pgquic/pgquic/quicclient"
)

// toolPath finds a libpq tool (psql, pgbench), failing under CI where it
// must be installed and skipping elsewhere.
func toolPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found: %v", name, err)
		}
		t.Skipf("%s not found", name)
	}
	return p
}

var (
	pgbenchFailedRe    = regexp.MustCompile(`number of failed transactions: (\d+)`)
	pgbenchProcessedRe = regexp.MustCompile(`number of transactions actually processed: (\d+)`)
	pgbenchTPSRe       = regexp.MustCompile(`tps = ([0-9.]+)`)
	pgbenchLatencyRe   = regexp.MustCompile(`latency average = ([0-9.]+ ms)`)
)

// TestE2EEdgePsqlPgbench is acceptance point 3: psql, pgbench -i and
// pgbench -S -c 50 through Edge (loopback TCP) → QUIC → pooler →
// PostgreSQL, with zero failed transactions. pgbench runs 5 s by default,
// 10 s with PGQUIC_FULL=1.
func TestE2EEdgePsqlPgbench(t *testing.T) {
	psql := toolPath(t, "psql")
	bench := toolPath(t, "pgbench")
	e := newE2E(t, e2eOpts{})
	d := e.dialer(t, 4, 100) // what `pgquic edge` uses by default
	sidecar := startSidecar(t, d, e2eLogger(t))

	host, port, _ := net.SplitHostPort(sidecar.Addr().String())
	// sslmode=prefer: libpq sends SSLRequest, the edge answers N locally.
	env := append(os.Environ(), "PGHOST="+host, "PGPORT="+port, "PGUSER=postgres", "PGPASSWORD=postgres",
		"PGDATABASE=postgres", "PGSSLMODE=prefer", "PGCONNECT_TIMEOUT=30")
	run := func(name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}

	t.Run("psql", func(t *testing.T) {
		script := `\set ON_ERROR_STOP 1
CREATE TABLE edge_psql (id int PRIMARY KEY, v text);
BEGIN;
INSERT INTO edge_psql SELECT g, 'v' || g FROM generate_series(1, 100) g;
COMMIT;
\copy edge_psql FROM stdin
101	copied
\.
SELECT count(*) || ' rows, last ' || max(v) FROM edge_psql WHERE id > 99;
PREPARE p(int) AS SELECT v FROM edge_psql WHERE id = $1;
`
		out := run(psql, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-c", "select 'hello over ' || 'quic'")
		if strings.TrimSpace(out) != "hello over quic" {
			t.Fatalf("psql -c: %q", out)
		}
		f := t.TempDir() + "/script.sql"
		if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		out = run(psql, "-X", "-q", "-t", "-A", "-f", f)
		if !strings.Contains(out, "2 rows, last v100") {
			t.Fatalf("psql script output: %q", out)
		}
	})

	t.Run("pgbench", func(t *testing.T) {
		run(bench, "-i", "-s", "1", "-q")
		dur := "5"
		if e2eFull() {
			dur = "10"
		}
		for _, mode := range []string{"simple", "extended", "prepared"} {
			out := run(bench, "-S", "-M", mode, "-c", "50", "-j", "2", "-T", dur, "-n")
			m := pgbenchProcessedRe.FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no processed count in pgbench output:\n%s", out)
			}
			n, _ := strconv.Atoi(m[1])
			if n == 0 {
				t.Fatalf("no transactions processed:\n%s", out)
			}
			f := pgbenchFailedRe.FindStringSubmatch(out)
			if f == nil {
				t.Fatalf("no failed-transactions line in pgbench output:\n%s", out)
			}
			if f[1] != "0" {
				t.Fatalf("%s failed transactions:\n%s", f[1], out)
			}
			tps, lat := "", ""
			if m := pgbenchTPSRe.FindStringSubmatch(out); m != nil {
				tps = m[1]
			}
			if m := pgbenchLatencyRe.FindStringSubmatch(out); m != nil {
				lat = m[1]
			}
			t.Logf("pgbench -S -M %s -c 50 -T %s through the edge: %d transactions, 0 failed, tps %s, latency avg %s", mode, dur, n, tps, lat)
		}
	})
	e.waitIdle(t, 0)
}

// startSidecar serves a local edge sidecar over d on a free loopback port
// until the test ends, when it shuts it down (its sessions get 10 s to
// finish) and waits for it.
func startSidecar(t *testing.T, d *quicclient.Dialer, logger *slog.Logger) *edge.Edge {
	t.Helper()
	sidecar, err := edge.New(edge.Config{Listen: "127.0.0.1:0", Dialer: d}, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sidecar.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sidecar.Serve(ctx) }()
	t.Cleanup(func() {
		sctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		_ = sidecar.Shutdown(sctx)
		stop()
		cancel()
		<-done
	})
	return sidecar
}
