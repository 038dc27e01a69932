package backend

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testCtx returns a context with a generous timeout for one test.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// testLogger logs to stderr when -v is set, so failures come with context.
func testLogger(t *testing.T) *slog.Logger {
	t.Helper()
	if !testing.Verbose() {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// result is what simpleQuery saw: the first column of each DataRow and the
// SQLSTATE of an ErrorResponse, if any.
type result struct {
	rows []string
	code string
}

// sendQuery writes a simple-protocol Query through c.W and flushes it.
func sendQuery(c *Conn, sql string) error {
	msg := wire.AppendHeader(nil, 'Q', len(sql)+1)
	msg = append(msg, sql...)
	msg = append(msg, 0)
	if _, err := c.W.Write(msg); err != nil {
		return err
	}
	return c.W.Flush()
}

// readResult reads messages through c.R until ReadyForQuery.
func readResult(c *Conn) (result, error) {
	var r result
	for {
		typ, _, err := c.R.Next()
		if err != nil {
			return r, err
		}
		switch typ {
		case 'D':
			body, err := c.R.Body()
			if err != nil {
				return r, err
			}
			if len(body) < 6 {
				return r, fmt.Errorf("short DataRow")
			}
			n := int32(binary.BigEndian.Uint32(body[2:6]))
			if n < 0 {
				r.rows = append(r.rows, "NULL")
			} else {
				r.rows = append(r.rows, string(body[6:6+n]))
			}
		case 'E':
			body, err := c.R.Body()
			if err != nil {
				return r, err
			}
			for len(body) > 0 && body[0] != 0 {
				f := body[0]
				val, rest, ok := wire.CString(body[1:])
				if !ok {
					break
				}
				if f == 'C' {
					r.code = string(val)
				}
				body = rest
			}
		case 'Z':
			body, err := c.R.Body()
			if err != nil {
				return r, err
			}
			if len(body) != 1 || body[0] != 'I' {
				return r, fmt.Errorf("ReadyForQuery status %q", body)
			}
			return r, nil
		default:
			if err := c.R.Skip(); err != nil {
				return r, err
			}
		}
	}
}

// query runs sql on c and returns the first column of each row, failing the
// test on any error.
func query(t *testing.T, c *Conn, sql string) []string {
	t.Helper()
	if err := c.NetConn().SetDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.NetConn().SetDeadline(time.Time{}) }()
	if err := sendQuery(c, sql); err != nil {
		t.Fatalf("send %q: %v", sql, err)
	}
	r, err := readResult(c)
	if err != nil {
		t.Fatalf("read %q: %v", sql, err)
	}
	if r.code != "" {
		t.Fatalf("%q failed with SQLSTATE %s", sql, r.code)
	}
	return r.rows
}

// superQuery runs sql over a fresh pgconn connection and returns the first
// column of each row.
func superQuery(ctx context.Context, t *testing.T, url, sql string) []string {
	t.Helper()
	conn, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	results, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		t.Fatalf("%q: %v", sql, err)
	}
	var out []string
	for _, res := range results {
		for _, row := range res.Rows {
			out = append(out, string(row[0]))
		}
	}
	return out
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// discard drains r, for fake servers.
func discard(r io.Reader) { _, _ = io.Copy(io.Discard, r) }
