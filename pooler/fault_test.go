package pooler_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/pooler"
)

// checkServing fails the test unless a fresh pgx client can run a query
// through the pooler.
func (h *harness) checkServing(ctx context.Context, t testing.TB) {
	t.Helper()
	conn, err := pgx.Connect(ctx, h.url())
	if err != nil {
		t.Fatalf("pooler no longer serving: connect: %v", err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, "select $1::int + 1", 1).Scan(&n); err != nil || n != 2 {
		t.Fatalf("pooler no longer serving: query: %d, %v", n, err)
	}
}

// waitSessions waits until the pooler has at most n sessions open.
func (h *harness) waitSessions(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for h.pooler.Sessions() > n {
		if time.Now().After(deadline) {
			t.Fatalf("pooler still has %d sessions after 15s, want <= %d", h.pooler.Sessions(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) dial(t testing.TB) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", h.ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// rawLogin completes a trust login by hand and returns the connection at
// ReadyForQuery.
func (h *harness) rawLogin(t testing.TB) net.Conn {
	t.Helper()
	c := h.dial(t)
	fe := pgproto3.NewFrontend(c, c)
	fe.Send(&pgproto3.StartupMessage{
		ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters:      map[string]string{"user": "postgres", "database": "postgres"},
	})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("raw login: %v", err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			t.Fatalf("raw login: %s %s", m.Code, m.Message)
		case *pgproto3.ReadyForQuery:
			_ = c.SetDeadline(time.Time{})
			return c
		}
	}
}

// readUntilClose reads what the pooler sends until it closes the connection.
// It fails the test when the connection is still open after d.
func readUntilClose(t testing.TB, c net.Conn, d time.Duration) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	data, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("pooler did not close the connection within %s: %v (read %q)", d, err, data)
	}
	return data
}

// firstError decodes the ErrorResponse data starts with.
func firstError(t testing.TB, data []byte) *pgproto3.ErrorResponse {
	t.Helper()
	if len(data) < 5 || data[0] != 'E' {
		t.Fatalf("want an ErrorResponse, got %q", data)
	}
	n := int(binary.BigEndian.Uint32(data[1:5]))
	if n < 4 || 1+n > len(data) {
		t.Fatalf("truncated ErrorResponse %q", data)
	}
	var er pgproto3.ErrorResponse
	if err := er.Decode(data[5 : 1+n]); err != nil {
		t.Fatal(err)
	}
	return &er
}

func startupHeader(length uint32, code uint32) []byte {
	b := binary.BigEndian.AppendUint32(nil, length)
	return binary.BigEndian.AppendUint32(b, code)
}

// TestMalformedStartup sends broken startup packets; each connection ends
// (closed without a reply where the length is impossible, as PostgreSQL
// does, with an error where PostgreSQL sends one) and the pooler keeps
// serving. TestFramesBadStartup compares the replies with PostgreSQL's.
func TestMalformedStartup(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2})
	ctx := testCtx(t, 2*time.Minute)
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 256)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	cases := []struct {
		name     string
		send     []byte
		close    bool   // close our side right after sending
		wantCode string // the ErrorResponse expected before the close, if any
		silent   bool   // nothing at all comes back before the close
		answer   byte   // the one-byte answer to an SSLRequest that comes first
	}{
		{name: "random bytes then close", send: random, close: true},
		{name: "absurd length", send: append(startupHeader(0x7fffffff, 196608), "user\x00x\x00"...), silent: true},
		{name: "above MaxStartupLen", send: startupHeader(10001, 196608), silent: true},
		{name: "truncated then close", send: append(startupHeader(100, 196608), "user\x00post"...), close: true},
		{name: "length 0", send: []byte{0, 0, 0, 0}, silent: true},
		{name: "length 3", send: []byte{0, 0, 0, 3}, silent: true},
		{name: "length 4", send: []byte{0, 0, 0, 4, 1, 2, 3, 4}, silent: true},
		{name: "length 7", send: []byte{0, 0, 0, 7, 0, 3, 0}, silent: true},
		{name: "terminate", send: []byte{'X', 0, 0, 0, 4}, silent: true},
		{name: "no terminator", send: append(startupHeader(8+6, 196608), "user\x00x"...), wantCode: "08P01"},
		{name: "no user", send: append(startupHeader(8+1, 196608), 0), wantCode: "28000"},
		{name: "protocol 4", send: append(startupHeader(8+1, 4<<16), 0), wantCode: "0A000"},
		{name: "cancel request with short body", send: startupHeader(8, 80877102)},
		{name: "cancel request for unknown session", send: append(startupHeader(16, 80877102), 0, 0, 0, 1, 1, 2, 3, 4)},
		{name: "data after SSLRequest", send: append(startupHeader(8, 80877103), 'x'), wantCode: "08P01", answer: 'N'},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := h.dial(t)
			if _, err := c.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			if tc.close {
				_ = c.Close()
			} else {
				data := readUntilClose(t, c, 10*time.Second)
				if tc.silent && len(data) > 0 {
					t.Fatalf("got %q, want a close without a reply", data)
				}
				if tc.answer != 0 {
					if len(data) == 0 || data[0] != tc.answer {
						t.Fatalf("got %q, want the answer %q first", data, tc.answer)
					}
					data = data[1:]
				}
				if tc.wantCode != "" {
					if er := firstError(t, data); er.Code != tc.wantCode {
						t.Fatalf("got %s %q, want %s", er.Code, er.Message, tc.wantCode)
					}
				}
			}
			h.checkServing(ctx, t)
		})
	}
	h.waitSessions(t, 0)
}

// TestMalformedMessagesAfterLogin sends regular messages with invalid
// lengths after a successful login: the session ends with 08P01.
func TestMalformedMessagesAfterLogin(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2})
	ctx := testCtx(t, time.Minute)
	cases := []struct {
		name string
		send []byte
	}{
		{"length 0", []byte{'Q', 0, 0, 0, 0}},
		{"length 3", []byte{'Q', 0, 0, 0, 3}},
		{"length 200 MB", binary.BigEndian.AppendUint32([]byte{'Q'}, 200<<20)},
		{"length 0x7fffffff", binary.BigEndian.AppendUint32([]byte{'P'}, 0x7fffffff)},
		{"length 2 GB+", binary.BigEndian.AppendUint32([]byte{'d'}, 0xffffffff)},
		{"unknown type", []byte{'z', 0, 0, 0, 4}},
		{"password after login", []byte{'p', 0, 0, 0, 5, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := h.rawLogin(t)
			if _, err := c.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			data := readUntilClose(t, c, 10*time.Second)
			if er := firstError(t, data); er.Code != "08P01" {
				t.Fatalf("got %s %q, want 08P01", er.Code, er.Message)
			}
			h.checkServing(ctx, t)
		})
	}
	h.waitSessions(t, 0)
	h.waitNoneInUse(t)
}

// TestMessageLimitMidTransaction sends an oversized message while the client
// holds a server connection inside a transaction: the session ends and the
// server connection is not returned dirty.
func TestMessageLimitMidTransaction(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	_ = h.cluster.Exec(ctx, "drop table if exists limit_t; create table limit_t (x int)")
	c := h.rawLogin(t)
	q := func(sql string) []byte {
		b := binary.BigEndian.AppendUint32([]byte{'Q'}, uint32(len(sql)+5))
		return append(append(b, sql...), 0)
	}
	if _, err := c.Write(q("begin; insert into limit_t values (1)")); err != nil {
		t.Fatal(err)
	}
	fe := pgproto3.NewFrontend(c, c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if rfq, ok := msg.(*pgproto3.ReadyForQuery); ok {
			if rfq.TxStatus != 'T' {
				t.Fatalf("tx status %c", rfq.TxStatus)
			}
			break
		}
	}
	if _, err := c.Write(binary.BigEndian.AppendUint32([]byte{'Q'}, 200<<20)); err != nil {
		t.Fatal(err)
	}
	data := readUntilClose(t, c, 10*time.Second)
	if er := firstError(t, data); er.Code != "08P01" {
		t.Fatalf("got %s, want 08P01", er.Code)
	}
	conn := h.connect(ctx, t)
	var n int
	if err := conn.QueryRow(ctx, "select count(*) from limit_t").Scan(&n); err != nil || n != 0 {
		t.Fatalf("uncommitted row visible or error: %d, %v", n, err)
	}
	h.waitNoneInUse(t)
}

// TestStartupTimeout opens 300 connections that never send a startup
// packet: the pooler closes them after StartupTimeout and keeps no goroutine.
// (They all come from one address, so the per-source startup limit is raised
// above 300; TestPreauthStartingLimits covers that limit.)
func TestStartupTimeout(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2, cfg: pooler.Config{StartupTimeout: 2 * time.Second, MaxStartingPerSource: 1000}})
	ctx := testCtx(t, time.Minute)
	h.checkServing(ctx, t)
	h.waitSessions(t, 0)
	before := settleGoroutines(0)
	conns := make([]net.Conn, 300)
	for i := range conns {
		conns[i] = h.dial(t)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(conns))
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			n, err := c.Read(make([]byte, 1))
			if n != 0 || (!errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET)) {
				errs <- fmt.Errorf("conn %d: read %d bytes, err %v; want close by the pooler", i, n, err)
			}
			_ = c.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	h.waitSessions(t, 0)
	if after := settleGoroutines(before); after > before+5 {
		t.Errorf("goroutines: %d before, %d after the idle connections were closed", before, after)
	}
	h.checkServing(ctx, t)
}

// settleGoroutines waits (up to 15 s) for the goroutine count to drop to
// target or below and returns the last count; with target 0 it waits for the
// count to stop changing.
func settleGoroutines(target int) int {
	deadline := time.Now().Add(15 * time.Second)
	last := runtime.NumGoroutine()
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		n := runtime.NumGoroutine()
		if target > 0 && n <= target {
			return n
		}
		if target == 0 && n == last {
			return n
		}
		last = n
	}
	return runtime.NumGoroutine()
}

// TestMaxClients refuses the sixth client with 53300 and admits it again
// once a slot is free.
func TestMaxClients(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2, cfg: pooler.Config{MaxClients: 5}})
	ctx := testCtx(t, time.Minute)
	conns := make([]*pgx.Conn, 5)
	for i := range conns {
		c, err := pgx.Connect(ctx, h.url())
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		conns[i] = c
	}
	_, err := pgx.Connect(ctx, h.url())
	if pgCode(err) != "53300" {
		t.Fatalf("sixth client: got %v, want 53300", err)
	}
	for _, c := range conns {
		if _, err := c.Exec(ctx, "select 1"); err != nil {
			t.Fatalf("admitted client broken: %v", err)
		}
	}
	_ = conns[0].Close(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := pgx.Connect(ctx, h.url())
		if err == nil {
			_ = c.Close(ctx)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("client still refused after a slot was freed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, c := range conns[1:] {
		_ = c.Close(ctx)
	}
}

// TestAcquireTimeout makes a client wait for the only server connection,
// held by another client's transaction: it gets 53300 saying why, and works
// once the transaction commits.
func TestAcquireTimeout(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{AcquireTimeout: 500 * time.Millisecond}})
	ctx := testCtx(t, time.Minute)
	a := h.connect(ctx, t)
	b := h.connect(ctx, t)
	tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		_, err = b.Exec(ctx, "select 1", mode)
		if pgCode(err) != "53300" {
			t.Fatalf("%s: got %v, want 53300", mode, err)
		}
		var pe *pgconn.PgError
		errors.As(err, &pe)
		if !strings.Contains(pe.Message, "500ms") || !strings.Contains(pe.Message, "server connection") {
			t.Errorf("53300 message does not say why: %q", pe.Message)
		}
		if b.PgConn().IsClosed() {
			t.Fatalf("client closed after 53300")
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, "select $1::int", 3).Scan(&n); err != nil || n != 3 {
		t.Fatalf("after commit: %d %v", n, err)
	}
}

// cancelHandler makes pgx send a CancelRequest on context cancellation
// instead of closing the connection (its default).
func cancelHandler(c *pgx.ConnConfig) {
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 10 * time.Second}
	}
}

// TestCancelRequest cancels a running pg_sleep through the pooler, by
// context cancellation in pgx and by an explicit CancelRequest, and checks
// that the connection is usable afterwards.
func TestCancelRequest(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2})
	ctx := testCtx(t, time.Minute)
	stop := hammer(ctx, t, h, 1)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("hammer: %v", err)
		}
	}()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		t.Run("context/"+mode.String(), func(t *testing.T) {
			conn := h.connectWith(ctx, t, func(c *pgx.ConnConfig) {
				cancelHandler(c)
				c.DefaultQueryExecMode = mode
			})
			for i := range 3 {
				qctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				start := time.Now()
				_, err := conn.Exec(qctx, "select pg_sleep(5)")
				elapsed := time.Since(start)
				cancel()
				t.Logf("round %d: returned after %s: %v", i, elapsed, err)
				if pgCode(err) != "57014" {
					t.Fatalf("round %d: got %v, want 57014 (query_canceled)", i, err)
				}
				if elapsed > 4*time.Second {
					t.Fatalf("round %d: the query ran to completion (%s): not cancelled", i, elapsed)
				}
				var n int
				if err := conn.QueryRow(ctx, "select $1::int", i).Scan(&n); err != nil || n != i {
					t.Fatalf("round %d: after cancel: %d, %v", i, n, err)
				}
			}
		})
	}
	t.Run("explicit", func(t *testing.T) {
		pc := h.connect(ctx, t).PgConn()
		done := make(chan error, 1)
		go func() {
			_, err := pc.Exec(ctx, "select pg_sleep(60)").ReadAll()
			done <- err
		}()
		// A cancel that arrives before the query is lost, as it is
		// with PostgreSQL itself: wait until the server runs it.
		waitQuery(ctx, t, direct(ctx, t, h.cluster), "select pg_sleep(60)")
		if err := pc.CancelRequest(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if ctx.Err() != nil {
				t.Fatalf("query not cancelled before the test's deadline: %v", err)
			}
			if pgCode(err) != "57014" {
				t.Fatalf("got %v, want 57014", err)
			}
		case <-ctx.Done():
			t.Fatal("query not cancelled")
		}
		if _, err := pc.Exec(ctx, "select 1").ReadAll(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("inside transaction", func(t *testing.T) {
		conn := h.connectWith(ctx, t, cancelHandler)
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		qctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err = tx.Exec(qctx, "select pg_sleep(5)")
		cancel()
		if pgCode(err) != "57014" {
			t.Fatalf("got %v, want 57014", err)
		}
		if _, err := tx.Exec(ctx, "select 1"); pgCode(err) != "25P02" {
			t.Fatalf("after cancel inside tx: got %v, want 25P02", err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestCopy runs COPY FROM STDIN with pgx and pgconn, COPY TO STDOUT, and a
// COPY that fails on a bad row.
func TestCopy(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2})
	ctx := testCtx(t, 2*time.Minute)
	if err := h.cluster.Exec(ctx, "drop table if exists copy_t; create table copy_t (id int not null, v text)"); err != nil {
		t.Fatal(err)
	}
	stop := hammer(ctx, t, h, 2)
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("hammer: %v", err)
		}
	}()
	conn := h.connect(ctx, t)
	const n = 10000
	rows := make([][]any, n)
	for i := range rows {
		rows[i] = []any{i, fmt.Sprintf("pgx row %d", i)}
	}
	copied, err := conn.CopyFrom(ctx, pgx.Identifier{"copy_t"}, []string{"id", "v"}, pgx.CopyFromRows(rows))
	if err != nil || copied != n {
		t.Fatalf("pgx CopyFrom: %d, %v", copied, err)
	}

	var text bytes.Buffer
	for i := range n {
		fmt.Fprintf(&text, "%d\tpgconn row %d\n", n+i, i)
	}
	tag, err := conn.PgConn().CopyFrom(ctx, &text, "COPY copy_t FROM STDIN")
	if err != nil || tag.RowsAffected() != n {
		t.Fatalf("pgconn CopyFrom: %v, %v", tag, err)
	}

	var out bytes.Buffer
	tag, err = conn.PgConn().CopyTo(ctx, &out, "COPY copy_t TO STDOUT")
	if err != nil || tag.RowsAffected() != 2*n {
		t.Fatalf("CopyTo: %v, %v", tag, err)
	}
	if lines := bytes.Count(out.Bytes(), []byte("\n")); lines != 2*n {
		t.Fatalf("CopyTo: %d lines, want %d", lines, 2*n)
	}

	// A bad row fails the COPY cleanly.
	bad := strings.NewReader("1\tok\nnot-a-number\tbad\n")
	if _, err := conn.PgConn().CopyFrom(ctx, bad, "COPY copy_t FROM STDIN"); pgCode(err) != "22P02" {
		t.Fatalf("bad text row: got %v, want 22P02", err)
	}
	badRows := [][]any{{1, "fine"}, {nil, "null id"}}
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"copy_t"}, []string{"id", "v"}, pgx.CopyFromRows(badRows)); pgCode(err) != "23502" {
		t.Fatalf("bad binary row: got %v, want 23502", err)
	}
	// Inside a transaction, a failed COPY aborts it.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Conn().PgConn().CopyFrom(ctx, strings.NewReader("x\n"), "COPY copy_t FROM STDIN"); pgCode(err) != "22P02" {
		t.Fatalf("bad row in tx: %v", err)
	}
	if _, err := tx.Exec(ctx, "select 1"); pgCode(err) != "25P02" {
		t.Fatalf("after failed COPY in tx: %v", err)
	}
	_ = tx.Rollback(ctx)

	var count int
	if err := conn.QueryRow(ctx, "select count(*) from copy_t").Scan(&count); err != nil || count != 2*n {
		t.Fatalf("count after failures: %d, %v", count, err)
	}
	h.waitNoneInUse(t)
}

// TestClientKilledMidTransaction closes a client's TCP connection inside a
// transaction: with one server connection, the next client must see neither
// the uncommitted row nor the transaction's SET LOCAL.
func TestClientKilledMidTransaction(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	if err := h.cluster.Exec(ctx, "drop table if exists kill_t; create table kill_t (x int)"); err != nil {
		t.Fatal(err)
	}
	t.Run("idle in transaction", func(t *testing.T) {
		a := h.connect(ctx, t)
		for _, sql := range []string{"begin", "insert into kill_t values (1)", "set local statement_timeout = '1234ms'"} {
			if _, err := a.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		_ = a.PgConn().Conn().Close()
		b := h.connect(ctx, t)
		var n int
		var timeout string
		if err := b.QueryRow(ctx, "select count(*) from kill_t").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if err := b.QueryRow(ctx, "show statement_timeout").Scan(&timeout); err != nil {
			t.Fatal(err)
		}
		if n != 0 || timeout == "1234ms" {
			t.Fatalf("dirty server connection: %d rows, statement_timeout %s", n, timeout)
		}
		h.waitNoneInUse(t)
	})
	t.Run("query running", func(t *testing.T) {
		a := h.connect(ctx, t)
		if _, err := a.Exec(ctx, "begin"); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Exec(ctx, "insert into kill_t values (2)"); err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(300 * time.Millisecond)
			_ = a.PgConn().Conn().Close()
		}()
		_, _ = a.Exec(ctx, "select pg_sleep(10)")
		b := h.connect(ctx, t)
		start := time.Now()
		var n int
		if err := b.QueryRow(ctx, "select count(*) from kill_t").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("uncommitted row visible: %d", n)
		}
		t.Logf("next client served after %s", time.Since(start))
		h.waitNoneInUse(t)
	})
}

// TestBackendsTerminated kills every server connection from outside: idle
// clients keep working, and new clients too.
func TestBackendsTerminated(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 4, minPool: 4})
	ctx := testCtx(t, time.Minute)
	clients := make([]*pgx.Conn, 6)
	for i := range clients {
		clients[i] = h.connect(ctx, t)
		if _, err := clients[i].Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
	}
	d := direct(ctx, t, h.cluster)
	sleeper := h.connect(ctx, t)
	sleepErr := make(chan error, 1)
	go func() {
		_, err := sleeper.Exec(ctx, "select pg_sleep(10)")
		sleepErr <- err
	}()
	waitQuery(ctx, t, d, "select pg_sleep(10)")
	killAll(ctx, t, d)
	select {
	case err := <-sleepErr:
		if c := pgCode(err); c != "57P01" && c != "08006" {
			t.Errorf("client mid-query: got %v, want 57P01 or 08006", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("client mid-query not told its server connection died")
	}
	for i, c := range clients {
		var n int
		if err := c.QueryRow(ctx, "select $1::int", i).Scan(&n); err != nil || n != i {
			t.Errorf("idle client %d after terminate: %d, %v", i, n, err)
		}
	}
	h.checkServing(ctx, t)
	h.waitNoneInUse(t)
}

// waitQuery waits until a backend runs sql.
func waitQuery(ctx context.Context, t testing.TB, d *pgx.Conn, sql string) int32 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var pid int32
		err := d.QueryRow(ctx, "select pid from pg_stat_activity where query = $1 and state = 'active'", sql).Scan(&pid)
		if err == nil {
			return pid
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no backend ran %q", sql)
	return 0
}

// killAll terminates every client backend but d's own and waits for them to
// be gone.
func killAll(ctx context.Context, t testing.TB, d *pgx.Conn) {
	t.Helper()
	rows, err := d.Query(ctx, "select pid from pg_stat_activity where pid <> pg_backend_pid() and backend_type = 'client backend'")
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Exec(ctx, "select pg_terminate_backend(pid) from pg_stat_activity where pid <> pg_backend_pid() and backend_type = 'client backend'"); err != nil {
		t.Fatal(err)
	}
	waitGone(ctx, t, d, pids...)
}

// waitGone waits until the server processes pids have exited.
func waitGone(ctx context.Context, t testing.TB, d *pgx.Conn, pids ...int32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left int
		if err := d.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = any($1)", pids).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d terminated backends still alive", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBackendKilledMidQuery terminates the server connection running one
// client's query: that client gets 57P01 or 08006, others are unaffected,
// and the pool replaces the connection.
func TestBackendKilledMidQuery(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2})
	ctx := testCtx(t, time.Minute)
	d := direct(ctx, t, h.cluster)
	victim := h.connect(ctx, t)
	stop := hammer(ctx, t, h, 3)
	errc := make(chan error, 1)
	go func() {
		_, err := victim.Exec(ctx, "select pg_sleep(10)")
		errc <- err
	}()
	pid := waitQuery(ctx, t, d, "select pg_sleep(10)")
	if _, err := d.Exec(ctx, "select pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if c := pgCode(err); c != "57P01" && c != "08006" {
			t.Errorf("victim: got %v, want 57P01 or 08006", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("victim not told its server connection died")
	}
	time.Sleep(200 * time.Millisecond)
	if err := stop(); err != nil {
		t.Errorf("other clients affected: %v", err)
	}
	// The pool is whole again: two transactions can hold both slots at once.
	a, b := h.connect(ctx, t), h.connect(ctx, t)
	ta, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pa, pb int32
	if err := ta.QueryRow(ctx, "select pg_backend_pid()").Scan(&pa); err != nil {
		t.Fatal(err)
	}
	if err := tb.QueryRow(ctx, "select pg_backend_pid()").Scan(&pb); err != nil {
		t.Fatalf("second slot not available after the kill: %v", err)
	}
	if pa == pb || pa == pid || pb == pid {
		t.Fatalf("pids %d %d (killed %d)", pa, pb, pid)
	}
	_ = ta.Commit(ctx)
	_ = tb.Commit(ctx)
	h.waitNoneInUse(t)
}

// TestServerRestart restarts PostgreSQL under the pooler: queries work again
// within a few seconds.
func TestServerRestart(t *testing.T) {
	h := newHarness(t, harnessOpts{poolSize: 4, minPool: 2})
	ctx := testCtx(t, 2*time.Minute)
	conn := h.connect(ctx, t)
	if _, err := conn.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	if err := h.cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		c, err := pgx.Connect(ctx, h.url())
		if err == nil {
			_, err = c.Exec(ctx, "select 1")
			_ = c.Close(ctx)
			if err == nil {
				last = nil
				break
			}
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	if last != nil {
		t.Fatalf("pooler not serving 15s after restart: %v", last)
	}
	// The client connected before the restart keeps working (its idle
	// session held no server connection), maybe after one failure.
	if _, err := conn.Exec(ctx, "select 1"); err != nil {
		t.Logf("old client, first query after restart: %v", err)
		if conn.IsClosed() {
			t.Fatalf("old client closed by the restart: %v", err)
		}
		if _, err := conn.Exec(ctx, "select 1"); err != nil {
			t.Fatalf("old client, second query after restart: %v", err)
		}
	}
	h.waitNoneInUse(t)
}
