package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// TestServeReloadUnderLoad: while clients run queries without pause, a
// reload raises the pool size (new pools take over, transactions in flight
// finish on the old ones), then sets a query timeout; a reload with an
// unreadable userlist is rejected whole; a change of mode is reported as
// needing a restart. No client query fails along the way.
func TestServeReloadUnderLoad(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	cfg := testConfig(cluster.SuperURL("postgres"))
	cfg.PoolSize, cfg.MinPool = 2, 1
	srv, _, stop := startTestServer(t, cfg)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	url := fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, srv.tcp.Addr())

	var queries, failures atomic.Int64
	var firstErr atomic.Pointer[error]
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 8 {
		c, err := pgconn.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		wg.Go(func() {
			for loadCtx.Err() == nil {
				if _, err := c.Exec(loadCtx, "SELECT pg_sleep(0.02)").ReadAll(); err != nil {
					if loadCtx.Err() != nil {
						return
					}
					failures.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				queries.Add(1)
			}
		})
	}
	maxConns := func() float64 { return sum(scrape(t, srv), "pgquic_backend_connections_max") }
	waitFor(t, func() bool { return queries.Load() > 50 })
	if got := maxConns(); got != 2 {
		t.Fatalf("connections_max before the reload = %v, want 2", got)
	}

	bigger := *cfg
	bigger.PoolSize = 5
	applied, restart, err := srv.Reload(ctx, &bigger)
	if err != nil || !slices.Contains(applied, "pool_size") || len(restart) != 0 {
		t.Fatalf("Reload(pool_size 5) = %v, %v, %v", applied, restart, err)
	}
	waitFor(t, func() bool { return maxConns() == 5 }) // the old pool closed once idle
	// The eight clients now share five server connections.
	waitFor(t, func() bool {
		return sum(scrape(t, srv), "pgquic_backend_connections", `state="in_use"`) > 2
	})

	// A reload that cannot be applied changes nothing.
	broken := bigger
	broken.Auth.Method, broken.Auth.File = "scram-sha-256", filepath.Join(t.TempDir(), "missing.txt")
	if _, _, err := srv.Reload(ctx, &broken); !errors.Is(err, ErrReloadRejected) {
		t.Fatalf("Reload with a missing userlist: %v, want ErrReloadRejected", err)
	}
	if got := maxConns(); got != 5 {
		t.Fatalf("connections_max after a rejected reload = %v, want 5", got)
	}
	before := queries.Load()
	waitFor(t, func() bool { return queries.Load() > before+20 })
	stopLoad()
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d queries failed during the reloads (first: %v)", n, *firstErr.Load())
	}
	t.Logf("%d queries, 0 failed, across the reloads", queries.Load())

	// Timeouts apply to running sessions' next request.
	c, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	timed := bigger
	timed.QueryTimeout = 200 * time.Millisecond
	if applied, _, err := srv.Reload(ctx, &timed); err != nil || !slices.Equal(applied, []string{"query_timeout"}) {
		t.Fatalf("Reload(query_timeout) = %v, %v", applied, err)
	}
	_, err = c.Exec(ctx, "SELECT pg_sleep(10)").ReadAll()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("pg_sleep(10) after query_timeout 200ms was loaded: %v, want 57014", err)
	}

	// What needs a restart is reported, not silently ignored.
	session := timed
	session.Mode = "session"
	if _, restart, err := srv.Reload(ctx, &session); err != nil || !slices.Equal(restart, []string{"mode"}) {
		t.Fatalf("Reload(mode) restart keys = %v, %v; want [mode]", restart, err)
	}
}

// TestServeSIGHUP: SIGHUP re-reads the --config file of a running
// process; an invalid file is rejected with the reason and the process
// keeps serving with its configuration.
func TestServeSIGHUP(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	file := filepath.Join(t.TempDir(), "pgquic.yml")
	write := func(extra string) {
		yml := fmt.Sprintf("backend: %q\ntcp_listen: 127.0.0.1:0\nquic_listen: \"\"\nmetrics_listen: \"\"\nmin_pool: 1\n%s", cluster.SuperURL("postgres"), extra)
		if err := os.WriteFile(file, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("pool_size: 2\n")
	p := startServeProcess(t, "--config", file)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	url := fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, p.tcp)
	c, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)

	write("pool_size: 3\nquery_timeout: 300ms\n")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(p.logs.String(), `msg="configuration reloaded" changed=pool_size,query_timeout`) {
		if time.Now().After(deadline) {
			t.Fatalf("no reload logged after SIGHUP:\n%s", p.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err = c.Exec(ctx, "SELECT pg_sleep(10)").ReadAll()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("after SIGHUP loaded query_timeout 300ms: %v, want 57014", err)
	}

	write("pool_size: -4\n")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return strings.Contains(p.logs.String(), "reload rejected; the running configuration is kept") &&
			strings.Contains(p.logs.String(), "pool_size")
	})
	if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatalf("query after a rejected reload: %v", err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-p.exited; err != nil {
		t.Fatalf("exit: %v\n%s", err, p.logs.String())
	}
	p.exited <- nil
}
