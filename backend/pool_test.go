package backend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/pgtest"
)

const appPassword = "app-secret"

// appCluster starts a cluster with a login role "app".
func appCluster(t *testing.T, auth string, ssl bool) *pgtest.Cluster {
	t.Helper()
	return pgtest.New(t, pgtest.Options{
		Auth:   auth,
		SSL:    ssl,
		Users:  []pgtest.User{{Name: "app", Password: appPassword}},
		Logger: testLogger(t),
	})
}

// withSSLMode replaces the sslmode of a pgtest URL.
func withSSLMode(url, mode string) string {
	for _, m := range []string{"sslmode=disable", "sslmode=prefer"} {
		url = strings.Replace(url, m, "sslmode="+mode, 1)
	}
	return url
}

func newTestPool(t *testing.T, cfg PoolConfig, m *Metrics) *Pool {
	t.Helper()
	p, err := NewPool(testCtx(t), cfg, testLogger(t), m)
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestConnectAuthMethods(t *testing.T) {
	for _, tc := range []struct {
		name    string
		auth    string
		ssl     bool
		sslmode string
	}{
		{"trust", pgtest.AuthTrust, false, "disable"},
		{"md5", pgtest.AuthMD5, false, "disable"},
		{"scram", pgtest.AuthSCRAM, false, "disable"},
		{"cleartext-over-tls", pgtest.AuthPassword, true, "require"},
		{"scram-over-tls", pgtest.AuthSCRAM, true, "require"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			pg := appCluster(t, tc.auth, tc.ssl)
			url := withSSLMode(pg.URL("app", appPassword, "postgres"), tc.sslmode) + "&application_name=pgquic-test"
			p := newTestPool(t, PoolConfig{ConnString: url, PoolSize: 2}, nil)
			c, err := p.Acquire(ctx)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			defer c.Release()
			if got := query(t, c, "SELECT current_user"); len(got) != 1 || got[0] != "app" {
				t.Fatalf("current_user = %v", got)
			}
			if got := query(t, c, "SELECT current_setting('application_name')"); got[0] != "pgquic-test" {
				t.Fatalf("runtime param not sent: application_name = %v", got)
			}
			if c.Params["application_name"] != "pgquic-test" || c.Params["server_version"] == "" {
				t.Fatalf("Params not taken over from pgconn: %v", c.Params)
			}
			if c.PID == 0 || len(c.SecretKey) == 0 {
				t.Fatalf("PID %d, SecretKey %x", c.PID, c.SecretKey)
			}
			ssl := query(t, c, "SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
			if want := fmt.Sprint(tc.ssl); ssl[0] != want {
				t.Fatalf("ssl = %v, want %s", ssl, want)
			}

			if tc.auth != pgtest.AuthTrust {
				bad, err := NewPool(ctx, PoolConfig{ConnString: withSSLMode(pg.URL("app", "wrong", "postgres"), tc.sslmode)}, testLogger(t), nil)
				if err != nil {
					t.Fatalf("NewPool with a wrong password must not fail at start: %v", err)
				}
				defer bad.Close()
				_, err = bad.Acquire(ctx)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
					t.Fatalf("Acquire with a wrong password: %v, want SQLSTATE 28P01", err)
				}
			}
		})
	}
}

func TestConnectUnixSocket(t *testing.T) {
	ctx := testCtx(t)
	pg := appCluster(t, pgtest.AuthSCRAM, false)
	p := newTestPool(t, PoolConfig{ConnString: fmt.Sprintf("host=%s port=%d user=app dbname=postgres", pg.SocketDir, pg.Port)}, nil)
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if c.raw == nil {
		t.Error("no raw socket access on a unix socket")
	}
	if got := query(t, c, "SELECT current_user"); got[0] != "app" {
		t.Fatalf("current_user = %v", got)
	}
	c.Release()
}

// countBackends counts the server processes of user "app".
func countBackends(ctx context.Context, t *testing.T, pg *pgtest.Cluster) string {
	t.Helper()
	return superQuery(ctx, t, pg.SuperURL("postgres"), "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'")[0]
}

func TestMinPoolWarmAtStart(t *testing.T) {
	ctx := testCtx(t)
	pg := appCluster(t, pgtest.AuthSCRAM, false)
	p := newTestPool(t, PoolConfig{ConnString: pg.URL("app", appPassword, "postgres"), PoolSize: 5, MinPool: 3}, nil)
	if s := p.Stat(); s.Total != 3 || s.Idle != 3 || s.Max != 5 || s.Database != "postgres" || s.User != "app" {
		t.Fatalf("Stat right after NewPool = %+v", s)
	}
	if n := countBackends(ctx, t, pg); n != "3" {
		t.Fatalf("pg_stat_activity shows %s app backends, want 3", n)
	}
}

func TestAcquireBlocksAtPoolSize(t *testing.T) {
	ctx := testCtx(t)
	pg := appCluster(t, pgtest.AuthTrust, false)
	p := newTestPool(t, PoolConfig{ConnString: pg.URL("app", "", "postgres"), PoolSize: 2}, nil)
	c1, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s := p.Stat(); s.InUse != 2 || s.Total != 2 {
		t.Fatalf("Stat = %+v", s)
	}
	if n := p.Spare(); n != 0 {
		t.Fatalf("Spare with both connections lent = %d, want 0", n)
	}

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := p.Acquire(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on a full pool: %v, want DeadlineExceeded", err)
	}

	got := make(chan *Conn)
	go func() {
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	waitFor(t, 10*time.Second, "a waiting Acquire", func() bool { return p.Stat().Waiting == 1 })
	select {
	case <-got:
		t.Fatal("Acquire returned while the pool was full")
	case <-time.After(100 * time.Millisecond):
	}
	pid := c1.PID
	c1.Release()
	c3 := <-got
	if c3 == nil || c3.PID != pid {
		t.Fatalf("waiter did not get the released connection")
	}
	if n := p.Spare(); n != 0 {
		t.Fatalf("Spare after a release to a waiter = %d, want 0", n)
	}
	c3.Release()
	c3.Release() // again: does nothing, and counts nothing
	if n := p.Spare(); n != 1 {
		t.Fatalf("Spare with one connection lent = %d, want 1", n)
	}
	c2.Destroy()
	c2.Release()
	// puddle closes a destroyed connection in the background.
	waitFor(t, 10*time.Second, "the destroyed connection gone", func() bool {
		s := p.Stat()
		return s.Idle == 1 && s.InUse == 0 && s.Waiting == 0
	})
	if n := p.Spare(); n != 2 {
		t.Fatalf("Spare with nothing lent = %d, want 2 (the size: one idle, one to open)", n)
	}
}

// terminateAll terminates every "app" backend and waits for them to exit.
func terminateAll(ctx context.Context, t *testing.T, pg *pgtest.Cluster) {
	t.Helper()
	superQuery(ctx, t, pg.SuperURL("postgres"),
		"SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity WHERE usename = 'app'")
}

func TestTerminatedBackendsNeverHandedOut(t *testing.T) {
	for _, tc := range []struct {
		name string
		ssl  bool
	}{{"plain", false}, {"tls", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			pg := appCluster(t, pgtest.AuthSCRAM, tc.ssl)
			mode := "disable"
			if tc.ssl {
				mode = "require"
			}
			reg := prometheus.NewRegistry()
			m := NewMetrics(reg)
			// A long HealthCheckAfter proves the cheap socket peek alone
			// catches the terminated connections.
			p := newTestPool(t, PoolConfig{
				ConnString: withSSLMode(pg.URL("app", appPassword, "postgres"), mode),
				PoolSize:   4, MinPool: 3, HealthCheckAfter: time.Hour,
			}, m)
			terminateAll(ctx, t, pg)

			var conns []*Conn
			for range 3 {
				c, err := p.Acquire(ctx)
				if err != nil {
					t.Fatalf("Acquire after pg_terminate_backend: %v", err)
				}
				if got := query(t, c, "SELECT 1"); got[0] != "1" {
					t.Fatalf("SELECT 1 = %v", got)
				}
				conns = append(conns, c)
			}
			for _, c := range conns {
				c.Release()
			}
			if dead := metricValue(t, reg, "pgquic_backend_destroyed_total", "reason", reasonDead); dead != 3 {
				t.Fatalf("destroyed{reason=dead} = %v, want 3", dead)
			}
		})
	}
}

func TestServerRestart(t *testing.T) {
	ctx := testCtx(t)
	pg := appCluster(t, pgtest.AuthSCRAM, false)
	p := newTestPool(t, PoolConfig{ConnString: pg.URL("app", appPassword, "postgres"), PoolSize: 4, MinPool: 2}, nil)
	held, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldPID := held.PID
	held.Release()

	if err := pg.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	start := time.Now()
	var c *Conn
	for c == nil {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err = p.Acquire(actx)
		cancel()
		if err != nil {
			if time.Since(start) > 30*time.Second {
				t.Fatalf("Acquire still failing %v after restart: %v", time.Since(start), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("first Acquire after restart succeeded after %v", time.Since(start))
	if c.PID == oldPID {
		t.Fatal("got a connection from before the restart")
	}
	if got := query(t, c, "SELECT 1"); got[0] != "1" {
		t.Fatalf("SELECT 1 = %v", got)
	}
	c.Release()
	// The background loop brings the pool back to MinPool live connections.
	waitFor(t, 30*time.Second, "MinPool after restart", func() bool { return countBackends(ctx, t, pg) == "2" })
}

func TestCancelRunningQuery(t *testing.T) {
	for _, tc := range []struct {
		name string
		ssl  bool
		once bool // CancelOnce (pg_cancel_backend from a fresh session) instead of a CancelRequest
		unix bool // over the Unix-domain socket
	}{{"plain", false, false, false}, {"tls", true, false, false}, {"plain-once", false, true, false},
		{"tls-once", true, true, false}, {"unix", false, false, true}, {"unix-once", false, true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			pg := appCluster(t, pgtest.AuthSCRAM, tc.ssl)
			mode := "disable"
			if tc.ssl {
				mode = "require"
			}
			cs := withSSLMode(pg.URL("app", appPassword, "postgres"), mode)
			if tc.unix {
				cs = fmt.Sprintf("host=%s port=%d user=app password=%s dbname=postgres sslmode=disable", pg.SocketDir, pg.Port, appPassword)
			}
			p := newTestPool(t, PoolConfig{ConnString: cs, PoolSize: 2}, nil)
			c, err := p.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := sendQuery(c, "SELECT pg_sleep(10)"); err != nil {
				t.Fatal(err)
			}
			// A cancel that arrives before the query starts is ignored, so
			// wait until the server runs it.
			waitFor(t, 30*time.Second, "query to start", func() bool {
				rows := superQuery(ctx, t, pg.SuperURL("postgres"), fmt.Sprintf(
					"SELECT state FROM pg_stat_activity WHERE pid = %d AND query LIKE '%%pg_sleep%%'", c.PID))
				return len(rows) == 1 && rows[0] == "active"
			})
			start := time.Now()
			if tc.once {
				if err := p.CancelOnce(ctx, c.PID); err != nil {
					t.Fatalf("CancelOnce: %v", err)
				}
			} else if err := p.Cancel(ctx, c.PID, c.SecretKey); err != nil {
				t.Fatalf("Cancel: %v", err)
			}
			r, err := readResult(c)
			if err != nil {
				t.Fatalf("read after cancel: %v", err)
			}
			if r.code != "57014" {
				t.Fatalf("SQLSTATE %q, want 57014", r.code)
			}
			t.Logf("query canceled %v after Cancel", time.Since(start))
			if got := query(t, c, "SELECT 1"); got[0] != "1" {
				t.Fatalf("connection unusable after cancel: %v", got)
			}
			if tc.once {
				// A process that is gone is nothing to cancel, not an error.
				if err := p.CancelOnce(ctx, 1); err != nil {
					t.Fatalf("CancelOnce of a PID that is no backend: %v", err)
				}
			}
			c.Release()
		})
	}
}

func TestHealthCheckLifetimeAndIdle(t *testing.T) {
	ctx := testCtx(t)
	pg := appCluster(t, pgtest.AuthTrust, false)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	p := newTestPool(t, PoolConfig{
		ConnString:        pg.URL("app", "", "postgres"),
		PoolSize:          3,
		MinPool:           1,
		HealthCheckAfter:  time.Millisecond,
		ServerIdleTimeout: 300 * time.Millisecond,
		ServerLifetime:    time.Hour,
	}, m)

	// Health check: an idle connection gets a round trip, which also keeps
	// Params current (a ParameterStatus may arrive with it).
	time.Sleep(10 * time.Millisecond)
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	query(t, c, "SELECT 1")
	c.Release()

	// Idle timeout: extra connections are closed down to MinPool.
	var conns []*Conn
	for range 3 {
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	waitFor(t, 30*time.Second, "idle connections to be closed down to MinPool", func() bool { return p.Stat().Total == 1 })
	if n := metricValue(t, reg, "pgquic_backend_destroyed_total", "reason", reasonIdle); n != 2 {
		t.Fatalf("destroyed{reason=idle} = %v, want 2", n)
	}

	// Destroy removes a connection in any state.
	c, err = p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sendQuery(c, "BEGIN; SELECT 1"); err != nil {
		t.Fatal(err)
	}
	c.Destroy()
	c.Destroy()
	c.Release()
	waitFor(t, 10*time.Second, "background loop to restore MinPool", func() bool { return p.Stat().Total == 1 })
}

func TestServerLifetime(t *testing.T) {
	ctx := testCtx(t)
	pg := appCluster(t, pgtest.AuthTrust, false)
	p := newTestPool(t, PoolConfig{ConnString: pg.URL("app", "", "postgres"), PoolSize: 2, ServerLifetime: 200 * time.Millisecond}, nil)
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	c.Release()
	// puddle destroys in the background; the count drops when it is done.
	waitFor(t, 10*time.Second, "released connection past its lifetime to be closed", func() bool { return p.Stat().Total == 0 })
	c, err = p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Release()
	waitFor(t, 10*time.Second, "idle connection past its lifetime to be closed", func() bool { return p.Stat().Total == 0 })
}

// TestStatDuringSweep checks that the background loop's health check, which
// takes every idle connection out of the pool for a moment, does not show
// them as in use: a scrape at that moment once read idle 0 and in_use 2 in
// TestMetricsExposition. Stat is read throughout 2,000 sweeps.
func TestStatDuringSweep(t *testing.T) {
	ctx := testCtx(t)
	pg := appCluster(t, pgtest.AuthTrust, false)
	p := newTestPool(t, PoolConfig{ConnString: pg.URL("app", "", "postgres"), PoolSize: 3, MinPool: 3}, nil)
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2000 {
			p.sweepIdle()
		}
	}()
	reads, wrong := 0, 0
	for swept := false; !swept; reads++ {
		select {
		case <-done:
			swept = true
		default:
		}
		if s := p.Stat(); s.Idle != 2 || s.InUse != 1 || s.Total != 3 {
			if wrong == 0 {
				t.Errorf("Stat during a sweep = %+v, want 2 idle and 1 in use", s)
			}
			wrong++
		}
	}
	t.Logf("%d of %d reads wrong", wrong, reads)
}

func TestMetricsExposition(t *testing.T) {
	ctx := testCtx(t)
	pg := appCluster(t, pgtest.AuthTrust, false)
	reg := prometheus.NewRegistry()
	// A full pool (MinPool = PoolSize): an Acquire that meets the
	// background loop's health check waits for it to put the idle
	// connections back instead of opening another one.
	p := newTestPool(t, PoolConfig{ConnString: pg.URL("app", "", "postgres"), PoolSize: 3, MinPool: 3}, NewMetrics(reg))
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	for _, tc := range []struct {
		name  string
		label []string
		want  float64
	}{
		{"pgquic_backend_connections", []string{"state", "idle"}, 2},
		{"pgquic_backend_connections", []string{"state", "in_use"}, 1},
		{"pgquic_backend_connections", []string{"state", "constructing"}, 0},
		{"pgquic_backend_connections_max", nil, 3},
		{"pgquic_backend_acquires_waiting", nil, 0},
		{"pgquic_backend_acquires_total", nil, 1},
		{"pgquic_backend_acquire_wait_seconds", nil, 1},
		{"pgquic_backend_connects_total", nil, 3},
		{"pgquic_backend_connect_errors_total", nil, 0},
	} {
		if got := metricValue(t, reg, tc.name, tc.label...); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.label, got, tc.want)
		}
	}
}

// metricValue gathers reg and returns the value of the series name with
// labels database="postgres", user="app" and the extra label pair, if any.
// Histograms report their sample count.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, label ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	want := map[string]string{"database": "postgres", "user": "app"}
	if len(label) == 2 {
		want[label[0]] = label[1]
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(want) {
				continue
			}
			for _, l := range m.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s with labels %v", name, want)
	return 0
}

func TestAcquireReleaseAllocs(t *testing.T) {
	ctx := testCtx(t)
	pg := appCluster(t, pgtest.AuthTrust, false)
	p := newTestPool(t, PoolConfig{ConnString: pg.URL("app", "", "postgres"), PoolSize: 1, MinPool: 1}, NewMetrics(nil))
	allocs := testing.AllocsPerRun(200, func() {
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c.Release()
	})
	t.Logf("Acquire+Release: %v allocations", allocs)
	if allocs > 0 {
		t.Errorf("Acquire+Release allocates %v times", allocs)
	}
}

func TestConcurrentAcquire(t *testing.T) {
	ctx := testCtx(t)
	pg := appCluster(t, pgtest.AuthTrust, false)
	p := newTestPool(t, PoolConfig{ConnString: pg.URL("app", "", "postgres"), PoolSize: 3, MinPool: 1}, NewMetrics(nil))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				c, err := p.Acquire(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if err := sendQuery(c, "SELECT 1"); err != nil {
					t.Error(err)
					c.Destroy()
					return
				}
				if _, err := readResult(c); err != nil {
					t.Error(err)
					c.Destroy()
					return
				}
				c.Release()
			}
		})
	}
	wg.Wait()
	if s := p.Stat(); s.Total > 3 || s.InUse != 0 {
		t.Fatalf("Stat = %+v", s)
	}
}

// BenchmarkAcquireRelease measures the hot path the pooler runs once per
// transaction: Acquire (with the socket peek) and Release of a warm
// connection.
func BenchmarkAcquireRelease(b *testing.B) {
	pg := pgtest.New(b, pgtest.Options{Users: []pgtest.User{{Name: "app"}}})
	p, err := NewPool(context.Background(), PoolConfig{ConnString: pg.URL("app", "", "postgres"), PoolSize: 1, MinPool: 1}, nil, NewMetrics(nil))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		c, err := p.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		c.Release()
	}
}
