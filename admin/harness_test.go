package admin_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/admin"
	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/pooler"
)

// harness is the shared PostgreSQL behind an in-process pooler with the
// admin console, served on a loopback TCP listener.
type harness struct {
	t        testing.TB
	mgr      *backend.Manager
	pooler   *pooler.Pooler
	ln       net.Listener
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	shutdown chan struct{} // closed by SHUTDOWN
	once     sync.Once
}

func newHarness(t testing.TB, poolSize int) *harness {
	t.Helper()
	c := shared.Get(t)
	ctx, cancel := context.WithCancel(context.Background())
	reg := prometheus.NewRegistry() // SHOW STATS reads the pools' duration histograms
	mgr, err := backend.NewManager(ctx, backend.ManagerConfig{
		Routes:   []backend.Route{{Database: "*", PoolConfig: backend.PoolConfig{ConnString: c.SuperURL("postgres")}}},
		Defaults: backend.PoolConfig{PoolSize: poolSize},
	}, nil, reg)
	if err != nil {
		cancel()
		t.Fatalf("backend.NewManager: %v", err)
	}
	p, err := pooler.New(pooler.Config{AcquireTimeout: time.Minute}, mgr, nil, reg)
	if err != nil {
		cancel()
		t.Fatalf("pooler.New: %v", err)
	}
	h := &harness{t: t, mgr: mgr, pooler: p, cancel: cancel, shutdown: make(chan struct{})}
	p.SetConsole(admin.New(admin.Config{
		Users:   []string{"admin"},
		Version: "test",
		Settings: func() []admin.Setting {
			return []admin.Setting{{Key: "pool_size", Value: strconv.Itoa(poolSize), Default: "20"}}
		},
		Shutdown: func() { h.once.Do(func() { close(h.shutdown) }) },
	}, p, mgr, nil))
	if h.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		cancel()
		t.Fatal(err)
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			conn, err := h.ln.Accept()
			if err != nil {
				return
			}
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				_ = p.Serve(ctx, conn, pooler.Peer{Addr: conn.RemoteAddr(), Transport: "tcp"})
			}()
		}
	}()
	t.Cleanup(h.close)
	return h
}

func (h *harness) close() {
	_ = h.ln.Close()
	sctx, done := context.WithTimeout(context.Background(), 10*time.Second)
	_ = h.pooler.Shutdown(sctx)
	done()
	h.cancel()
	h.wg.Wait()
	h.mgr.Close()
}

// url is a connection string to the pooler.
func (h *harness) url(user, database string) string {
	return "postgres://" + user + "@" + h.ln.Addr().String() + "/" + database + "?sslmode=disable"
}

// connect opens a pgconn session (simple protocol for Exec) as user.
func (h *harness) connect(ctx context.Context, t testing.TB, user, database string) *pgconn.PgConn {
	t.Helper()
	conn, err := pgconn.Connect(ctx, h.url(user, database))
	if err != nil {
		t.Fatalf("connect %s to %s: %v", user, database, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// table is a console answer: column names, type OIDs and text rows (nil
// cells are NULL).
type table struct {
	names []string
	oids  []uint32
	rows  [][]*string
}

// get returns the cell of column name in row i.
func (tb table) get(t testing.TB, i int, name string) string {
	t.Helper()
	for j, n := range tb.names {
		if n == name {
			if tb.rows[i][j] == nil {
				return ""
			}
			return *tb.rows[i][j]
		}
	}
	t.Fatalf("no column %q in %v", name, tb.names)
	return ""
}

// num is get as an integer.
func (tb table) num(t testing.TB, i int, name string) int {
	t.Helper()
	n, err := strconv.Atoi(tb.get(t, i, name))
	if err != nil {
		t.Fatalf("column %s: %v", name, err)
	}
	return n
}

// find returns the first row whose column col is val, or -1.
func (tb table) find(t testing.TB, col, val string) int {
	t.Helper()
	for i := range tb.rows {
		if tb.get(t, i, col) == val {
			return i
		}
	}
	return -1
}

// query runs one console command and returns its single result.
func query(ctx context.Context, t testing.TB, conn *pgconn.PgConn, sql string) (table, error) {
	t.Helper()
	res, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return table{}, err
	}
	if len(res) != 1 {
		t.Fatalf("%s: %d results", sql, len(res))
	}
	r := res[0]
	if r.Err != nil {
		return table{}, r.Err
	}
	var tb table
	for _, f := range r.FieldDescriptions {
		tb.names = append(tb.names, f.Name)
		tb.oids = append(tb.oids, f.DataTypeOID)
	}
	for _, row := range r.Rows {
		out := make([]*string, len(row))
		for i, v := range row {
			if v != nil {
				s := string(v)
				out[i] = &s
			}
		}
		tb.rows = append(tb.rows, out)
	}
	return tb, nil
}

// mustQuery is query failing the test on error.
func mustQuery(ctx context.Context, t testing.TB, conn *pgconn.PgConn, sql string) table {
	t.Helper()
	tb, err := query(ctx, t, conn, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tb
}

// sqlState returns the SQLSTATE of a PostgreSQL error, or "".
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pgconnConnect connects without registering a cleanup, for refusals.
func pgconnConnect(ctx context.Context, url string) (*pgconn.PgConn, error) {
	conn, err := pgconn.Connect(ctx, url)
	if err == nil {
		_ = conn.Close(ctx)
	}
	return conn, err
}
