package pooler_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestClientLeavesWhileServerSkips: a client inside a transaction sends a
// failing message without Sync, sees the error (after Flush) and vanishes.
// The server ignores everything but Sync at that point, so the pooler's
// cleanup must send one before its ROLLBACK; the connection then goes back
// clean and quickly (not only after the cleanup timeout).
func TestClientLeavesWhileServerSkips(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", h.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	fe := pgproto3.NewFrontend(nc, nc)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": "postgres", "database": "postgres"}})
	mustFlush(t, fe)
	readUntilReady(t, fe)
	fe.Send(&pgproto3.Query{String: "BEGIN; CREATE TEMP TABLE IF NOT EXISTS leftover(x int); INSERT INTO leftover VALUES (1)"})
	mustFlush(t, fe)
	if st := readUntilReady(t, fe); st != 'T' {
		t.Fatalf("status %q after BEGIN, want T", st)
	}
	fe.Send(&pgproto3.Parse{Query: "select * from no_such_table"})
	fe.Send(&pgproto3.Flush{})
	mustFlush(t, fe)
	if msg, err := fe.Receive(); err != nil {
		t.Fatal(err)
	} else if _, ok := msg.(*pgproto3.ErrorResponse); !ok {
		t.Fatalf("want ErrorResponse, got %T", msg)
	}
	_ = nc.Close() // leave while the server skips to Sync

	start := time.Now()
	qctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	b := h.connect(qctx, t)
	var open int
	if err := b.QueryRow(qctx, "select count(*) from pg_stat_activity where state like 'idle in transaction%'").Scan(&open); err != nil {
		t.Fatalf("next client on the only server connection: %v (after %s)", err, time.Since(start))
	}
	if open != 0 {
		t.Fatalf("%d server sessions still in a transaction", open)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Fatalf("the server connection came back only after %s", elapsed)
	}
}

func mustFlush(t *testing.T, fe *pgproto3.Frontend) {
	t.Helper()
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
}
