package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/pooler"
)

// metricSum returns the sum over every series of the family name in reg.
func metricSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

// waitMetric polls until the family name sums to want, or fails at the
// deadline.
func waitMetric(t *testing.T, reg *prometheus.Registry, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := metricSum(t, reg, name)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v, want %v", name, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMetricsTransactionsPerMode: pgquic_pooler_transactions_total counts a
// client's transactions (three implicit ones and one block here) in both
// modes, where it used to count server assignments, that is sessions in
// session mode; pgquic_pooler_server_assignments_total keeps that meaning.
func TestMetricsTransactionsPerMode(t *testing.T) {
	c := sharedCluster(t)
	for _, tc := range []struct {
		mode        pooler.Mode
		assignments float64
	}{
		{pooler.ModeTransaction, 4},
		{pooler.ModeSession, 1},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			h := newHarness(t, harnessOpts{cfg: pooler.Config{Mode: tc.mode}, cluster: c, poolSize: 2, reg: reg})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn := h.connect(ctx, t)
			for range 3 {
				if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
					t.Fatal(err)
				}
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "SELECT 2"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := conn.Close(ctx); err != nil {
				t.Fatal(err)
			}
			waitMetric(t, reg, "pgquic_pooler_server_assignments_total", tc.assignments)
			waitMetric(t, reg, "pgquic_pooler_clients", 0)
			if got := metricSum(t, reg, "pgquic_pooler_transactions_total"); got != 4 {
				t.Fatalf("pgquic_pooler_transactions_total = %v, want 4", got)
			}
		})
	}
}

// TestMetricsSharedRegistry: a second pooler on the same registry counts
// into the series the first registered instead of failing or counting into
// copies nobody scrapes.
func TestMetricsSharedRegistry(t *testing.T) {
	c := sharedCluster(t)
	reg := prometheus.NewRegistry()
	h1 := newHarness(t, harnessOpts{cfg: pooler.Config{Mode: pooler.ModeTransaction}, cluster: c, poolSize: 2, reg: reg})
	h2 := newHarness(t, harnessOpts{cfg: pooler.Config{Mode: pooler.ModeTransaction}, cluster: c, poolSize: 2, reg: reg})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, h := range []*harness{h1, h2} {
		conn := h.connect(ctx, t)
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	waitMetric(t, reg, "pgquic_pooler_transactions_total", 2)
	if got := metricSum(t, reg, "pgquic_pooler_clients"); got != 2 {
		t.Fatalf("pgquic_pooler_clients = %v, want 2 (one client on each pooler)", got)
	}
}
