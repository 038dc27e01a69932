package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/quicclient"
)

// scrape fetches /metrics and returns each sample line's value keyed by its
// name and labels as exposed (e.g. `pgquic_quic_streams` or
// `pgquic_pooler_server_errors_total{class="22"}`).
func scrape(t *testing.T, srv *server) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + srv.metrics.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// sum adds the samples of family name whose labels contain every one of
// the given label pairs (written as in the exposition, e.g. `state="idle"`).
func sum(samples map[string]float64, name string, labels ...string) float64 {
	var total float64
	for k, v := range samples {
		fam, lbls, _ := strings.Cut(k, "{")
		if fam != name {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(lbls, l)
		}
		if ok {
			total += v
		}
	}
	return total
}

// TestMetricsUnderLoad scrapes /metrics of a running server while clients
// use it and checks that the series move as the load says they must: six
// clients on a pool of two wait, and the wait histogram fills; QUIC streams
// are counted while open and drop back to zero; server errors are counted
// by SQLSTATE class; the query and transaction histograms count exactly the
// queries run; bytes are counted per front; each session leaves one log line.
func TestMetricsUnderLoad(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	cfg := testConfig(cluster.SuperURL("postgres"))
	cfg.PoolSize = 2
	srv, logs, stop := startTestServer(t, cfg)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	tcpURL := fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, srv.tcp.Addr())
	queries := 0

	// Six clients, one pg_sleep each, on a pool of two: four must wait.
	const sleepers = 6
	conns := make([]*pgconn.PgConn, sleepers)
	for i := range conns {
		c, err := pgconn.Connect(ctx, tcpURL)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		conns[i] = c
	}
	var wg sync.WaitGroup
	errs := make(chan error, sleepers)
	for _, c := range conns {
		wg.Go(func() {
			_, err := c.Exec(ctx, "SELECT pg_sleep(0.6)").ReadAll()
			errs <- err
		})
	}
	queries += sleepers
	sawWaiting, sawSaturated := false, false
	waitFor(t, func() bool {
		m := scrape(t, srv)
		sawWaiting = sawWaiting || sum(m, "pgquic_pooler_clients_by_state", `state="waiting"`, `transport="tcp"`) > 0
		sawSaturated = sawSaturated || sum(m, "pgquic_backend_pool_saturation") == 1
		return sawWaiting && sawSaturated
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	m := scrape(t, srv)
	if n, fast := sum(m, "pgquic_pooler_server_wait_seconds_count"), sum(m, "pgquic_pooler_server_wait_seconds_bucket", `le="0.1"`); n < sleepers || fast >= n {
		t.Errorf("wait histogram: %v waits, %v of them under 0.1 s; want %d or more, some of them longer", n, fast, sleepers)
	}
	if got := sum(m, "pgquic_pooler_clients_by_state", `state="idle"`, `transport="tcp"`); got != sleepers {
		t.Errorf("idle TCP clients after the load = %v, want %d", got, sleepers)
	}

	// Server errors by class.
	for _, q := range []string{"SELECT 1/0", "SELEC 1"} {
		if _, err := conns[0].Exec(ctx, q).ReadAll(); err == nil {
			t.Fatalf("%s succeeded", q)
		}
		queries++
	}
	m = scrape(t, srv)
	for _, class := range []string{"22", "42"} {
		if got := sum(m, "pgquic_pooler_server_errors_total", `class="`+class+`"`); got != 1 {
			t.Errorf("server errors of class %s = %v, want 1", class, got)
		}
	}

	// QUIC streams counted while their sessions are open, then none.
	const streams = 5
	dialer, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: srv.quic.Addr().String(), Conns: 1, PinSHA256: srv.quic.Fingerprint()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dialer.Close()
	pcfg, err := pgconn.ParseConfig(tcpURL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.DialFunc = dialer.DialFunc()
	var qconns []*pgconn.PgConn
	for range streams {
		c, err := pgconn.ConnectConfig(ctx, pcfg)
		if err != nil {
			t.Fatalf("connect over QUIC: %v", err)
		}
		if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
			t.Fatal(err)
		}
		queries++
		qconns = append(qconns, c)
	}
	if got := sum(scrape(t, srv), "pgquic_quic_streams"); got != streams {
		t.Errorf("pgquic_quic_streams with %d sessions open = %v", streams, got)
	}
	for _, c := range qconns {
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return sum(scrape(t, srv), "pgquic_quic_streams") == 0 })

	// Every query run is counted once, as a query and as a transaction.
	m = scrape(t, srv)
	if got := sum(m, "pgquic_backend_query_duration_seconds_count"); got != float64(queries) {
		t.Errorf("query duration histogram counts %v queries, %d were run", got, queries)
	}
	if got := sum(m, "pgquic_backend_transaction_duration_seconds_count"); got != float64(queries) {
		t.Errorf("transaction duration histogram counts %v, %d implicit transactions were run", got, queries)
	}
	if got := sum(m, "pgquic_pooler_transactions_total"); got != float64(queries) {
		t.Errorf("pgquic_pooler_transactions_total = %v, want %d", got, queries)
	}
	if got := sum(m, "pgquic_backend_query_duration_seconds_bucket", `le="0.5"`); got != float64(queries-sleepers) {
		t.Errorf("queries under 0.5 s = %v, want all but the %d sleepers (%d)", got, sleepers, queries-sleepers)
	}
	for _, tr := range []string{"tcp", "quic"} {
		for _, fam := range []string{"pgquic_pooler_client_received_bytes_total", "pgquic_pooler_client_sent_bytes_total"} {
			if got := sum(m, fam, `transport="`+tr+`"`); got <= 0 {
				t.Errorf("%s{transport=%q} = %v", fam, tr, got)
			}
		}
	}

	// One line per session end, with its transactions.
	quicEnds := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, `msg="session ended"`) && strings.Contains(l, " transport=quic ") {
				out = append(out, l)
			}
		}
		return out
	}
	waitFor(t, func() bool { return len(quicEnds()) == streams })
	for _, l := range quicEnds() {
		for _, want := range []string{"user=postgres", "database=postgres", "transactions=1 ", "duration=", `outcome="closed by client"`} {
			if !strings.Contains(l, want) {
				t.Errorf("QUIC session end line lacks %q: %s", want, l)
			}
		}
	}
}
