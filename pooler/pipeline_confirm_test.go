package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"
)

// Statements on a shared server connection are trusted only once the
// server confirms them (stmt.go serverState): a request pipelined behind
// another client's must never rely on a Parse of that client's that the
// server may still skip.

// sleepRequest is client A's request: a slow query, then an unnamed Parse
// of A's choosing, an error (a Describe of a portal that does not exist),
// and a Parse the server therefore skips, named name ("" for unnamed) with
// B's text, then Sync.
func sleepRequest(secs, mine, bait, name string) []pgproto3.FrontendMessage {
	return []pgproto3.FrontendMessage{
		&pgproto3.Parse{Query: "SELECT pg_sleep($1::float8)"},
		&pgproto3.Bind{Parameters: [][]byte{[]byte(secs)}},
		&pgproto3.Execute{},
		&pgproto3.Parse{Query: mine},
		&pgproto3.Describe{ObjectType: 'P', Name: "no such portal"},
		&pgproto3.Parse{Name: name, Query: bait},
		&pgproto3.Sync{},
	}
}

// waitSleeping waits until the server runs a pg_sleep of the pooler's.
func waitSleeping(ctx context.Context, t *testing.T, h *harness) {
	t.Helper()
	direct, err := pgx.Connect(ctx, h.cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE state = 'active' AND query LIKE 'SELECT pg_sleep($1::float8)%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow query never ran")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rowsOf returns the DataRows in a summarised reply.
func rowsOf(reply []string) []string {
	var out []string
	for _, m := range reply {
		if len(m) > 2 && m[:2] == "D[" {
			out = append(out, m)
		}
	}
	return out
}

// TestPipelineStatementsConfirmed is the cross-client statement confusion:
// with one server connection, B's request is written behind A's while A's
// slow query runs. A's request parses a statement the server skips after
// an error; B, relying on the statement that Parse claimed to create,
// must get its own statement's rows (unnamed) or its own statement at all
// (named), never A's rows or 26000.
func TestPipelineStatementsConfirmed(t *testing.T) {
	const mine = "SELECT 'A''s secret'::text"
	t.Run("unnamed", func(t *testing.T) {
		const bs = "SELECT 'B''s own'::text"
		ctx, h, reg, a, b := twoRawClients(t)
		// Make both kinds of request known fast, and leave B's unnamed
		// statement prepared.
		for range 6 {
			a.send(sleepRequest("0", mine, bs, "")...)
			a.untilZ()
			b.send(&pgproto3.Parse{Query: bs}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
			b.untilZ()
		}
		got := behindSlow(ctx, t, h, reg, a, b, sleepRequest("0.5", mine, bs, ""),
			&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
		if rows := rowsOf(got); len(rows) != 1 || rows[0] != "D[B's own]" {
			t.Errorf("B's Bind of its unnamed statement returned %v, want its own row", got)
		}
	})
	t.Run("named", func(t *testing.T) {
		const bait = "SELECT 'fresh'::text"
		ctx, h, reg, a, b := twoRawClients(t)
		for range 6 {
			a.send(sleepRequest("0", mine, "SELECT 'warm'::text", "")...)
			a.untilZ()
			// The shape of B's statement (constants do not count).
			a.send(&pgproto3.Parse{Query: "SELECT 'w'::text"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
			a.untilZ()
		}
		got := behindSlow(ctx, t, h, reg, a, b, sleepRequest("0.5", mine, bait, "a_stmt"),
			&pgproto3.Parse{Name: "b_stmt", Query: bait}, &pgproto3.Bind{PreparedStatement: "b_stmt"},
			&pgproto3.Execute{}, &pgproto3.Sync{})
		if rows := rowsOf(got); len(rows) != 1 || rows[0] != "D[fresh]" {
			t.Errorf("B's named statement gave %v, want ParseComplete, BindComplete, its row", got)
		}
	})
}

// twoRawClients starts a pooler with one server connection and two
// protocol-level clients of it.
func twoRawClients(t *testing.T) (context.Context, *harness, *prometheus.Registry, *rawConn, *rawConn) {
	t.Helper()
	h, reg := pipeHarness(t, 1, 10*time.Second)
	ctx := withTimeout(t, 60*time.Second)
	a, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
	b, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
	return ctx, h, reg, a, b
}

// behindSlow sends A's request, waits until its slow query runs, sends B's
// request and returns B's reply once both are answered. B's request must
// have been pipelined behind A's, or the test proves nothing.
func behindSlow(ctx context.Context, t *testing.T, h *harness, reg *prometheus.Registry, a, b *rawConn,
	aReq []pgproto3.FrontendMessage, bReq ...pgproto3.FrontendMessage) []string {
	t.Helper()
	base := metricValue(t, reg, pipelinedMetric, "")
	a.send(aReq...)
	waitSleeping(ctx, t, h)
	b.send(bReq...)
	got := b.untilZ()
	a.untilZ()
	if metricValue(t, reg, pipelinedMetric, "") <= base {
		t.Errorf("B's request was not pipelined behind A's, so the test proves nothing")
	}
	return got
}
