package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/loadgen/report"
)

// pgbouncerBinary finds Debian's PgBouncer: on PATH or in /usr/sbin, where
// the package installs it. Under CI=true a missing PgBouncer fails the test.
func pgbouncerBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("PgBouncer is required under CI (apt-get install pgbouncer)")
	}
	t.Skip("PgBouncer not installed (apt-get install pgbouncer)")
	return ""
}

// startPgBouncer runs PgBouncer in transaction mode in front of the cluster
// on a free loopback port, with trust authentication and the given pool
// size, and returns its address once a session through it works. PgBouncer
// refuses to run as root, so as root it runs as the postgres user.
func startPgBouncer(t *testing.T, c *pgtest.Cluster, poolSize int) string {
	t.Helper()
	bin := pgbouncerBinary(t)
	dir, err := os.MkdirTemp("", "pgquic-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ini := fmt.Sprintf(`[databases]
postgres = host=%s port=%d dbname=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits
`, c.Host, c.Port, port, filepath.Join(dir, "userlist.txt"), poolSize)
	for name, body := range map[string]string{
		"pgbouncer.ini": ini,
		"userlist.txt":  fmt.Sprintf("%q \"\"\n", c.SuperUser),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	var logs lockedBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if os.Getuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, PgBouncer needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	url := fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", c.SuperUser, addr)
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("PgBouncer exited: %v\n%s", err, logs.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgconn.Connect(ctx, url)
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT 1").ReadAll()
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("PgBouncer not serving after 30s: %v\n%s", err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRampAgainstPgBouncer runs the ramp in target mode against Debian's
// PgBouncer in transaction mode, across the same emulated WAN as the
// in-process pooler: only the TCP run happens, every query goes through
// PgBouncer to PostgreSQL and crosses the emulator, and the model is
// printed beside it with the pool size given.
func TestRampAgainstPgBouncer(t *testing.T) {
	needPostgres(t)
	c := pgtest.New(t, pgtest.Options{})
	const pool = 5
	addr := startPgBouncer(t, c, pool)

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	out := filepath.Join(t.TempDir(), "results")
	var stdout, stderr lockedBuffer
	code := runRampTest(ctx, t, []string{"--tcp-target", addr, "--tcp-tls=false", "--pool-size", strconv.Itoa(pool),
		"--dsn", c.URL(c.SuperUser, c.SuperPassword, "postgres"),
		"--rtt", "20ms", "--from", "20", "--to", "200", "--duration", "3s", "--tcp-conns", "10", "--out", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	rep, err := report.ReadJSON(filepath.Join(out, "ramp.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 1 || rep.Runs[0].Transport != "tcp" {
		t.Fatalf("runs %+v, want one tcp run", rep.Runs)
	}
	r := rep.Runs[0]
	if r.Scheduled != 330 || r.Errors != 0 || r.Completed < r.Scheduled*9/10 {
		t.Errorf("scheduled %d, completed %d, errors %d (kinds %v)", r.Scheduled, r.Completed, r.Errors, r.ErrorKinds)
	}
	if r.TLS {
		t.Error("TLS on, want plain TCP to PgBouncer")
	}
	if r.LatencyMs.P50 < 20 {
		t.Errorf("p50 %.1f ms below the emulated 20 ms round trip", r.LatencyMs.P50)
	}
	if r.Emulator == nil || r.Emulator.CPUSeconds <= 0 {
		t.Errorf("emulator %+v", r.Emulator)
	}
	if r.PredictedCeilingQPS < 400 || r.PredictedCeilingQPS > 500 || r.PredictedPoolCeilingQPS <= 0 {
		t.Errorf("predicted %.0f q/s, pool %.0f q/s", r.PredictedCeilingQPS, r.PredictedPoolCeilingQPS)
	}
	// The queries really went through PgBouncer: its pool holds server
	// connections to PostgreSQL, at most the pool size.
	conn, err := pgconn.Connect(ctx, c.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	res := conn.ExecParams(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND client_port IS NOT NULL AND pid <> pg_backend_pid()", nil, nil, nil, nil).Read()
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if n, _ := strconv.Atoi(string(res.Rows[0][0])); n < 1 || n > pool {
		t.Errorf("%d server connections from PgBouncer, want 1..%d", n, pool)
	}
	if !strings.Contains(stdout.String(), "tcp       1s  offered") || strings.Contains(stdout.String(), "quic      1s") {
		t.Errorf("progress lines: want tcp only\n%s", stdout.String())
	}
}
