package pooler_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
)

// lateCancelProxy stands between the pooler and PostgreSQL and makes the
// server's second cancel signal late. PostgreSQL signals a cancelled
// process twice, the process and then its process group, and closes the
// cancel connection after both; on a busy machine the second can come
// after the first has already ended the query. The proxy forwards every
// CancelRequest to the server, waits delay, forwards it again, and only then
// closes the pooler's cancel connection, so the late signal is certain,
// not a matter of scheduling. Every other connection is piped through.
type lateCancelProxy struct {
	ln       net.Listener
	upstream string
	backend  string // the cluster's superuser connection string, through the proxy
	delay    time.Duration
	swallow  bool         // deliver no CancelRequest and never close: the cancel cannot be confirmed
	sent     atomic.Int32 // CancelRequests delivered to the server
	wg       sync.WaitGroup

	// onceTotal counts the pooler's one-signal cancel sessions
	// (application_name "pgquic cancel", backend.Pool.CancelOnce).
	onceTotal atomic.Int32
}

// startLateCancelProxy starts the proxy in front of c; its backend field is
// the connection string that reaches c through it.
func startLateCancelProxy(t *testing.T, c *pgtest.Cluster, delay time.Duration) *lateCancelProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upstream := net.JoinHostPort(c.Host, fmt.Sprint(c.Port))
	p := &lateCancelProxy{ln: ln, upstream: upstream, delay: delay,
		backend: strings.Replace(c.SuperURL("postgres"), upstream, ln.Addr().String(), 1)}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.wg.Wait()
	})
	return p
}

func (p *lateCancelProxy) handle(c net.Conn) {
	defer func() { _ = c.Close() }()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	hdr := make([]byte, 8)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if binary.BigEndian.Uint32(hdr[4:]) == 80877102 && binary.BigEndian.Uint32(hdr[:4]) == 16 {
		pkt := make([]byte, 16)
		copy(pkt, hdr)
		if _, err := io.ReadFull(c, pkt[8:]); err != nil {
			return
		}
		if p.swallow {
			_, _ = io.Copy(io.Discard, c) // until the pooler gives up
			return
		}
		p.cancel(pkt)
		time.Sleep(p.delay) // the fault injected: the second signal comes late
		p.cancel(pkt)
		return
	}
	first := hdr
	if n := binary.BigEndian.Uint32(hdr[:4]); binary.BigEndian.Uint32(hdr[4:]) == 196608 && n > 8 && n < 10000 {
		// A startup packet: note the pooler's one-signal cancel sessions.
		first = make([]byte, n)
		copy(first, hdr)
		if _, err := io.ReadFull(c, first[8:]); err != nil {
			return
		}
		if bytes.Contains(first, []byte("application_name\x00pgquic cancel\x00")) {
			p.onceTotal.Add(1)
		}
	}
	u, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	defer func() { _ = u.Close() }()
	if _, err := u.Write(first); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
	<-done
	_ = u.Close()
	_ = c.Close()
	<-done
}

// cancel delivers one CancelRequest to the server and waits for it to close
// the connection, as it does once it has signalled the process.
func (p *lateCancelProxy) cancel(pkt []byte) {
	u, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	defer func() { _ = u.Close() }()
	_ = u.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := u.Write(pkt); err == nil {
		_, _ = io.Copy(io.Discard, u)
		p.sent.Add(1)
	}
}

// TestCancelSecondSignal: a cancel the pooler sends on its own, here for
// query_timeout, must stop only the request it was meant for. The client
// does not wait for that cancel as it waits for one of its own, so it sends
// its next statement as soon as the error arrives; the pooler holds that
// statement until the server has closed the cancel connection, after which
// no signal of that cancel can come. Without the hold the late second
// signal cancels the next statement. In transaction mode the statements run
// inside a transaction block (the timed-out one in a savepoint rolled back
// after it), where the client keeps its server connection as in session
// mode; outside one the connection goes back to the pool, which waits for
// the cancel before lending it again.
func TestCancelSecondSignal(t *testing.T) {
	c := sharedCluster(t)
	for _, tc := range []struct {
		mode  pooler.Mode
		block bool
	}{
		{pooler.ModeSession, false},
		{pooler.ModeTransaction, true},
		{pooler.ModeTransaction, false},
	} {
		name := string(tc.mode)
		if tc.block {
			name += "-in-block"
		}
		t.Run(name, func(t *testing.T) {
			px := startLateCancelProxy(t, c, 100*time.Millisecond)
			h := newHarness(t, harnessOpts{cluster: c, poolSize: 1, backend: px.backend,
				cfg: pooler.Config{Mode: tc.mode, QueryTimeout: 300 * time.Millisecond}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			conn := h.connect(ctx, t)
			if tc.block {
				if _, err := conn.Exec(ctx, "BEGIN; SAVEPOINT before_sleep"); err != nil {
					t.Fatal(err)
				}
			}
			_, err := conn.Exec(ctx, "SELECT pg_sleep(30)")
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "57014" {
				t.Fatalf("pg_sleep(30) with a 300 ms query_timeout: %v, want 57014", err)
			}
			if tc.block {
				// Still inside the block: the connection stays attached.
				if _, err := conn.Exec(ctx, "ROLLBACK TO SAVEPOINT before_sleep"); err != nil {
					t.Fatal(err)
				}
			}
			// Sent at once; it outlasts the proxy's delay, so a late
			// signal reaching the server finds it running.
			if _, err := conn.Exec(ctx, "SELECT pg_sleep(0.25)"); err != nil {
				t.Fatalf("the statement after a timed-out one: %v", err)
			}
			if tc.block {
				if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
					t.Fatal(err)
				}
			}
			if n := px.sent.Load(); n != 2 {
				t.Fatalf("the proxy delivered %d CancelRequests, want 2 (the cancel and its late second signal)", n)
			}
		})
	}
}

// TestCancelUnconfirmed: when the server never confirms a cancel the pooler
// sent on its own (the cancel connection neither closes nor fails within the
// pooler's bound), the cancel may still land on whatever the connection runs
// next. The pooler then closes that connection: the client whose request
// timed out gets 08006 rather than a later statement cancelled, and the
// pool's only slot serves the next client on a fresh connection.
func TestCancelUnconfirmed(t *testing.T) {
	c := sharedCluster(t)
	px := startLateCancelProxy(t, c, 0)
	px.swallow = true
	h := newHarness(t, harnessOpts{cluster: c, poolSize: 1, backend: px.backend,
		cfg: pooler.Config{Mode: pooler.ModeSession, QueryTimeout: 200 * time.Millisecond}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := h.connect(ctx, t)
	var pid int32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	_, err := conn.Exec(ctx, "SELECT pg_sleep(60)")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "08006" {
		t.Fatalf("pg_sleep(60) whose cancel is never confirmed: %v, want 08006", err)
	}
	next := h.connect(ctx, t)
	var pid2 int32
	if err := next.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid2); err != nil {
		t.Fatalf("the next client: %v", err)
	}
	if pid2 == pid {
		t.Fatalf("the next client got server process %d again, whose cancel may still land", pid)
	}
	if n := px.sent.Load(); n != 0 {
		t.Fatalf("the proxy delivered %d CancelRequests, want 0", n)
	}
}
