package backend

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// seriesMatching counts the exported series of the backend metrics whose
// labels contain substr.
func seriesMatching(t *testing.T, reg *prometheus.Registry, substr string) int {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), substr) {
					n++
					break
				}
			}
		}
	}
	return n
}

// managerMetric returns the value of the series name whose label values are
// exactly values (none for an unlabelled series).
func managerMetric(t *testing.T, reg *prometheus.Registry, name string, values ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(values) {
				continue
			}
			for i, l := range m.GetLabel() {
				if l.GetValue() != values[i] {
					continue series
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, values)
	return 0
}

// waitGoroutines polls until at most n goroutines run.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want at most %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWildcardUnknownDatabasesNotKept names 200 databases that do not exist
// through a wildcard route, as a client can. Each login fails with 3D000;
// none of their pools, goroutines or metric series may stay behind.
func TestWildcardUnknownDatabasesNotKept(t *testing.T) {
	ctx := testCtx(t)
	pg := pgtest.New(t, pgtest.Options{Logger: testLogger(t)})
	reg := prometheus.NewRegistry()
	m, err := NewManager(ctx, ManagerConfig{
		Routes:   []Route{{Database: Wildcard, PoolConfig: PoolConfig{ConnString: pg.SuperURL("postgres")}}},
		Defaults: PoolConfig{MinPool: 2}, // what `pgquic serve` uses
	}, testLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	baseline := runtime.NumGoroutine()

	for i := range 200 {
		db := fmt.Sprintf("nope_%d", i)
		p, err := m.Pool(ctx, db, pg.SuperUser)
		if err != nil {
			t.Fatalf("Pool(%s): %v", db, err)
		}
		_, err = p.Acquire(ctx)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "3D000" {
			t.Fatalf("Acquire on %s: %v, want SQLSTATE 3D000", db, err)
		}
	}

	waitFor(t, time.Minute, "pools of unknown databases to go", func() bool { return len(m.Pools()) == 0 })
	waitGoroutines(t, baseline)
	if n := seriesMatching(t, reg, "nope_"); n != 0 {
		t.Errorf("%d metric series still name unknown databases, want 0", n)
	}

	// A real database through the same route still works and is kept.
	p, err := m.Pool(ctx, "postgres", pg.SuperUser)
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := query(t, c, "SELECT current_database()"); got[0] != "postgres" {
		t.Errorf("landed on %q", got[0])
	}
	c.Release()
	if n := len(m.Pools()); n != 1 {
		t.Errorf("%d pools after a good login, want 1", n)
	}
}

// TestWildcardIdlePoolsReaped checks that a wildcard pool nobody uses for
// PoolIdleTimeout is closed with its server connections and metric series,
// that a busy one is not, and that a session still holding a retired pool
// keeps working. Pools of named routes are kept.
func TestWildcardIdlePoolsReaped(t *testing.T) {
	ctx := testCtx(t)
	pg := pgtest.New(t, pgtest.Options{Logger: testLogger(t)})
	if err := pg.Exec(ctx, "CREATE DATABASE reapme"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	const idle = 300 * time.Millisecond
	m, err := NewManager(ctx, ManagerConfig{
		Routes: []Route{
			{Database: "postgres", PoolConfig: PoolConfig{ConnString: pg.SuperURL("postgres")}},
			{Database: Wildcard, PoolConfig: PoolConfig{ConnString: pg.SuperURL("postgres")}},
		},
		Defaults:        PoolConfig{MinPool: 1},
		PoolIdleTimeout: idle,
	}, testLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	backends := func() string {
		return superQuery(ctx, t, pg.SuperURL("postgres"), "SELECT count(*) FROM pg_stat_activity WHERE datname = 'reapme'")[0]
	}

	p, err := m.Pool(ctx, "reapme", pg.SuperUser)
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Held for several idle periods: in use, so never reaped.
	deadline := time.Now().Add(4 * idle)
	for time.Now().Before(deadline) {
		if got, _ := m.Pool(ctx, "reapme", pg.SuperUser); got != p {
			t.Fatal("a pool with a connection in use was retired")
		}
		time.Sleep(idle / 10)
	}
	c.Release()
	if seriesMatching(t, reg, "reapme") == 0 {
		t.Fatal("no metric series for the wildcard pool")
	}

	waitFor(t, time.Minute, "the idle wildcard pool to be retired", func() bool { return len(m.Pools()) == 1 })
	if m.Pools()[0].Database() != "postgres" {
		t.Fatalf("the named route's pool was retired, %s/%s kept", m.Pools()[0].Database(), m.Pools()[0].User())
	}
	waitFor(t, time.Minute, "server connections of the retired pool to close", func() bool { return backends() == "0" })
	if n := seriesMatching(t, reg, "reapme"); n != 0 {
		t.Errorf("%d series of the retired pool remain", n)
	}
	if v := managerMetric(t, reg, "pgquic_backend_pools_retired_total", "idle"); v != 1 {
		t.Errorf("pools_retired_total{reason=idle} = %v, want 1", v)
	}

	// A session that kept the retired pool still gets connections: from
	// the route's new pool.
	c, err = p.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire on a retired pool: %v", err)
	}
	if got := query(t, c, "SELECT current_database()"); got[0] != "reapme" {
		t.Errorf("landed on %q", got[0])
	}
	if c.Pool() == p {
		t.Error("a retired pool handed out its own connection")
	}
	c.Release()
	if n := len(m.Pools()); n != 2 {
		t.Errorf("%d pools, want the named one and the new wildcard one", n)
	}
}

// TestWildcardMaxPools checks that a wildcard route holds at most MaxPools
// pools and refuses further ones with ErrTooManyPools until one goes away.
func TestWildcardMaxPools(t *testing.T) {
	ctx := testCtx(t)
	pg := pgtest.New(t, pgtest.Options{Logger: testLogger(t)})
	for _, db := range []string{"one", "two", "three"} {
		if err := pg.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	m, err := NewManager(ctx, ManagerConfig{
		Routes:          []Route{{Database: Wildcard, PoolConfig: PoolConfig{ConnString: pg.SuperURL("postgres")}}},
		MaxPools:        2,
		PoolIdleTimeout: time.Hour,
	}, testLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	var held []*Conn
	for _, db := range []string{"one", "two"} {
		p, err := m.Pool(ctx, db, pg.SuperUser)
		if err != nil {
			t.Fatalf("Pool(%s): %v", db, err)
		}
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if _, err := m.Pool(ctx, "three", pg.SuperUser); !errors.Is(err, ErrTooManyPools) {
		t.Fatalf("third pool: %v, want ErrTooManyPools", err)
	}
	// Unknown databases are refused as well while the bound is reached.
	if _, err := m.Pool(ctx, "nope", pg.SuperUser); !errors.Is(err, ErrTooManyPools) {
		t.Fatalf("pool for an unknown database at the bound: %v, want ErrTooManyPools", err)
	}
	// Existing pools are still served.
	if _, err := m.Pool(ctx, "one", pg.SuperUser); err != nil {
		t.Fatalf("existing pool at the bound: %v", err)
	}
	if v := managerMetric(t, reg, "pgquic_backend_pools_refused_total"); v != 2 {
		t.Errorf("pools_refused_total = %v, want 2", v)
	}
	if v := managerMetric(t, reg, "pgquic_backend_pools", "wildcard"); v != 2 {
		t.Errorf("pools{route=wildcard} = %v, want 2", v)
	}
	for _, c := range held {
		c.Release()
	}
}

// TestWildcardRejectedLoginFreesSlot checks that a failed first login does
// not use up a MaxPools slot and that a rejected user (28000) is treated
// like an unknown database.
func TestWildcardRejectedLoginFreesSlot(t *testing.T) {
	ctx := testCtx(t)
	pg := pgtest.New(t, pgtest.Options{Logger: testLogger(t)})
	m, err := NewManager(ctx, ManagerConfig{
		Routes:   []Route{{Database: Wildcard, PoolConfig: PoolConfig{ConnString: pg.SuperURL("postgres")}}},
		MaxPools: 1,
	}, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i := range 5 {
		p, err := m.Pool(ctx, "postgres", fmt.Sprintf("ghost_%d", i))
		if err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		_, err = p.Acquire(ctx)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "28000" {
			t.Fatalf("Acquire as an unknown role: %v, want SQLSTATE 28000", err)
		}
		waitFor(t, time.Minute, "the rejected pool to go", func() bool { return len(m.Pools()) == 0 })
	}
	p, err := m.Pool(ctx, "postgres", pg.SuperUser)
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Release()
}

// TestWildcardRejectedConcurrent has many clients ask for the same unknown
// database at once, the way the pooler does (TryAcquire, then Acquire).
// The pool is retired by whichever login fails first; every client must
// still see the server's 3D000, not the cancellation of its own attempt.
func TestWildcardRejectedConcurrent(t *testing.T) {
	ctx := testCtx(t)
	pg := pgtest.New(t, pgtest.Options{Logger: testLogger(t)})
	m, err := NewManager(ctx, ManagerConfig{
		Routes:   []Route{{Database: Wildcard, PoolConfig: PoolConfig{ConnString: pg.SuperURL("postgres")}}},
		Defaults: PoolConfig{PoolSize: 4, MinPool: 2},
	}, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	errs := make(chan error, 40)
	for range cap(errs) {
		go func() {
			p, err := m.Pool(ctx, "nope", pg.SuperUser)
			if err != nil {
				errs <- err
				return
			}
			c, err := p.TryAcquire(ctx)
			if errors.Is(err, ErrNotAvailable) {
				c, err = p.Acquire(ctx)
			}
			if err == nil {
				c.Release()
			}
			errs <- err
		}()
	}
	for range cap(errs) {
		err := <-errs
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "3D000" {
			t.Errorf("client got %v, want SQLSTATE 3D000", err)
		}
	}
	waitFor(t, time.Minute, "the pool to go", func() bool { return len(m.Pools()) == 0 })
}

// TestWildcardPoolsStartEmptyAndDrain: min_pool is for configured pools. A
// wildcard pool starts with no connection and closes every connection idle
// for ServerIdleTimeout, so after a client touched template1 through the
// pooler, CREATE DATABASE ... TEMPLATE template1 works again while the
// Manager runs (PostgreSQL refuses it while anyone is connected to the
// template). A named route's pool keeps its MinPool.
func TestWildcardPoolsStartEmptyAndDrain(t *testing.T) {
	ctx := testCtx(t)
	pg := pgtest.New(t, pgtest.Options{Logger: testLogger(t)})
	const idle = 300 * time.Millisecond
	m, err := NewManager(ctx, ManagerConfig{
		Routes: []Route{
			{Database: "postgres", PoolConfig: PoolConfig{ConnString: pg.SuperURL("postgres")}},
			{Database: Wildcard, PoolConfig: PoolConfig{ConnString: pg.SuperURL("postgres")}},
		},
		Defaults:        PoolConfig{MinPool: 2, ServerIdleTimeout: idle},
		PoolIdleTimeout: time.Hour, // the pool itself stays: its connections must go
	}, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	backends := func(db string) string {
		return superQuery(ctx, t, pg.SuperURL("postgres"),
			"SELECT count(*) FROM pg_stat_activity WHERE datname = '"+db+"' AND pid <> pg_backend_pid()")[0]
	}

	p, err := m.Pool(ctx, "template1", pg.SuperUser)
	if err != nil {
		t.Fatal(err)
	}
	p.maintain() // a round of the background loop must not warm it either
	if st := p.Stat(); st.Total != 0 {
		t.Fatalf("a new wildcard pool holds %d connections, want 0 (min_pool is for configured pools)", st.Total)
	}
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := query(t, c, "SELECT current_database()"); got[0] != "template1" {
		t.Fatalf("landed in %q", got[0])
	}
	c.Release()
	p.maintain()
	// template1 is a template database, so the connection it used is
	// closed on release (template.go), which may or may not have ended by
	// now: what must not happen is a top-up to min_pool.
	if st := p.Stat(); st.Total > 1 {
		t.Fatalf("after one client the wildcard pool holds %d connections, want at most the 1 it used (not topped up to min_pool)", st.Total)
	}

	waitFor(t, time.Minute, "the idle template1 connection to close", func() bool { return backends("template1") == "0" })
	if err := pg.Exec(ctx, "CREATE DATABASE drained_copy TEMPLATE template1"); err != nil {
		t.Fatalf("CREATE DATABASE from template1 while the pooler runs: %v", err)
	}
	if n := len(m.Pools()); n != 2 {
		t.Errorf("%d pools, want the named one and the (empty) template1 one", n)
	}
	for _, q := range m.Pools() {
		if q.Database() == "postgres" {
			if st := q.Stat(); st.Total < 2 {
				t.Errorf("the named route's pool holds %d connections, want its min_pool 2", st.Total)
			}
		}
	}
}
