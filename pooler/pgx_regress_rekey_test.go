package pooler_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/pooler"
)

// TestSessionModePIDAfterQuickReconnect: in session mode a client is told
// its server's own process ID, so pg_terminate_backend(conn.PID()) and
// pg_stat_activity mean what it expects (pgx's TestFatalTxError,
// TestFatalRxError, TestConnCheckConn...). When a client reconnects right
// after another left the same server connection, the leaving session is
// still registered under that PID for a moment; the newcomer must not fall
// back to an invented PID then. Found by pgx's own suite: TestFatalTxError
// sometimes got "Expected error but none occurred" because it terminated a
// PID no server had.
func TestSessionModePIDAfterQuickReconnect(t *testing.T) {
	// One server connection: every session gets the same one, back to back.
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{Mode: pooler.ModeSession}})
	ctx := testCtx(t, 2*time.Minute)
	bad := 0
	const rounds = 100
	for i := range rounds {
		conn, err := pgx.Connect(ctx, h.url())
		if err != nil {
			t.Fatalf("round %d: connect: %v", i, err)
		}
		var backend uint32
		if err := conn.QueryRow(ctx, "select pg_backend_pid()").Scan(&backend); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if got := conn.PgConn().PID(); got != backend {
			bad++
			if bad <= 3 {
				t.Errorf("round %d: BackendKeyData PID %d, but the session runs on server process %d", i, got, backend)
			}
		}
		// Close without waiting, so the next session logs in while this one
		// is still being torn down.
		_ = conn.Close(ctx)
	}
	if bad > 0 {
		t.Errorf("%d of %d sessions were not given their server's PID", bad, rounds)
	}
}

// TestSessionModeStaleCancelKey: a client that has left must not be able to
// cancel the queries of the next client that got the same server connection.
// PostgreSQL gives every session a fresh process and key, so a stale
// CancelRequest matches nothing; through the pooler the next session is
// handed the same server's PID and key, so the departed client's key (which
// pgx sends from a goroutine when a context expires, possibly after Close)
// now cancels someone else's work.
func TestSessionModeStaleCancelKey(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{Mode: pooler.ModeSession}})
	ctx := testCtx(t, 2*time.Minute)

	a, err := pgx.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	pid, key := a.PgConn().PID(), append([]byte(nil), a.PgConn().SecretKey()...)
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Let a's session end completely, so b is given the server's key.
	h.waitSessions(t, 0)

	b := h.connect(ctx, t)
	done := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, "select pg_sleep(3)")
		done <- err
	}()
	time.Sleep(500 * time.Millisecond) // b's query is running
	sendCancel(ctx, t, h.ln.Addr().String(), pid, key)
	if err := <-done; err != nil {
		t.Fatalf("a departed client's CancelRequest (pid %d) canceled the next session's query: %v", pid, err)
	}
}

// sendCancel sends a CancelRequest to the pooler at addr.
func sendCancel(ctx context.Context, t *testing.T, addr string, pid uint32, key []byte) {
	t.Helper()
	nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msg, err := (&pgproto3.CancelRequest{ProcessID: pid, SecretKey: key}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(msg); err != nil {
		t.Fatal(err)
	}
	// The pooler closes the connection once the request is handled.
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = nc.Read(make([]byte, 1))
}
