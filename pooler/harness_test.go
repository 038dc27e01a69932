package pooler_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
)

// harness is a real PostgreSQL cluster behind a pooler served on a loopback
// TCP listener, the way tcpfront serves it but without TLS.
type harness struct {
	t       testing.TB
	cluster *pgtest.Cluster
	mgr     *backend.Manager
	pooler  *pooler.Pooler
	ln      net.Listener
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

type harnessOpts struct {
	cfg      pooler.Config
	poolSize int
	minPool  int
	cluster  *pgtest.Cluster // reuse a cluster
	reg      prometheus.Registerer
	backReg  prometheus.Registerer // the backend manager's, when a test reads its metrics too
	backend  string                // the server's connection string, when not the cluster's own (a proxy in front of it)
	log      *slog.Logger          // the pooler's logger; nil discards
}

func newHarness(t testing.TB, o harnessOpts) *harness {
	t.Helper()
	c := o.cluster
	if c == nil {
		c = pgtest.New(t, pgtest.Options{})
	}
	if o.poolSize == 0 {
		o.poolSize = 8
	}
	if o.backend == "" {
		o.backend = c.SuperURL("postgres")
	}
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := backend.NewManager(ctx, backend.ManagerConfig{
		Routes: []backend.Route{{Database: "*", PoolConfig: backend.PoolConfig{ConnString: o.backend}}},
		Defaults: backend.PoolConfig{
			PoolSize: o.poolSize, MinPool: o.minPool,
		},
	}, nil, o.backReg)
	if err != nil {
		cancel()
		t.Fatalf("backend.NewManager: %v", err)
	}
	p, err := pooler.New(o.cfg, mgr, o.log, o.reg)
	if err != nil {
		cancel()
		t.Fatalf("pooler.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	h := &harness{t: t, cluster: c, mgr: mgr, pooler: p, ln: ln, cancel: cancel}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			conn, err := ln.Accept()
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

// url is a connection string to the pooler for the superuser.
func (h *harness) url() string {
	return "postgres://postgres:postgres@" + h.ln.Addr().String() + "/postgres?sslmode=disable"
}

func (h *harness) connect(ctx context.Context, t testing.TB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, h.url())
	if err != nil {
		t.Fatalf("connect through pooler: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
