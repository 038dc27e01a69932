package pooler_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/pooler"
)

// Cross-client pipelining (pipeline.go), on a real server: many clients on
// few server connections, so their requests share connections.

const pipelinedMetric = "pgquic_pooler_pipelined_requests_total"

// pipeHarness is a pooler with a pool of poolSize warm connections and its
// own metrics registry. A threshold of 0 keeps the default.
func pipeHarness(t *testing.T, poolSize int, threshold time.Duration) (*harness, *prometheus.Registry) {
	t.Helper()
	return pipeHarnessVia(t, poolSize, threshold, "")
}

// pipeHarnessVia is pipeHarness reaching the server through backend, a
// connection string ("" for the cluster's own).
func pipeHarnessVia(t *testing.T, poolSize int, threshold time.Duration, backend string) (*harness, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := pooler.Config{PipelineFastThreshold: threshold}
	return newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: poolSize, minPool: poolSize, cfg: cfg, reg: reg, backend: backend}), reg
}

// TestPipelineNoCrosstalk runs 64 clients over 2 server connections in
// each query mode pgx has (named prepared statements, unnamed ones, simple
// protocol): every answer must be the client's own, and requests must have
// shared connections. The last case has 8 connections, where a connection
// lent while most of the pool is idle carries no lane (nearlyFull): lanes
// must still form once the pool fills.
func TestPipelineNoCrosstalk(t *testing.T) {
	for _, tc := range []struct {
		mode pgx.QueryExecMode
		pool int
	}{
		{pgx.QueryExecModeCacheStatement, 2},
		{pgx.QueryExecModeExec, 2},
		{pgx.QueryExecModeSimpleProtocol, 2},
		{pgx.QueryExecModeCacheStatement, 8},
	} {
		mode := tc.mode
		t.Run(fmt.Sprintf("%s/pool%d", mode, tc.pool), func(t *testing.T) {
			h, reg := pipeHarness(t, tc.pool, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const clients, rounds = 64, 40
			var wg sync.WaitGroup
			errs := make(chan error, clients)
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cfg, err := pgx.ParseConfig(h.url())
					if err != nil {
						errs <- err
						return
					}
					cfg.DefaultQueryExecMode = mode
					conn, err := pgx.ConnectConfig(ctx, cfg)
					if err != nil {
						errs <- err
						return
					}
					defer conn.Close(context.Background())
					for i := range rounds {
						want := fmt.Sprintf("client %d round %d", c, i)
						var got string
						var n int
						if err := conn.QueryRow(ctx, "SELECT $1::text, $2::int * 2", want, c*1000+i).Scan(&got, &n); err != nil {
							errs <- fmt.Errorf("client %d round %d: %w", c, i, err)
							return
						}
						if got != want || n != (c*1000+i)*2 {
							errs <- fmt.Errorf("client %d round %d: got %q, %d", c, i, got, n)
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
			if n := metricValue(t, reg, pipelinedMetric, ""); n == 0 {
				t.Errorf("no request was pipelined behind another client's")
			} else {
				t.Logf("%v of %d requests pipelined", n, clients*rounds)
			}
		})
	}
}

// TestPipelineErrorIsolation mixes failing and succeeding requests from
// different clients on one server connection: each failure ends only its
// own request.
func TestPipelineErrorIsolation(t *testing.T) {
	h, reg := pipeHarness(t, 1, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const clients, rounds = 16, 40
	var wg sync.WaitGroup
	var bad atomic.Int64
	errs := make(chan error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, h.url())
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.Background())
			for i := range rounds {
				var n int
				err := conn.QueryRow(ctx, "SELECT 100 / $1::int", (c+i)%2).Scan(&n)
				switch {
				case (c+i)%2 == 0:
					if pgCode(err) != "22012" {
						errs <- fmt.Errorf("client %d round %d: division by zero gave %v", c, i, err)
						return
					}
					bad.Add(1)
				case err != nil || n != 100:
					errs <- fmt.Errorf("client %d round %d: got %d, %v", c, i, n, err)
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
	if bad.Load() != clients*rounds/2 {
		t.Errorf("%d failures, want %d", bad.Load(), clients*rounds/2)
	}
	if metricValue(t, reg, pipelinedMetric, "") == 0 {
		t.Errorf("no request was pipelined")
	}
}

// TestPipelineNeverSharesOpenTransaction has one client open transactions
// in every spelling a lexer meets (comment first, lower case, inside a
// multi-statement Query, START TRANSACTION) and insert a row it then rolls
// back, while others hammer the same two server connections: if any of
// those requests had been pipelined ahead of or behind another client's,
// the other client would have run inside the open transaction and seen the
// row, or the connection would have been failed.
func TestPipelineNeverSharesOpenTransaction(t *testing.T) {
	h, reg := pipeHarness(t, 2, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	setup := h.connect(ctx, t)
	if _, err := setup.Exec(ctx, "DROP TABLE IF EXISTS pipe_open; CREATE TABLE pipe_open (v int)"); err != nil {
		t.Fatal(err)
	}
	begins := []string{
		"BEGIN; INSERT INTO pipe_open VALUES (1)",
		"/* note */ begin; insert into pipe_open values (1)",
		"-- line\nBeGiN ISOLATION LEVEL READ COMMITTED; INSERT INTO pipe_open VALUES (1)",
		"SELECT 1; START TRANSACTION; INSERT INTO pipe_open VALUES (1)",
		`SELECT 'BEGIN'; BEGIN; INSERT INTO "pipe_open" VALUES (1)`,
		"SELECT $$;$$; begin; insert into pipe_open values (1)",
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	var reads atomic.Int64
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, h.url())
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.Background())
			for {
				select {
				case <-stop:
					return
				default:
				}
				var n int
				if err := conn.QueryRow(ctx, "SELECT count(*) FROM pipe_open").Scan(&n); err != nil {
					errs <- fmt.Errorf("reader: %w", err)
					return
				}
				if n != 0 {
					errs <- fmt.Errorf("a reader saw %d uncommitted rows", n)
					return
				}
				reads.Add(1)
			}
		}()
	}
	writer := h.connect(ctx, t)
	for round := range 5 {
		for _, q := range begins {
			if _, err := writer.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatalf("round %d %q: %v", round, q, err)
			}
			if _, err := writer.Exec(ctx, "SELECT count(*) FROM pipe_open", pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatalf("inside the transaction: %v", err)
			}
			if _, err := writer.Exec(ctx, "ROLLBACK"); err != nil {
				t.Fatalf("rollback: %v", err)
			}
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if reads.Load() == 0 {
		t.Fatal("the readers read nothing")
	}
	if metricValue(t, reg, pipelinedMetric, "") == 0 {
		t.Errorf("the readers' requests were never pipelined, so the test proves nothing")
	}
}

// warm runs q enough times for its kind of query to count as known.
func warm(ctx context.Context, t *testing.T, conn *pgconn.PgConn, q string) {
	t.Helper()
	for range 6 {
		if _, err := conn.Exec(ctx, q).ReadAll(); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// warmClient connects a client to h that has run q enough times for its
// kind of query to be known; the context ends with the test.
func warmClient(t *testing.T, h *harness, q string) (context.Context, *pgconn.PgConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	w, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	warm(ctx, t, w, q)
	return ctx, w
}

// waitRunning waits until the server runs the sleeper query tagged tag, so
// requests started next queue behind it.
func waitRunning(ctx context.Context, t *testing.T, h *harness, tag string) {
	t.Helper()
	waitRunningLike(ctx, t, h, "%pg_sleep(%), '"+tag+"'")
}

// waitRunningLike waits until a query LIKE want is active on the server.
func waitRunningLike(ctx context.Context, t *testing.T, h *harness, want string) {
	t.Helper()
	direct, err := pgx.Connect(ctx, h.cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE state = 'active' AND query LIKE $1`, want).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no query like %q ran", want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sleeper runs one pg_sleep query on its own client in the background.
type sleeper struct {
	conn *pgconn.PgConn
	done chan error
}

func startSleeper(ctx context.Context, t *testing.T, h *harness, tag string, secs float64) *sleeper {
	t.Helper()
	conn, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	s := &sleeper{conn: conn, done: make(chan error, 1)}
	go func() {
		_, err := conn.Exec(ctx, fmt.Sprintf("SELECT pg_sleep(%g), '%s'", secs, tag)).ReadAll()
		s.done <- err
	}()
	return s
}

// TestPipelineCancelHitsOnlyItsOwnQuery queues requests behind a running
// one on the only server connection and cancels them: a cancel stops the
// request it is for, whether it runs first on the connection or waits
// behind others (then it is sent once its turn comes), and never holds up
// the requests behind it. PostgreSQL's postmaster turns a CancelRequest
// into two signals (the process and its group), and the second may come
// after the first has ended the query and stop the request behind, another
// client's: so on a shared connection the pooler cancels with one signal
// (pg_cancel_backend, backend.Pool.CancelOnce). The server is reached through
// a proxy that would make any CancelRequest's second signal come 100 ms late;
// the requests behind must all succeed, and no CancelRequest may pass for a
// request with others behind it.
func TestPipelineCancelHitsOnlyItsOwnQuery(t *testing.T) {
	c := sharedCluster(t)
	px := startLateCancelProxy(t, c, 100*time.Millisecond)
	h, reg := pipeHarnessVia(t, 1, 10*time.Second, px.backend)
	ctx, _ := warmClient(t, h, "SELECT pg_sleep(0), 'warm'")
	behindOK := func(t *testing.T, name string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s, behind the cancelled request: %v", name, err)
		}
	}
	// noCancelRequest fails unless the subtest's cancel went without a
	// CancelRequest: it had other clients' requests behind it.
	noCancelRequest := func(t *testing.T, base int32) {
		t.Helper()
		if n := px.sent.Load() - base; n != 0 {
			t.Errorf("%d CancelRequests reached the server for a request with others behind it, want 0", n)
		}
	}

	t.Run("queued alone", func(t *testing.T) {
		sent := px.sent.Load()
		base := metricValue(t, reg, pipelinedMetric, "")
		a := startSleeper(ctx, t, h, "a", 0.6)
		waitRunning(ctx, t, h, "a")
		b := startSleeper(ctx, t, h, "b", 5)
		waitMetric(t, reg, pipelinedMetric, base+1)
		if err := b.conn.CancelRequest(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-a.done; err != nil {
			t.Errorf("the request ahead was hit: %v", err)
		}
		if err := <-b.done; pgCode(err) != "57014" {
			t.Errorf("the cancelled request: %v, want 57014 once its turn came", err)
		}
		// Alone on the connection by then, b was cancelled with a
		// CancelRequest (the lane takes no one until it leaves, which
		// waits for the cancel): wait for its late second signal too.
		pollUntil(t, 10*time.Second, "the CancelRequest and its second signal", func() bool { return px.sent.Load() == sent+2 })
	})
	t.Run("queued with one behind", func(t *testing.T) {
		defer noCancelRequest(t, px.sent.Load())
		base := metricValue(t, reg, pipelinedMetric, "")
		a := startSleeper(ctx, t, h, "a", 0.6)
		waitRunning(ctx, t, h, "a")
		b := startSleeper(ctx, t, h, "b", 5)
		waitMetric(t, reg, pipelinedMetric, base+1)
		c := startSleeper(ctx, t, h, "c", 0.2)
		waitMetric(t, reg, pipelinedMetric, base+2)
		start := time.Now()
		if err := b.conn.CancelRequest(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-a.done; err != nil {
			t.Errorf("the request ahead was hit: %v", err)
		}
		if err := <-b.done; pgCode(err) != "57014" || strings.Contains(err.Error(), "another client") {
			t.Errorf("the cancelled request with another behind it: %v, want its own 57014", err)
		}
		behindOK(t, "c", <-c.done)
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("b's cancel took %v: b ran its whole sleep", d)
		}
	})
	t.Run("running", func(t *testing.T) {
		defer noCancelRequest(t, px.sent.Load())
		base := metricValue(t, reg, pipelinedMetric, "")
		a := startSleeper(ctx, t, h, "a", 4)
		waitRunning(ctx, t, h, "a")
		b := startSleeper(ctx, t, h, "b", 0.2)
		waitMetric(t, reg, pipelinedMetric, base+1)
		start := time.Now()
		onceBefore := px.onceTotal.Load()
		// A careless client repeats its CancelRequest: five at once. A
		// second one-signal cancel could come after the first ended a's
		// query and stop b, and each costs the server a session: only
		// one may be sent.
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() {
				if err := a.conn.CancelRequest(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if err := <-a.done; pgCode(err) != "57014" || strings.Contains(err.Error(), "another client") {
			t.Errorf("a, cancelled with b behind it: %v, want its own 57014", err)
		}
		if n := px.onceTotal.Load() - onceBefore; n != 1 {
			t.Errorf("%d one-signal cancel sessions for a's five CancelRequests, want 1", n)
		}
		behindOK(t, "b", <-b.done)
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("a's cancel and b took %v: the cancel was held back", d)
		}
	})
}

// TestPipelineBackendKilled terminates the server process under a
// connection three clients share: each of them fails, the one reading with
// the server's own FATAL, the others with 08006, and nobody else does.
func TestPipelineBackendKilled(t *testing.T) {
	h, reg := pipeHarness(t, 1, 10*time.Second)
	ctx, w := warmClient(t, h, "SELECT pg_sleep(0), 'warm'")
	base := metricValue(t, reg, pipelinedMetric, "")
	a := startSleeper(ctx, t, h, "a", 5)
	waitRunning(ctx, t, h, "a")
	b := startSleeper(ctx, t, h, "b", 0)
	c := startSleeper(ctx, t, h, "c", 0)
	waitMetric(t, reg, pipelinedMetric, base+2)

	direct, err := pgx.Connect(ctx, h.cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	var killed bool
	if err := direct.QueryRow(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE query LIKE '%pg_sleep(5), ''a''%' AND pid <> pg_backend_pid()`).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate: %v %v", killed, err)
	}
	if err := <-a.done; pgCode(err) != "57P01" {
		t.Errorf("a (reading): %v, want the server's 57P01", err)
	}
	for name, s := range map[string]*sleeper{"b": b, "c": c} {
		err := <-s.done
		if pgCode(err) != "08006" && !strings.Contains(fmt.Sprint(err), "08006") {
			t.Errorf("%s (queued behind): %v, want 08006", name, err)
		}
	}
	// The client that shared nothing goes on, on a new server connection.
	if _, err := w.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Errorf("a client not on the connection: %v", err)
	}
	var pe *pgconn.PgError
	if err := <-startSleeper(ctx, t, h, "d", 0).done; err != nil && !errors.As(err, &pe) {
		t.Errorf("a new client: %v", err)
	}
}

// TestPipelineClientVanishes closes clients whose requests wait behind
// another on the only server connection (pgconn sends a cancel first): the
// request ahead and a later client are unaffected, and the connection goes
// back to the pool idle.
func TestPipelineClientVanishes(t *testing.T) {
	h, reg := pipeHarness(t, 1, 10*time.Second)
	ctx, w := warmClient(t, h, "SELECT pg_sleep(0), 'warm'")
	base := metricValue(t, reg, pipelinedMetric, "")
	a := startSleeper(ctx, t, h, "a", 0.5)
	waitRunning(ctx, t, h, "a")
	var bs []*sleeper
	for i := range 3 {
		bs = append(bs, startSleeper(ctx, t, h, "b", 0.1))
		waitMetric(t, reg, pipelinedMetric, base+float64(i+1))
	}
	for _, b := range bs {
		_ = b.conn.Conn().Close() // gone without a Terminate
	}
	if err := <-a.done; err != nil {
		t.Errorf("the request ahead: %v", err)
	}
	for range 5 {
		if _, err := w.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
			t.Fatalf("a client after the others left: %v", err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pools := h.mgr.Pools()
		var st backend.Stats
		if len(pools) == 1 {
			st = pools[0].Stat()
		}
		if st.Idle == 1 && st.Total == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server connection did not come back idle: %d pools, %+v", len(pools), st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPipelineWhenFast: in neither mode is a request written behind
// another client's while a server connection is idle (a free connection
// is always taken first), and every answer is the client's own.
func TestPipelineWhenFast(t *testing.T) {
	for _, busyOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("busy-only=%v", busyOnly), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			cfg := pooler.Config{PipelineBusyOnly: busyOnly, PipelineFastThreshold: time.Second}
			h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 8, minPool: 8, cfg: cfg, reg: reg})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const clients, rounds = 6, 60
			var wg sync.WaitGroup
			errs := make(chan error, clients)
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					conn, err := pgconn.Connect(ctx, h.url())
					if err != nil {
						errs <- err
						return
					}
					defer conn.Close(context.Background())
					for i := range rounds {
						want := fmt.Sprintf("%d-%d", c, i)
						res, err := conn.Exec(ctx, "SELECT '"+want+"'").ReadAll()
						if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != want {
							errs <- fmt.Errorf("client %d round %d: %v %v", c, i, res, err)
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
			// Six clients never exhaust eight connections.
			if n := metricValue(t, reg, pipelinedMetric, ""); n != 0 {
				t.Errorf("%v requests pipelined while connections were free", n)
			}
		})
	}
}

// TestPipelineNotBehindSlowQueries: a kind of query the server answers
// slowly never has another client's request written behind it; the other
// client waits for a free connection instead, as without pipelining.
func TestPipelineNotBehindSlowQueries(t *testing.T) {
	h, reg := pipeHarness(t, 1, 0)                              // the default threshold, 5 ms
	ctx, w := warmClient(t, h, "SELECT pg_sleep(0.02), 'warm'") // 20 ms each: known slow
	warm(ctx, t, w, "SELECT 1")                                 // known fast
	base := metricValue(t, reg, pipelinedMetric, "")
	a := startSleeper(ctx, t, h, "a", 0.5)
	waitRunning(ctx, t, h, "a")
	start := time.Now()
	if _, err := w.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if err := <-a.done; err != nil {
		t.Fatal(err)
	}
	if got := metricValue(t, reg, pipelinedMetric, ""); got != base {
		t.Errorf("%v requests pipelined behind a slow query", got-base)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("the fast query was answered after %v, while the slow one held the only connection", d)
	}
}

// TestPipelineNotBehindSlowUnnamed is TestPipelineNotBehindSlowQueries over
// the extended protocol's unnamed statement (pgconn.ExecParams, as pgx's
// exec mode and psycopg send): each unnamed statement counts as its own
// text's kind of query, so a slow one never passes for the fast one the
// client ran before.
func TestPipelineNotBehindSlowUnnamed(t *testing.T) {
	h, reg := pipeHarness(t, 1, 0) // the default threshold, 5 ms
	ctx, w := warmClient(t, h, "SELECT 'warm'")
	execParams := func(conn *pgconn.PgConn, q string) error {
		return conn.ExecParams(ctx, q, nil, nil, nil, nil).Read().Err
	}
	for range 6 { // the fast kind, known
		if err := execParams(w, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	base := metricValue(t, reg, pipelinedMetric, "")
	slow, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slow.Close(context.Background()) })
	done := make(chan error, 1)
	go func() { done <- execParams(slow, "SELECT pg_sleep(0.5), 'a'") }()
	waitRunning(ctx, t, h, "a")
	start := time.Now()
	if err := execParams(w, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := metricValue(t, reg, pipelinedMetric, ""); got != base {
		t.Errorf("%v requests pipelined behind an unnamed slow query", got-base)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("the fast query was answered after %v, while the slow one held the only connection", d)
	}
}

// TestPipelineSetDoesNotLeak: one client SETs search_path to a schema with
// its own table t while others, pipelined on the same two connections,
// read the public t: each client only ever reads its own t.
func TestPipelineSetDoesNotLeak(t *testing.T) {
	h, reg := pipeHarness(t, 2, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	setup := h.connect(ctx, t)
	if _, err := setup.Exec(ctx, `DROP SCHEMA IF EXISTS pipe_x CASCADE; DROP TABLE IF EXISTS pipe_t;
		CREATE SCHEMA pipe_x; CREATE TABLE pipe_x.pipe_t (v text); INSERT INTO pipe_x.pipe_t VALUES ('x');
		CREATE TABLE public.pipe_t (v text); INSERT INTO public.pipe_t VALUES ('public')`); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	read := func(conn *pgx.Conn, want string) error {
		var v string
		if err := conn.QueryRow(ctx, "SELECT v FROM pipe_t").Scan(&v); err != nil {
			return err
		}
		if v != want {
			return fmt.Errorf("read %q, want %q", v, want)
		}
		return nil
	}
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, h.url())
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.Background())
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := read(conn, "public"); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	x := h.connect(ctx, t)
	if _, err := x.Exec(ctx, "SET search_path = pipe_x"); err != nil {
		t.Fatal(err)
	}
	for range 200 {
		if err := read(x, "x"); err != nil {
			t.Errorf("the client that SET search_path: %v", err)
			break
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if metricValue(t, reg, pipelinedMetric, "") == 0 {
		t.Errorf("nothing was pipelined, so the test proves nothing")
	}
}
