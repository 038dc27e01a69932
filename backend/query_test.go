package backend

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/pgtest"
)

const testTimeout = 10 * time.Second

// TestConnQuery: Query hands over every row, returns the server's error
// as a *ServerError, rolls back a block its failure left open, and leaves
// the connection idle and usable in every case.
func TestConnQuery(t *testing.T) {
	ctx := testCtx(t)
	pg := appCluster(t, pgtest.AuthSCRAM, false)
	p := newTestPool(t, PoolConfig{ConnString: pg.URL("app", appPassword, "postgres"), PoolSize: 1}, nil)
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	var got []string
	row := func(body []byte) error {
		if binary.BigEndian.Uint16(body) != 1 {
			return errors.New("not one column")
		}
		got = append(got, string(body[6:]))
		return nil
	}
	if err := c.Query(ctx, testTimeout, "SELECT g::text FROM generate_series(1, 3) g", row); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != "1" || got[2] != "3" {
		t.Fatalf("rows %q, want 1 2 3", got)
	}
	for _, q := range []string{
		"SELECT 1/0",
		"BEGIN; SELECT 1/0; COMMIT",
		"BEGIN; SET LOCAL work_mem = '1MB'; SELECT 1/0; COMMIT",
	} {
		err := c.Query(ctx, testTimeout, q, nil)
		var se *ServerError
		if !errors.As(err, &se) {
			t.Fatalf("%s: %v, want a *ServerError", q, err)
		}
		got = nil
		if err := c.Query(ctx, testTimeout, "SELECT current_setting('work_mem') || ' ' || (now() = statement_timestamp())::text", row); err != nil {
			t.Fatalf("after %s: %v", q, err)
		}
		if len(got) != 1 || got[0] != "4MB true" {
			t.Fatalf("after %s: %q, want the default work_mem outside any block", q, got)
		}
	}
	if err := c.Query(ctx, testTimeout, "SELECT 1", nil); err == nil {
		t.Fatal("a row with no row function: no error")
	}
	if err := c.ping(ctx, testTimeout); err != nil {
		t.Fatalf("ping after the error: %v", err)
	}
}
