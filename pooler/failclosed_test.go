package pooler_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
)

// Fail-closed session-state detection: whatever the pooler cannot prove
// harmless is treated as changing the session. Each case is one that once
// leaked: client A changes the session of the only server connection
// (pool size 1) in a way the lexer misread or could not see, leaves, and
// client B, on the same server process, must find it as A found it: the
// login identity, the default search_path and no temporary table.

// failClosedRole is a superuser role, so that switching to it changes no
// reported parameter (is_superuser stays on) and only the pooler's own
// reading can notice it.
const failClosedRole = "failclosed_r2"

// sessionView reads what a borrower of a server connection sees of the
// session an earlier borrower may have left behind, and the server
// process it runs on.
const sessionView = "SELECT pg_catalog.pg_backend_pid()::text || ' ' || current_user || ' ' || session_user || ' ' ||" +
	" pg_catalog.current_setting('search_path') || ' temp=' ||" +
	" (SELECT pg_catalog.count(*) FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema())"

// failClosedSetup creates the role and the routines the cases use.
func failClosedSetup(ctx context.Context, t *testing.T, c *pgtest.Cluster) {
	t.Helper()
	setup := "DROP ROLE IF EXISTS " + failClosedRole + "; CREATE ROLE " + failClosedRole + " SUPERUSER NOLOGIN;" +
		" CREATE OR REPLACE FUNCTION public.failclosed_fn() RETURNS int LANGUAGE plpgsql AS" +
		" $$BEGIN PERFORM pg_catalog.set_config('search_path', 'evil', false);" +
		" PERFORM pg_catalog.set_config('role', '" + failClosedRole + "', false); RETURN 1; END$$;" +
		" CREATE OR REPLACE FUNCTION public.failclosed_noop() RETURNS int LANGUAGE sql AS 'SELECT 1';" +
		" CREATE OR REPLACE PROCEDURE public.failclosed_proc() LANGUAGE plpgsql AS" +
		" $$BEGIN PERFORM pg_catalog.set_config('search_path', 'evil', false); END$$"
	if err := c.Exec(ctx, setup); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Exec(cctx, "DROP FUNCTION IF EXISTS public.failclosed_fn(); DROP FUNCTION IF EXISTS public.failclosed_noop();"+
			" DROP PROCEDURE IF EXISTS public.failclosed_proc();"+
			" DROP ROLE IF EXISTS "+failClosedRole); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

// TestFailClosedNextClient runs each leak with pool size 1: A changes the
// session and leaves, B must see the server process as A first saw it.
func TestFailClosedNextClient(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, 3*time.Minute)
	failClosedSetup(ctx, t, cluster)

	sql := func(q string) func(context.Context, *testing.T, *pgconn.PgConn) {
		return func(ctx context.Context, t *testing.T, a *pgconn.PgConn) {
			// Refused (0A000) or run: either way B must not see it.
			_, err := a.Exec(ctx, q).ReadAll()
			t.Logf("A: %s: %v", q, err)
		}
	}
	extended := func(q string) func(context.Context, *testing.T, *pgconn.PgConn) {
		return func(ctx context.Context, t *testing.T, a *pgconn.PgConn) {
			err := a.ExecParams(ctx, q, nil, nil, nil, nil).Read().Err
			t.Logf("A (extended): %s: %v", q, err)
		}
	}
	fcall := func(args ...string) func(context.Context, *testing.T, *pgconn.PgConn) {
		return func(ctx context.Context, t *testing.T, a *pgconn.PgConn) {
			if err := functionCall(ctx, t, a, "pg_catalog.set_config(text,text,boolean)", args...); err != nil {
				t.Fatalf("A: FunctionCall set_config%q: %v", args, err)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		attack func(context.Context, *testing.T, *pgconn.PgConn)
	}{
		// set_config arguments that are not exactly a constant.
		{"set_config is_local expression", sql("SELECT set_config('search_path', 'evil', true::boolean AND false)")},
		{"set_config name expression", sql("SELECT set_config('ro'::text || 'le', '" + failClosedRole + "', false)")},
		// FunctionCall messages and writes to pg_settings.
		{"FunctionCall set_config search_path", fcall("search_path", "evil", "false")},
		{"FunctionCall set_config role", fcall("role", failClosedRole, "false")},
		{"UPDATE pg_settings search_path", sql("UPDATE pg_settings SET setting = 'evil' WHERE name = 'search_path'")},
		{"WITH UPDATE pg_catalog.pg_settings", sql("WITH x AS (SELECT 1) UPDATE ONLY pg_catalog.pg_settings SET setting = 'evil' WHERE name = 'search_path'")},
		// Temporary tables created by SELECT INTO.
		{"SELECT INTO pg_temp", sql("SELECT 1 AS x INTO pg_temp.leak")},
		{"SELECT INTO TABLE quoted pg_temp", sql(`SELECT 1 AS x INTO TABLE "pg_temp".leak`)},
		{"CREATE TABLE pg_temp AS", sql("CREATE TABLE pg_temp.leak AS SELECT 1 AS x")}, // caught before too
		// Unqualified names land in pg_temp when search_path lists it first.
		{"CREATE TABLE under search_path pg_temp", sql("SET search_path = pg_temp, public; CREATE TABLE leak (a int)")},
		{"SELECT INTO under search_path pg_temp", sql("SET search_path = pg_temp; SELECT 1 AS x INTO leak")},
		// Functions, DO and CALL the lexer cannot see into.
		{"user function", sql("SELECT public.failclosed_fn()")},
		{"unqualified user function", sql("SELECT 1 FROM pg_catalog.generate_series(1, 1) WHERE failclosed_fn() = 1")},
		{"user function, extended protocol", extended("SELECT public.failclosed_fn()")},
		{"set_config name expression, extended protocol", extended("SELECT pg_catalog.set_config('ro' || 'le', '" + failClosedRole + "', false)")}, // caught before too
		{"DO", sql("DO $$BEGIN PERFORM pg_catalog.set_config('role', '" + failClosedRole + "', false); END$$")},
		{"CALL", sql("CALL public.failclosed_proc()")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, minPool: 1})
			a, err := pgconn.Connect(ctx, h.url())
			if err != nil {
				t.Fatal(err)
			}
			before := simpleOne(ctx, t, a, sessionView)
			tc.attack(ctx, t, a)
			if !a.IsClosed() {
				if err := a.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
			b, err := pgconn.Connect(ctx, h.url())
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close(context.Background())
			for _, view := range []func(context.Context, testing.TB, *pgconn.PgConn, string) string{simpleOne, extendedOne} {
				after := view(ctx, t, b, sessionView)
				if strings.HasPrefix(tc.name, "FunctionCall") {
					// A's connection is closed when A leaves, not reset
					// (handleFunctionCall: the OID may be setseed's). B
					// runs on a new server process: compare all but the
					// process ID, which must differ.
					bpid, bview, _ := strings.Cut(after, " ")
					apid, aview, _ := strings.Cut(before, " ")
					if bpid == apid {
						t.Errorf("B runs on A's server process %s, which should have been closed", apid)
					}
					after, before := bview, aview
					if after != before {
						t.Errorf("B sees %q, A saw %q before", after, before)
					}
					continue
				}
				if after != before {
					t.Errorf("B sees %q, A saw %q before", after, before)
				}
			}
		})
	}
}

// TestOpaqueHarmlessNotPinned: a DO block or a user function that changes
// nothing is probed, not pinned: with pool size 1 another client gets the
// server connection while the first is still connected, and a role changed
// inside a transaction block with SET LOCAL is gone by the probe.
func TestOpaqueHarmlessNotPinned(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	failClosedSetup(ctx, t, cluster)
	reg := prometheus.NewRegistry()
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, minPool: 1, reg: reg})
	a, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	b, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	for _, q := range []string{
		"SELECT public.failclosed_noop()",
		"DO $$BEGIN NULL; END$$",
		"BEGIN; SET LOCAL ROLE " + failClosedRole + "; SELECT failclosed_noop(); COMMIT",
	} {
		if _, err := a.Exec(ctx, q).ReadAll(); err != nil {
			t.Fatalf("A: %s: %v", q, err)
		}
		// B needs the only server connection: A must have let it go.
		if got := simpleOne(ctx, t, b, "SELECT current_user || ' ' || current_setting('search_path')"); got != cluster.SuperUser+` "$user", public` {
			t.Errorf("after %s, B sees %q", q, got)
		}
	}
	if n := metricValue(t, reg, "pgquic_pooler_pins_total", ""); n != 0 {
		t.Errorf("%v pins after statements that changed nothing", n)
	}
}

// TestOpaquePinReasons: a FunctionCall pins its client with reason
// "opaque" at once; a DO block that changes the role pins with reason
// "role" once the probe after it has read the identity; and the pinned
// client keeps the role it chose, on its own server connection.
func TestOpaquePinReasons(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	failClosedSetup(ctx, t, cluster)
	reg := prometheus.NewRegistry()
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 2, reg: reg})
	waitPin := func(reason string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for metricValue(t, reg, "pgquic_pooler_pins_total", reason) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("pins_total{reason=%q} = %v, want 1", reason, metricValue(t, reg, "pgquic_pooler_pins_total", reason))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	f, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	if err := functionCall(ctx, t, f, "pg_catalog.now()"); err != nil {
		t.Fatal(err)
	}
	waitPin("opaque")

	d, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	if _, err := d.Exec(ctx, "DO $$BEGIN PERFORM pg_catalog.set_config('role', '"+failClosedRole+"', false); END$$").ReadAll(); err != nil {
		t.Fatal(err)
	}
	waitPin("role")
	// Before the pin the client's statements may run on either of the two
	// server connections, so the backend it is pinned to is the one its
	// first statement after the pin reports; every later one must match.
	first := simpleOne(ctx, t, d, "SELECT current_user || ' ' || pg_backend_pid()")
	if role, _, _ := strings.Cut(first, " "); role != failClosedRole {
		t.Fatalf("the client pinned by its DO block runs as %q, want role %s", first, failClosedRole)
	}
	for range 3 {
		if got := simpleOne(ctx, t, d, "SELECT current_user || ' ' || pg_backend_pid()"); got != first {
			t.Errorf("the client pinned by its DO block runs as %q, want %q", got, first)
		}
	}
	// The role stays with the pinned client: another client gets the other
	// server connection and runs as the login user.
	e, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	_, pinnedPID, _ := strings.Cut(first, " ")
	got := simpleOne(ctx, t, e, "SELECT current_user || ' ' || pg_backend_pid()")
	if role, pid, _ := strings.Cut(got, " "); role != cluster.SuperUser || pid == pinnedPID {
		t.Errorf("another client runs as %q, want %s on a server process other than the pinned %s", got, cluster.SuperUser, pinnedPID)
	}
}

// functionCall sends one FunctionCall message for the function fn (a
// regprocedure) with text arguments on pc, which it takes over and closes,
// and returns the server's error, if any.
func functionCall(ctx context.Context, t *testing.T, pc *pgconn.PgConn, fn string, args ...string) error {
	t.Helper()
	oid, err := strconv.ParseUint(simpleOne(ctx, t, pc, "SELECT '"+fn+"'::pg_catalog.regprocedure::pg_catalog.oid"), 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := pc.Hijack()
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Conn.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = hc.Conn.SetDeadline(d)
	}
	call := &pgproto3.FunctionCall{Function: uint32(oid), ArgFormatCodes: []uint16{0}}
	for _, a := range args {
		call.Arguments = append(call.Arguments, []byte(a))
	}
	hc.Frontend.Send(call)
	if err := hc.Frontend.Flush(); err != nil {
		t.Fatal(err)
	}
	var serverErr error
	for {
		msg, err := hc.Frontend.Receive()
		if err != nil {
			t.Fatalf("FunctionCall: %v", err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			serverErr = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ReadyForQuery:
			hc.Frontend.Send(&pgproto3.Terminate{})
			_ = hc.Frontend.Flush()
			return serverErr
		}
	}
}

// TestFunctionCallRefusedWithSessionStateError: with SessionStateError a
// FunctionCall outside a transaction block is answered with 0A000 and a
// ReadyForQuery, without reaching the server.
func TestFunctionCallRefusedWithSessionStateError(t *testing.T) {
	cluster := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	h := newHarness(t, harnessOpts{cluster: cluster, poolSize: 1, cfg: pooler.Config{SessionState: pooler.SessionStateError}})
	connect := func() *pgconn.PgConn {
		c, err := pgconn.Connect(ctx, h.url())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	err := functionCall(ctx, t, connect(), "pg_catalog.set_config(text,text,boolean)", "search_path", "evil", "false")
	if pgCode(err) != "0A000" {
		t.Fatalf("FunctionCall outside a block: %v, want 0A000", err)
	}
	b := connect()
	defer b.Close(context.Background())
	if got := simpleOne(ctx, t, b, "SHOW search_path"); got != `"$user", public` {
		t.Errorf("search_path after a refused FunctionCall: %q", got)
	}
}

// TestTerminateBackendNotPipelined: a request calling
// pg_terminate_backend(pg_backend_pid()) ends its own server process; no
// other client's request may be written behind it on that connection, so
// a plain query issued while it runs waits for a connection and succeeds.
func TestTerminateBackendNotPipelined(t *testing.T) {
	h, reg := pipeHarness(t, 1, 10*time.Second)
	// The kind of the killing request is known fast, as is the plain one.
	ctx, w := warmClient(t, h, "SELECT pg_sleep(0), pg_terminate_backend(pg_backend_pid() + 1000000), 'warm'")
	warm(ctx, t, w, "SELECT 1")
	base := metricValue(t, reg, pipelinedMetric, "")

	a, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Exec(ctx, "SELECT pg_sleep(0.5), pg_terminate_backend(pg_backend_pid() + 0), 'a'").ReadAll()
		aDone <- err
	}()
	waitRunning(ctx, t, h, "a")
	res, err := w.Exec(ctx, "SELECT 1").ReadAll()
	if err != nil {
		t.Errorf("a plain query issued while another client's request terminates its server process: %v", err)
	} else if len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "1" {
		t.Errorf("plain query: %v", res)
	}
	if err := <-aDone; err == nil {
		t.Errorf("A's request ended its own server process without an error")
	}
	if got := metricValue(t, reg, pipelinedMetric, ""); got != base {
		t.Errorf("%v requests pipelined behind pg_terminate_backend", got-base)
	}
}
