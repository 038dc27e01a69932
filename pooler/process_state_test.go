package pooler_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/pooler"
)

// TestProcessState: a call whose effect stays with the server process
// (sqllex.ProcessState: setseed, pg_backup_start, a temporary replication
// slot, dblink_connect) is seen by no probe and undone by no reset query,
// DISCARD ALL included. Before 2026-12-07 such a client was unpinned by
// the probe that followed the opaque call, and the next borrower of the
// process found its random() sequence seeded, its backup in progress or
// its slot (TestHostileSessionBuiltins found the first two). Now the
// client is pinned (reason "process") for the rest of its session and
// keeps what it did, other clients run on other server processes, and
// when it leaves its connection is closed, which ends the process and all
// of it; in session mode too, where the connection would otherwise be
// reset and lent again. With session_state "error" the call is refused
// outside a transaction block, as the other pinning statements are.
func TestProcessState(t *testing.T) {
	c := sharedCluster(t)

	// seeded returns the first two values of random() after setseed(0.25),
	// as PostgreSQL gives them on a connection of its own.
	seeded := func(ctx context.Context, t *testing.T) (first, second string) {
		d, _ := startRaw(ctx, t, clusterAddr(c), nil)
		defer d.send(&pgproto3.Terminate{})
		noErrors(t, "setseed directly", q(d, "SELECT setseed(0.25)"))
		return one(t, d, "SELECT random()::text"), one(t, d, "SELECT random()::text")
	}
	// gone waits until the server process pid has ended and no slot named
	// slot is left, or fails after 10 s.
	gone := func(ctx context.Context, t *testing.T, pid, slot string) {
		t.Helper()
		d, _ := startRaw(ctx, t, clusterAddr(c), nil)
		defer d.send(&pgproto3.Terminate{})
		check := "SELECT (SELECT count(*) FROM pg_stat_activity WHERE pid = " + pid + ")::text || '/' || " +
			"(SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + slot + "')::text"
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := one(t, d, check)
			if got == "0/0" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("server process %s and slot %s after the client left (processes/slots): %s, want 0/0", pid, slot, got)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	t.Run("Transaction", func(t *testing.T) {
		ctx := withTimeout(t, time.Minute)
		reg := prometheus.NewRegistry()
		h := newHarness(t, harnessOpts{cluster: c, poolSize: 2, minPool: 1, reg: reg})
		first, second := seeded(ctx, t)
		b, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
		a, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
		noErrors(t, "B's setseed", q(b, "SELECT setseed(0.25)"))
		pid := hostilePID(t, b)
		if v := metricValue(t, reg, "pgquic_pooler_pins_total", "process"); v != 1 {
			t.Fatalf("pins_total{reason=process} = %v after setseed, want 1", v)
		}
		// B keeps its sequence in its next transactions, on its process.
		if got := one(t, b, "SELECT random()::text"); got != first {
			t.Errorf("B's first random() after its setseed: %s, want %s", got, first)
		}
		const slot = "pgq_process_state_slot"
		noErrors(t, "B's temporary slot", q(b, "SELECT 'made' FROM pg_create_physical_replication_slot('"+slot+"', true, true)"))
		if got := hostilePID(t, b); got != pid {
			t.Fatalf("B moved from server process %s to %s while pinned", pid, got)
		}
		// A never runs on B's process, and its random() is not B's next.
		for range 5 {
			if got := hostilePID(t, a); got == pid {
				t.Fatalf("LEAK: A ran on B's server process %s while B was pinned by setseed", pid)
			}
		}
		if got := one(t, a, "SELECT random()::text"); got == second {
			t.Errorf("LEAK: A's random() is B's seeded sequence's next value %s", got)
		}
		b.send(&pgproto3.Terminate{})
		gone(ctx, t, pid, slot)
		if v := metricValue(t, reg, "pgquic_pooler_pinned_clients", ""); v != 0 {
			t.Errorf("pinned clients after B left: %v, want 0", v)
		}
		noErrors(t, "A after B left", q(a, "SELECT 1"))
	})

	t.Run("Session", func(t *testing.T) {
		ctx := withTimeout(t, time.Minute)
		h := newHarness(t, harnessOpts{cluster: c, poolSize: 1, cfg: pooler.Config{Mode: pooler.ModeSession}})
		first, _ := seeded(ctx, t)
		b, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
		noErrors(t, "B's setseed", q(b, "SELECT setseed(0.25)"))
		pid := hostilePID(t, b)
		b.send(&pgproto3.Terminate{})
		gone(ctx, t, pid, "pgq_process_state_none")
		a, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
		if got := hostilePID(t, a); got == pid {
			t.Fatalf("LEAK: the next session-mode client got B's server process %s", pid)
		}
		if got := one(t, a, "SELECT random()::text"); got == first {
			t.Errorf("LEAK: the next client's random() is B's seeded sequence's first value %s", got)
		}
	})

	// A FunctionCall names its function by OID, here setseed's: the
	// client is pinned (opaque) and its connection closed when it leaves,
	// in either mode.
	for _, mode := range []pooler.Mode{pooler.ModeTransaction, pooler.ModeSession} {
		t.Run("FunctionCall/"+string(mode), func(t *testing.T) {
			ctx := withTimeout(t, time.Minute)
			h := newHarness(t, harnessOpts{cluster: c, poolSize: 1, cfg: pooler.Config{Mode: mode}})
			first, _ := seeded(ctx, t)
			d, _ := startRaw(ctx, t, clusterAddr(c), nil)
			oid := one(t, d, "SELECT 'setseed(double precision)'::regprocedure::oid::text")
			d.send(&pgproto3.Terminate{})
			n, err := strconv.ParseUint(oid, 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
			pid := hostilePID(t, b)
			noErrors(t, "B's FunctionCall of setseed", rawBatch(b, 1, &pgproto3.FunctionCall{Function: uint32(n),
				ArgFormatCodes: []uint16{0}, Arguments: [][]byte{[]byte("0.25")}}))
			if got := one(t, b, "SELECT random()::text"); got != first {
				t.Errorf("B's random() after its setseed by FunctionCall: %s, want %s", got, first)
			}
			b.send(&pgproto3.Terminate{})
			gone(ctx, t, pid, "pgq_process_state_none")
			a, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
			if got := one(t, a, "SELECT random()::text"); got == first {
				t.Errorf("LEAK: the next client's random() is B's seeded sequence's first value %s", got)
			}
		})
	}

	t.Run("RefusedUnderError", func(t *testing.T) {
		ctx := withTimeout(t, time.Minute)
		reg := prometheus.NewRegistry()
		h := newHarness(t, harnessOpts{cluster: c, poolSize: 2, reg: reg,
			cfg: pooler.Config{SessionState: pooler.SessionStateError}})
		b, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
		if got := q(b, "SELECT setseed(0.5)"); !slices.Contains(got, "E[ERROR 0A000]") {
			t.Fatalf("setseed outside a block with session_state error: %v, want ERROR 0A000", got)
		}
		if v := metricValue(t, reg, "pgquic_pooler_pinned_clients", ""); v != 0 {
			t.Fatalf("pinned after a refused setseed: %v", v)
		}
		// Inside a block it runs and pins, as the other pinning statements do.
		got := behind(b, qm("BEGIN"), qm("SELECT setseed(0.5)"), qm("COMMIT"))
		noErrors(t, "setseed inside a block", got)
		if v := metricValue(t, reg, "pgquic_pooler_pins_total", "process"); v != 1 {
			t.Errorf("pins_total{reason=process} after setseed in a block: %v, want 1", v)
		}
	})
}
