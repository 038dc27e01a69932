package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/quicclient"
)

func TestServeAdminUsersFlag(t *testing.T) {
	cfg, err := parseServeFlags([]string{"--admin-users", "admin, ops,"}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := (config.UserList{"admin", "ops"}); !slices.Equal(cfg.AdminUsers, want) {
		t.Errorf("--admin-users gave %q, want %q", cfg.AdminUsers, want)
	}
}

// psqlTable runs one console command with psql (unaligned, "|"-separated)
// as an operator would, and returns the header and the rows.
func psqlTable(ctx context.Context, t *testing.T, addr, user, sql string) ([]string, [][]string, error) {
	t.Helper()
	psql, err := exec.LookPath("psql")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("psql not installed (.ci/run installs postgresql-client)")
		}
		t.Skip("psql not installed")
	}
	host, port, _ := strings.Cut(addr, ":")
	cmd := exec.CommandContext(ctx, psql, "-X", "-A", "-F", "|", "-P", "footer=off",
		"-h", host, "-p", port, "-U", user, "-d", "pgquic", "-c", sql)
	cmd.Env = append(cmd.Environ(), "PGSSLMODE=disable")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var rows [][]string
	for _, l := range lines[1:] {
		rows = append(rows, strings.Split(l, "|"))
	}
	return strings.Split(lines[0], "|"), rows, nil
}

// cell returns row's value in column name of header.
func cell(t *testing.T, header, row []string, name string) string {
	t.Helper()
	i := slices.Index(header, name)
	if i < 0 || i >= len(row) {
		t.Fatalf("no column %q in %v / %v", name, header, row)
	}
	return row[i]
}

// TestServeAdminConsole drives the console of a running `pgquic serve` with
// psql: SHOW POOLS under a load that exhausts a pool of 2, QUIC streams in
// SHOW CLIENTS, a non-admin user refused, and SHUTDOWN ending Run cleanly.
func TestServeAdminConsole(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	cfg := testConfig(cluster.SuperURL("postgres"))
	cfg.PoolSize, cfg.MinPool = 2, 0
	cfg.AdminUsers = config.UserList{"admin"}
	srv, logs, stop := startTestServer(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	addr := srv.tcp.Addr().String()

	// Refused: a user not in admin_users.
	if _, _, err := psqlTable(ctx, t, addr, cluster.SuperUser, "SHOW POOLS"); err == nil || !strings.Contains(err.Error(), "not allowed") {
		t.Errorf("non-admin user: %v, want not allowed", err)
	}

	// Load: 6 TCP clients in short transactions on a pool of 2.
	tcpURL := fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, addr)
	stopLoad := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []error
	for range 6 {
		conn, err := pgconn.Connect(ctx, tcpURL)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close(context.Background())
			for {
				select {
				case <-stopLoad:
					return
				default:
				}
				if _, err := conn.Exec(ctx, "BEGIN; SELECT pg_sleep(0.05); COMMIT").ReadAll(); err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	var header []string
	var row []string
	waitFor(t, func() bool {
		h, rows, err := psqlTable(ctx, t, addr, "admin", "SHOW POOLS")
		if err != nil {
			t.Fatalf("psql SHOW POOLS: %v", err)
		}
		header = h
		for _, r := range rows {
			if cell(t, h, r, "database") == "postgres" {
				row = r
				w, _ := strconv.Atoi(cell(t, h, r, "cl_waiting"))
				return w > 0 && cell(t, h, r, "sv_active") == "2"
			}
		}
		return false
	})
	t.Logf("psql SHOW POOLS under load:\n%s\n%s", strings.Join(header, "|"), strings.Join(row, "|"))
	close(stopLoad)
	wg.Wait()
	if len(failures) > 0 {
		t.Errorf("%d transactions failed under load, first: %v", len(failures), failures[0])
	}

	// Three sessions over one QUIC connection appear in SHOW CLIENTS with
	// the same connection name.
	dialer, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: srv.quic.Addr().String(), Conns: 1, PinSHA256: srv.quic.Fingerprint()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dialer.Close()
	pcfg, err := pgconn.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable&application_name=over-quic", cluster.SuperUser, cluster.SuperPassword, srv.quic.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.DialFunc = dialer.DialFunc()
	for range 3 {
		qc, err := pgconn.ConnectConfig(ctx, pcfg)
		if err != nil {
			t.Fatalf("connect over QUIC: %v", err)
		}
		defer qc.Close(context.Background())
	}
	h, rows, err := psqlTable(ctx, t, addr, "admin", "SHOW CLIENTS")
	if err != nil {
		t.Fatal(err)
	}
	quicConns := map[string]int{}
	for _, r := range rows {
		if cell(t, h, r, "transport") == "quic" {
			if cell(t, h, r, "application_name") != "over-quic" || cell(t, h, r, "tls") != "quic" {
				t.Errorf("QUIC client row: %v", r)
			}
			quicConns[cell(t, h, r, "connection")]++
		}
	}
	if len(quicConns) != 1 || quicConns["quic-1"] != 3 {
		t.Errorf("QUIC clients by connection: %v, want 3 on quic-1", quicConns)
	}

	// SHUTDOWN drains as SIGTERM does: Run returns nil.
	if _, _, err := psqlTable(ctx, t, addr, "admin", "SHUTDOWN"); err != nil && !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("SHUTDOWN: %v", err)
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "shutdown complete") })
	if err := stop(); err != nil {
		t.Errorf("Run after SHUTDOWN: %v", err)
	}
	if !strings.Contains(logs.String(), "SHUTDOWN from the admin console") {
		t.Errorf("logs lack the SHUTDOWN line:\n%s", logs.String())
	}
}

// TestConsoleReload: RELOAD re-reads the --config file as SIGHUP does. A
// changed pool size shows in SHOW DATABASES; an invalid file is refused
// with F0000 and the configuration in force is kept.
func TestConsoleReload(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	file := filepath.Join(t.TempDir(), "pgquic.yml")
	write := func(yml string) {
		if err := os.WriteFile(file, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := fmt.Sprintf("tcp_listen: 127.0.0.1:0\nquic_listen: \"\"\nmetrics_listen: \"\"\nbackend: %q\nadmin_users: admin\nmin_pool: 0\n", cluster.SuperURL("postgres"))
	write(base + "pool_size: 2\n")
	args := []string{"--config", file}
	cfg, err := parseServeFlags(args, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	srv, _, _ := startTestServer(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	addr := srv.tcp.Addr().String()
	con, err := pgconn.Connect(ctx, "postgres://admin@"+addr+"/pgbouncer?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close(context.Background())

	// Without a command line to re-read, RELOAD says so.
	if _, err := con.Exec(ctx, "RELOAD").ReadAll(); err == nil || !strings.Contains(err.Error(), "not reloaded") && !strings.Contains(err.Error(), "command line") {
		t.Errorf("RELOAD without a command line: %v", err)
	}
	srv.serveArgs.Store(&args)

	app, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, addr))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(context.Background())
	poolSize := func() string {
		res, err := con.Exec(ctx, "SHOW DATABASES").ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range res[0].FieldDescriptions {
			names = append(names, f.Name)
		}
		for _, r := range res[0].Rows {
			if string(r[0]) == "postgres" {
				return string(r[slices.Index(names, "pool_size")])
			}
		}
		return ""
	}
	if _, err := app.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if got := poolSize(); got != "2" {
		t.Fatalf("pool_size before RELOAD = %q", got)
	}
	// SHOW CONFIG says which keys RELOAD applies.
	res, err := con.Exec(ctx, "SHOW CONFIG").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	changeable := map[string]string{}
	for _, r := range res[0].Rows {
		changeable[string(r[0])] = string(r[3])
	}
	if changeable["pool_size"] != "yes" || changeable["auth.method"] != "yes" || changeable["mode"] != "no" || changeable["admin_users"] != "yes" {
		t.Errorf("SHOW CONFIG changeable: pool_size %q auth.method %q mode %q admin_users %q",
			changeable["pool_size"], changeable["auth.method"], changeable["mode"], changeable["admin_users"])
	}
	// RELOAD while eight clients query without pause: SHOW POOLS shows the
	// bigger pool in use and no query fails.
	var queries, failures atomic.Int64
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 8 {
		c, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, addr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		wg.Go(func() {
			for loadCtx.Err() == nil {
				if _, err := c.Exec(loadCtx, "SELECT pg_sleep(0.02)").ReadAll(); err != nil {
					if loadCtx.Err() == nil {
						failures.Add(1)
						t.Errorf("query during RELOAD: %v", err)
					}
					continue
				}
				queries.Add(1)
			}
		})
	}
	servers := func() int {
		header, rows, err := psqlTable(ctx, t, addr, "admin", "SHOW POOLS")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range rows {
			if cell(t, header, r, "database") == "postgres" {
				for _, col := range []string{"sv_active", "sv_idle", "sv_used"} {
					v, _ := strconv.Atoi(cell(t, header, r, col))
					n += v
				}
			}
		}
		return n
	}
	waitFor(t, func() bool { return queries.Load() > 40 })
	if n := servers(); n > 2 {
		t.Fatalf("SHOW POOLS shows %d server connections before RELOAD, pool_size is 2", n)
	}
	write(base + "pool_size: 5\n")
	if _, err := con.Exec(ctx, "RELOAD").ReadAll(); err != nil {
		t.Fatalf("RELOAD: %v", err)
	}
	waitFor(t, func() bool { return servers() > 2 })
	before := queries.Load()
	waitFor(t, func() bool { return queries.Load() > before+40 })
	stopLoad()
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d of %d queries failed across RELOAD", n, queries.Load())
	}
	if _, err := app.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatalf("query after RELOAD: %v", err)
	}
	if got := poolSize(); got != "5" {
		t.Errorf("pool_size after RELOAD = %q, want 5", got)
	}
	write(base + "pool_size: -1\n")
	_, err = con.Exec(ctx, "RELOAD").ReadAll()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "F0000" {
		t.Errorf("RELOAD of an invalid file: %v, want F0000", err)
	}
	if got := poolSize(); got != "5" {
		t.Errorf("pool_size after a refused RELOAD = %q, want 5 kept", got)
	}
}
