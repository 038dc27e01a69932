package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// servedProcess is `pgquic serve` running as a child process.
type servedProcess struct {
	cmd    *exec.Cmd
	logs   *lockedBuffer
	tcp    string // the TCP front's address, from the ready line
	exited chan error
}

var tcpReady = regexp.MustCompile(`pgquic ready.* tcp=(\S+)`)

// startServeProcess runs the test binary as `pgquic serve args...` and
// waits for its ready line.
func startServeProcess(t *testing.T, args ...string) *servedProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve"}, args...)...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	p := &servedProcess{cmd: cmd, logs: &lockedBuffer{}, exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
	})
	waitFor(t, func() bool {
		m := tcpReady.FindStringSubmatch(p.logs.String())
		if m != nil {
			p.tcp = m[1]
		}
		return m != nil
	})
	return p
}

// signalTestSetup starts a cluster and a served pooler in front of it, and
// returns a connection string for the pooler and a direct connection.
func signalTestSetup(t *testing.T, ctx context.Context) (*servedProcess, string, *pgconn.PgConn) {
	cluster := pgtest.New(t, pgtest.Options{})
	p := startServeProcess(t, "--backend", cluster.SuperURL("postgres"), "--tcp-listen", "127.0.0.1:0",
		"--quic-listen", "", "--metrics-listen", "", "--shutdown-grace", "15s", "--pool-size", "2")
	url := fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, p.tcp)
	d, err := pgconn.Connect(ctx, cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(context.Background()) })
	if _, err := d.Exec(ctx, "DROP TABLE IF EXISTS sigterm_t; CREATE TABLE sigterm_t (v int)").ReadAll(); err != nil {
		t.Fatal(err)
	}
	return p, url, d
}

// runningQuery connects to url, sends query in the background and returns
// once the server (seen through d) runs it; the channel yields its result.
func runningQuery(t *testing.T, ctx context.Context, url string, d *pgconn.PgConn, query string) <-chan error {
	t.Helper()
	conn, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, query).ReadAll()
		done <- err
	}()
	waitFor(t, func() bool {
		res, err := d.Exec(ctx, fmt.Sprintf("SELECT count(*) FROM pg_stat_activity WHERE query = '%s' AND state = 'active'", query)).ReadAll()
		return err == nil && string(res[0].Rows[0][0]) == "1"
	})
	return done
}

// TestServeSIGTERMDrains: SIGTERM while a transaction runs a 2-second
// statement. The transaction commits, new connections are refused while it
// finishes, and the process exits 0 well within the grace period.
func TestServeSIGTERMDrains(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	p, url, d := signalTestSetup(t, ctx)
	done := runningQuery(t, ctx, url, d, "BEGIN; INSERT INTO sigterm_t VALUES (1); SELECT pg_sleep(2); COMMIT")
	signalled := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return tcpReady.MatchString(p.logs.String()) && strings.Contains(p.logs.String(), "shutting down")
	})
	if c, err := pgconn.Connect(ctx, url); err == nil {
		c.Close(ctx)
		t.Error("a new connection was accepted during the drain")
	}
	if err := <-done; err != nil {
		t.Fatalf("the transaction running at SIGTERM: %v", err)
	}
	select {
	case err := <-p.exited:
		p.exited <- err // for the cleanup
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v, want status 0\n%s", err, p.logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("still running 15 s (the grace) after SIGTERM\n%s", p.logs.String())
	}
	t.Logf("exited %v after SIGTERM", time.Since(signalled).Round(time.Millisecond))
	res, err := d.Exec(ctx, "SELECT count(*) FROM sigterm_t").ReadAll()
	if err != nil || string(res[0].Rows[0][0]) != "1" {
		t.Fatalf("committed rows: %v %v, want 1", res, err)
	}
}

// TestServeSecondSignalForces: a second SIGTERM during the drain ends the
// process at once; the transaction it cut off is not committed.
func TestServeSecondSignalForces(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	p, url, d := signalTestSetup(t, ctx)
	const q = "BEGIN; INSERT INTO sigterm_t VALUES (2); SELECT pg_sleep(60); COMMIT"
	done := runningQuery(t, ctx, url, d, q)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(p.logs.String(), "shutting down") })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		p.exited <- err
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("exit after a second SIGTERM: %v, want an abnormal exit", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still running 5 s after a second SIGTERM")
	}
	if err := <-done; err == nil {
		t.Fatal("the cut-off transaction reported success")
	}
	// The server rolls back the cut-off transaction once it notices its
	// client (the pooler) is gone; its pg_sleep is cancelled or runs out.
	waitFor(t, func() bool {
		res, err := d.Exec(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = '"+q+"'").ReadAll()
		return err == nil && string(res[0].Rows[0][0]) == "0"
	})
	res, err := d.Exec(ctx, "SELECT count(*) FROM sigterm_t").ReadAll()
	if err != nil || string(res[0].Rows[0][0]) != "0" {
		t.Fatalf("rows after the forced exit: %v %v, want 0", res, err)
	}
}
