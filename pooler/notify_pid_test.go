package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgquic/pgquic/pooler"
)

// TestNotifyOwnPID: a client's NOTIFY to a channel it LISTENs on comes
// back with the PID the client was given, as directly (psycopg's
// test_notify compares it with its backend_pid), not the server
// connection's PID, in transaction mode.
func TestNotifyOwnPID(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2, cfg: pooler.Config{Mode: pooler.ModeTransaction}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := h.connect(ctx, t)
	if _, err := conn.Exec(ctx, "LISTEN own_pid"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "NOTIFY own_pid, 'x'"); err != nil {
		t.Fatal(err)
	}
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := conn.PgConn().PID(); n.PID != want || n.Payload != "x" {
		t.Fatalf("notification PID %d payload %q, want the client's PID %d and x", n.PID, n.Payload, want)
	}
	// Another client's NOTIFY keeps its sender's server PID, which is not
	// the listener's.
	other := h.connect(ctx, t)
	if _, err := other.Exec(ctx, "NOTIFY own_pid, 'y'"); err != nil {
		t.Fatal(err)
	}
	n, err = conn.WaitForNotification(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.PID == conn.PgConn().PID() || n.Payload != "y" {
		t.Fatalf("another client's notification: PID %d payload %q", n.PID, n.Payload)
	}
}
