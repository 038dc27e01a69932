package pooler_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// connectWith opens a pgx connection to the pooler after letting edit adjust
// its configuration, and closes it at test end.
func (h *harness) connectWith(ctx context.Context, t testing.TB, edit func(*pgx.ConnConfig)) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(h.url())
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect through pooler: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// inUse sums the server connections currently lent out across all pools.
func (h *harness) inUse() int {
	n := 0
	for _, p := range h.mgr.Pools() {
		n += p.Stat().InUse
	}
	return n
}

// waitNoneInUse waits until no server connection is lent out.
func (h *harness) waitNoneInUse(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for h.inUse() != 0 {
		if time.Now().After(deadline) {
			for _, p := range h.mgr.Pools() {
				t.Logf("pool stats: %+v", p.Stat())
			}
			t.Fatalf("server connections still in use after 15s: %d", h.inUse())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// direct connects to PostgreSQL itself, bypassing the pooler.
func direct(ctx context.Context, t testing.TB, c *pgtest.Cluster) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, c.SuperURL("postgres"))
	if err != nil {
		t.Fatalf("direct connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// hammer runs n clients doing short transactions until stop is closed. It
// returns a function that stops them and reports their first error.
func hammer(ctx context.Context, t testing.TB, h *harness, n int) (stop func() error) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := range n {
		conn := h.connect(ctx, t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				select {
				case <-done:
					return
				default:
				}
				var got string
				want := fmt.Sprintf("hammer-%d-%d", i, j)
				err := conn.QueryRow(ctx, "select $1::text", want).Scan(&got)
				if err == nil && got != want {
					err = fmt.Errorf("hammer %d got %q want %q", i, got, want)
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	return func() error {
		close(done)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return first
	}
}

// TestConcurrentClientsNoCrosstalk runs 64 pgx clients in the default
// statement-cache mode over 8 server connections; every value must come back
// to the client that sent it.
func TestConcurrentClientsNoCrosstalk(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 8})
	ctx := testCtx(t, 2*time.Minute)
	const clients, iters = 64, 200
	conns := make([]*pgx.Conn, clients)
	for i := range conns {
		conns[i] = h.connect(ctx, t)
	}
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range iters {
				want := fmt.Sprintf("client-%d-iter-%d", i, j)
				var got string
				var n int
				if err := conn.QueryRow(ctx, "select $1::text, $2::int * 2", want, j).Scan(&got, &n); err != nil {
					errs <- fmt.Errorf("client %d iter %d: %w", i, j, err)
					return
				}
				if got != want || n != 2*j {
					errs <- fmt.Errorf("client %d iter %d: crosstalk: got (%q, %d) want (%q, %d)", i, j, got, n, want, 2*j)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	h.waitNoneInUse(t)
}

// TestTransactionPinsBackend checks that every statement of a transaction
// runs on one server connection while other clients churn the pool.
func TestTransactionPinsBackend(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 4})
	ctx := testCtx(t, 2*time.Minute)
	stop := hammer(ctx, t, h, 6)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for c := range 4 {
		conn := h.connect(ctx, t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				tx, err := conn.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				var first int32
				for k := range 5 {
					var pid int32
					if err := tx.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
						errs <- fmt.Errorf("client %d tx %d stmt %d: %w", c, i, k, err)
						_ = tx.Rollback(ctx)
						return
					}
					if k == 0 {
						first = pid
					} else if pid != first {
						errs <- fmt.Errorf("client %d tx %d: backend changed inside a transaction: %d then %d", c, i, first, pid)
					}
				}
				if err := tx.Commit(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := stop(); err != nil {
		t.Errorf("hammer: %v", err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestErrorInsideTransaction checks that a failed transaction reports 25P02
// for every statement until ROLLBACK, in the simple and extended protocols.
func TestErrorInsideTransaction(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2})
	ctx := testCtx(t, time.Minute)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			conn := h.connectWith(ctx, t, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = mode })
			stop := hammer(ctx, t, h, 2)
			defer func() {
				if err := stop(); err != nil {
					t.Errorf("hammer: %v", err)
				}
			}()
			if _, err := conn.Exec(ctx, "begin"); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "select 1/0"); pgCode(err) != "22012" {
				t.Fatalf("division by zero: got %v", err)
			}
			for i := range 4 {
				var n int
				err := conn.QueryRow(ctx, "select $1::int", i).Scan(&n)
				if pgCode(err) != "25P02" {
					t.Fatalf("statement %d in failed transaction: got %v, want 25P02", i, err)
				}
			}
			if _, err := conn.Exec(ctx, "rollback"); err != nil {
				t.Fatalf("rollback: %v", err)
			}
			var n int
			if err := conn.QueryRow(ctx, "select $1::int + 1", 41).Scan(&n); err != nil || n != 42 {
				t.Fatalf("after rollback: %d, %v", n, err)
			}
			if pc := conn.PgConn(); pc.TxStatus() != 'I' {
				t.Fatalf("tx status after rollback = %c", pc.TxStatus())
			}
		})
	}
	h.waitNoneInUse(t)
}

// TestNamedPreparedStatements exercises a protocol-level named statement
// across 200+ transactions that land on different server connections, and
// Close, DEALLOCATE and duplicate Parse.
func TestNamedPreparedStatements(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 3})
	ctx := testCtx(t, 2*time.Minute)
	conn := h.connect(ctx, t).PgConn()
	// blocker takes the server connection conn used last (the pool hands
	// out the most recently released one), forcing conn onto another one.
	blocker := h.connect(ctx, t).PgConn()
	stop := hammer(ctx, t, h, 2)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("hammer: %v", err)
		}
	}()

	exec := func(t *testing.T, sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if _, err := conn.Prepare(ctx, "mystmt", "select pg_backend_pid(), $1::int + 1", nil); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	pids := map[string]bool{}
	for i := range 220 {
		if i%3 == 0 {
			if _, err := blocker.Exec(ctx, "begin; select 1").ReadAll(); err != nil {
				t.Fatalf("blocker begin: %v", err)
			}
		}
		exec(t, "begin")
		res := conn.ExecPrepared(ctx, "mystmt", [][]byte{[]byte(strconv.Itoa(i))}, nil, nil).Read()
		if res.Err != nil {
			t.Fatalf("tx %d: ExecPrepared: %v", i, res.Err)
		}
		if len(res.Rows) != 1 || string(res.Rows[0][1]) != strconv.Itoa(i+1) {
			t.Fatalf("tx %d: got rows %q", i, res.Rows)
		}
		pids[string(res.Rows[0][0])] = true
		exec(t, "commit")
		if i%3 == 0 {
			if _, err := blocker.Exec(ctx, "commit").ReadAll(); err != nil {
				t.Fatalf("blocker commit: %v", err)
			}
		}
	}
	if len(pids) < 2 {
		t.Errorf("statement only ever ran on %d server connection(s); the test meant to move it", len(pids))
	}
	t.Logf("mystmt ran on %d server connections", len(pids))

	// Also outside explicit transactions (one implicit transaction each).
	for i := range 20 {
		res := conn.ExecPrepared(ctx, "mystmt", [][]byte{[]byte(strconv.Itoa(i))}, nil, nil).Read()
		if res.Err != nil {
			t.Fatalf("implicit tx %d: %v", i, res.Err)
		}
	}

	// Preparing the same name again is an error, and the session survives.
	_, err := conn.Prepare(ctx, "mystmt", "select 2", nil)
	if pgCode(err) != "42P05" {
		t.Fatalf("duplicate prepare: got %v, want 42P05", err)
	}
	exec(t, "select 1")

	// Close (protocol) then prepare the name with another query.
	if err := conn.Deallocate(ctx, "mystmt"); err != nil {
		t.Fatalf("deallocate (Close message): %v", err)
	}
	if _, err := conn.Prepare(ctx, "mystmt", "select $1::text || '-v2'", nil); err != nil {
		t.Fatalf("re-prepare after Close: %v", err)
	}
	for i := range 10 {
		res := conn.ExecPrepared(ctx, "mystmt", [][]byte{[]byte("x" + strconv.Itoa(i))}, nil, nil).Read()
		if res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != "x"+strconv.Itoa(i)+"-v2" {
			t.Fatalf("v2 exec %d: %q %v", i, res.Rows, res.Err)
		}
	}

	// DEALLOCATE in SQL through the simple protocol, then prepare again.
	exec(t, "DEALLOCATE mystmt")
	res := conn.ExecPrepared(ctx, "mystmt", [][]byte{[]byte("1")}, nil, nil).Read()
	if pgCode(res.Err) != "26000" {
		t.Fatalf("exec after DEALLOCATE: got %v, want 26000 (no such statement)", res.Err)
	}
	if _, err := conn.Prepare(ctx, "mystmt", "select $1::int * 10", nil); err != nil {
		t.Fatalf("re-prepare after DEALLOCATE: %v", err)
	}
	res = conn.ExecPrepared(ctx, "mystmt", [][]byte{[]byte("7")}, nil, nil).Read()
	if res.Err != nil || string(res.Rows[0][0]) != "70" {
		t.Fatalf("v3 exec: %q %v", res.Rows, res.Err)
	}
	exec(t, "DEALLOCATE ALL")

	// A Parse the server rejects creates no statement: the name stays free,
	// as it does on PostgreSQL.
	if _, err := conn.Prepare(ctx, "badstmt", "selec 1", nil); pgCode(err) != "42601" {
		t.Fatalf("prepare with syntax error: got %v, want 42601", err)
	}
	if _, err := conn.Prepare(ctx, "badstmt", "select 1", nil); err != nil {
		t.Fatalf("prepare after a failed prepare of the same name: %v", err)
	}
	if _, err := conn.Prepare(ctx, "mystmt", "select 3", nil); err != nil {
		t.Fatalf("re-prepare after DEALLOCATE ALL: %v", err)
	}
}

// TestExecModes runs every pgx query execution mode concurrently through the
// pooler.
func TestExecModes(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 4})
	ctx := testCtx(t, 2*time.Minute)
	modes := []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec,
		pgx.QueryExecModeSimpleProtocol,
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for _, mode := range modes {
		for c := range 3 {
			conn := h.connectWith(ctx, t, func(cfg *pgx.ConnConfig) { cfg.DefaultQueryExecMode = mode })
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 60 {
					want := fmt.Sprintf("%s/%d/%d", mode, c, i)
					var got string
					var sum int64
					// A handful of distinct statements so caches get reused.
					sql := fmt.Sprintf("select $1::text, $2::bigint + %d", i%5)
					if err := conn.QueryRow(ctx, sql, want, int64(i)).Scan(&got, &sum); err != nil {
						errs <- fmt.Errorf("%s client %d iter %d: %w", mode, c, i, err)
						return
					}
					if got != want || sum != int64(i+i%5) {
						errs <- fmt.Errorf("%s client %d iter %d: got (%q,%d)", mode, c, i, got, sum)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestStatementCacheEviction is pgx's PgBouncer eviction scenario: a small
// client cache over many distinct statements, so pgx keeps closing and
// re-preparing statements through the pooler.
func TestStatementCacheEviction(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2})
	ctx := testCtx(t, 2*time.Minute)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe} {
		t.Run(mode.String(), func(t *testing.T) {
			conn := h.connectWith(ctx, t, func(c *pgx.ConnConfig) {
				c.DefaultQueryExecMode = mode
				c.StatementCacheCapacity = 8
				c.DescriptionCacheCapacity = 8
			})
			other := h.connect(ctx, t)
			for round := range 2 {
				for i := range 200 {
					var n int
					sql := fmt.Sprintf("select $1::int + %d", i)
					if err := conn.QueryRow(ctx, sql, round).Scan(&n); err != nil {
						t.Fatalf("round %d stmt %d: %v", round, i, err)
					}
					if n != round+i {
						t.Fatalf("round %d stmt %d: got %d", round, i, n)
					}
					if i%10 == 0 { // move the next transactions around
						if _, err := other.Exec(ctx, "select 1"); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
		})
	}
}

// TestBatchAndPipeline sends a 50-query pgx batch and a pgconn pipeline with
// several syncs through the pooler.
func TestBatchAndPipeline(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2})
	ctx := testCtx(t, time.Minute)
	stop := hammer(ctx, t, h, 2)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("hammer: %v", err)
		}
	}()

	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run("batch/"+mode.String(), func(t *testing.T) {
			conn := h.connectWith(ctx, t, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = mode })
			for round := range 3 {
				b := &pgx.Batch{}
				for i := range 50 {
					b.Queue(fmt.Sprintf("select $1::int * %d", i%7), round*100+i)
				}
				br := conn.SendBatch(ctx, b)
				for i := range 50 {
					var n int
					if err := br.QueryRow().Scan(&n); err != nil {
						t.Fatalf("round %d query %d: %v", round, i, err)
					}
					if n != (round*100+i)*(i%7) {
						t.Fatalf("round %d query %d: got %d", round, i, n)
					}
				}
				if err := br.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}

	t.Run("pipeline", func(t *testing.T) {
		pc := h.connect(ctx, t).PgConn()
		p := pc.StartPipeline(ctx)
		p.SendPrepare("pipe_s", "select $1::text || '!'", nil)
		p.SendQueryPrepared("pipe_s", [][]byte{[]byte("a")}, nil, nil)
		p.SendPipelineSync()
		p.SendQueryParams("select $1::int + 1", [][]byte{[]byte("1")}, nil, nil, nil)
		p.SendQueryPrepared("pipe_s", [][]byte{[]byte("b")}, nil, nil)
		p.SendPipelineSync()
		p.SendQueryParams("select 1/0", nil, nil, nil, nil)
		p.SendQueryParams("select 2", nil, nil, nil, nil) // skipped by the server after the error
		p.SendPipelineSync()
		p.SendQueryPrepared("pipe_s", [][]byte{[]byte("c")}, nil, nil)
		p.SendPipelineSync()
		if err := p.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		syncs := 0
		for syncs < 4 {
			r, err := p.GetResults()
			if err != nil {
				got = append(got, "err:"+pgCode(err))
				continue
			}
			switch v := r.(type) {
			case *pgconn.StatementDescription:
				got = append(got, "prepared")
			case *pgconn.ResultReader:
				res := v.Read()
				if res.Err != nil {
					got = append(got, "err:"+pgCode(res.Err))
				} else {
					got = append(got, string(res.Rows[0][0]))
				}
			case *pgconn.PipelineSync:
				got = append(got, "sync")
				syncs++
			default:
				t.Fatalf("unexpected pipeline result %T", r)
			}
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		want := "prepared a! sync 2 b! sync err:22012 sync c! sync"
		if g := strings.Join(got, " "); g != want {
			t.Fatalf("pipeline results:\n got %s\nwant %s", g, want)
		}
		if res := pc.ExecParams(ctx, "select 5", nil, nil, nil, nil).Read(); res.Err != nil {
			t.Fatal(res.Err)
		}
	})
}

// TestParameterTracking gives two clients different startup parameters and
// one server connection: each must see its own values on every transaction.
func TestParameterTracking(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	a := h.connectWith(ctx, t, func(c *pgx.ConnConfig) {
		c.RuntimeParams["application_name"] = "aaa"
		c.RuntimeParams["TimeZone"] = "UTC"
	})
	b := h.connectWith(ctx, t, func(c *pgx.ConnConfig) {
		c.RuntimeParams["TimeZone"] = "America/New_York"
		c.RuntimeParams["search_path"] = "pg_catalog, public"
	})
	check := func(conn *pgx.Conn, who, tz, app string) error {
		var gotTZ, gotApp, gotPID string
		err := conn.QueryRow(ctx, "select current_setting('TimeZone'), current_setting('application_name'), pg_backend_pid()::text").Scan(&gotTZ, &gotApp, &gotPID)
		if err != nil {
			return fmt.Errorf("%s: %w", who, err)
		}
		if gotTZ != tz || gotApp != app {
			return fmt.Errorf("%s on backend %s: TimeZone=%q application_name=%q, want %q %q", who, gotPID, gotTZ, gotApp, tz, app)
		}
		return nil
	}
	for i := range 20 {
		if err := check(a, "A", "UTC", "aaa"); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if err := check(b, "B", "America/New_York", ""); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	// A SET by one client follows it and does not leak to the other.
	if _, err := b.Exec(ctx, "set application_name = 'bbb'"); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := check(a, "A", "UTC", "aaa"); err != nil {
			t.Fatalf("after SET round %d: %v", i, err)
		}
		if err := check(b, "B", "America/New_York", "bbb"); err != nil {
			t.Fatalf("after SET round %d: %v", i, err)
		}
	}
	// A SET undone by ROLLBACK, and a SET LOCAL, leave the client's value.
	for _, sqls := range [][]string{
		{"begin", "set application_name = 'rolled_back'", "rollback"},
		{"begin", "set local application_name = 'local'", "commit"},
	} {
		for _, sql := range sqls {
			if _, err := a.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		if err := check(b, "B", "America/New_York", "bbb"); err != nil {
			t.Fatal(err)
		}
		if err := check(a, "A", "UTC", "aaa"); err != nil {
			t.Fatalf("after %v: %v", sqls, err)
		}
	}
	// Timestamps render in the client's zone.
	var sa, sb string
	if err := a.QueryRow(ctx, "select '2024-01-01 12:00:00+00'::timestamptz::text").Scan(&sa); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, "select '2024-01-01 12:00:00+00'::timestamptz::text").Scan(&sb); err != nil {
		t.Fatal(err)
	}
	if sa != "2024-01-01 12:00:00+00" || sb != "2024-01-01 07:00:00-05" {
		t.Fatalf("timestamptz text: A %q, B %q", sa, sb)
	}
	// A parameter the server does not report follows its client too; a
	// list-valued one must keep its list meaning (as in the startup packet).
	var pa, pb string
	if err := a.QueryRow(ctx, "show search_path").Scan(&pa); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, "show search_path").Scan(&pb); err != nil {
		t.Fatal(err)
	}
	if pa != `"$user", public` || pb != "pg_catalog, public" {
		t.Fatalf("search_path: A %q, B %q", pa, pb)
	}
}
