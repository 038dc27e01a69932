package pooler_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/pooler"
)

// Session state the pooler cannot move pins a transaction-mode client to
// its server connection (pin.go). These tests run over a pool of two
// server connections while other clients race for them.

// stateCase is one kind of unmovable session state: how a client creates
// it, how it checks (from any client) what its own server session holds,
// and what that check says where the state exists and where it does not.
type stateCase struct {
	name     string
	reason   string // pins_total label
	create   []string
	extended bool   // create through the extended protocol
	check    string // a query whose first column tells
	held     string // ...on the pinned client
	absent   string // ...on every other server session
	release  string // a statement after which nothing is held
}

var stateCases = []stateCase{
	{
		name: "CREATE TEMP TABLE", reason: "temp_table",
		create: []string{"CREATE TEMP TABLE pin_t (a int)", "INSERT INTO pin_t VALUES (1)"},
		check:  "SELECT CASE WHEN to_regclass('pin_t') IS NULL THEN 'none' ELSE (SELECT count(*)::text FROM pg_class WHERE relnamespace = pg_my_temp_schema()) END",
		held:   "1", absent: "none", release: "DISCARD TEMP",
	},
	{
		name: "CREATE TABLE pg_temp (extended protocol)", reason: "temp_table", extended: true,
		create: []string{"CREATE TABLE pg_temp.pin_t (a int)"},
		check:  "SELECT coalesce(to_regclass('pin_t')::text, 'none')",
		held:   "pin_t", absent: "none", release: "DROP TABLE pin_t",
	},
	{
		name: "SELECT INTO TEMP behind a comment", reason: "temp_table",
		create: []string{"/* SELECT 1; */ SELECT 1 AS a INTO TEMPORARY pin_t"},
		check:  "SELECT coalesce(to_regclass('pin_t')::text, 'none')",
		held:   "pin_t", absent: "none", release: "DISCARD ALL",
	},
	{
		name: "LISTEN in a multi-statement query", reason: "listen",
		create: []string{"SELECT 'LISTEN no_such' AS x; LISTEN \"Pin_Chan\"; SELECT $$;$$"},
		check:  "SELECT count(*)::text FROM pg_listening_channels()",
		held:   "1", absent: "0", release: "UNLISTEN *",
	},
	{
		name: "session advisory lock", reason: "advisory_lock",
		create: []string{"SELECT pg_advisory_lock(4242), pg_try_advisory_lock_shared(4243)"},
		check:  "SELECT count(*)::text FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
		held:   "2", absent: "0", release: "SELECT pg_advisory_unlock_all()",
	},
	{
		name: "DECLARE WITH HOLD", reason: "cursor_with_hold",
		create: []string{"DECLARE pin_c CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 1000) g"},
		check:  "SELECT count(*)::text FROM pg_cursors WHERE name = 'pin_c'",
		held:   "1", absent: "0", release: "CLOSE pin_c",
	},
	{
		name: "SQL PREPARE", reason: "prepare",
		create: []string{"PREPARE pin_p (int) AS SELECT $1 * 2"},
		check:  "SELECT count(*)::text FROM pg_prepared_statements WHERE from_sql",
		held:   "1", absent: "0", release: "DEALLOCATE ALL",
	},
	{
		name: "DO block", reason: "temp_table",
		create: []string{"DO $$BEGIN EXECUTE 'CREATE TEMP TABLE pin_t (a int)'; END$$"},
		check:  "SELECT coalesce(to_regclass('pin_t')::text, 'none')",
		held:   "pin_t", absent: "none", release: "DISCARD ALL",
	},
}

// withPID turns a check query into one that also returns the server
// process ID.
func withPID(check string) string { return "SELECT (" + check + "), pg_backend_pid()::text" }

// pinHarness is a transaction-mode pooler over two server connections
// whose metrics the test reads.
func pinHarness(t *testing.T, cfg pooler.Config) (*harness, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	return newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2, cfg: cfg, reg: reg}), reg
}

// metricValue returns the value of the pooler series name with the label
// reason=label, or the sum of its series when label is empty; 0 when
// absent.
func metricValue(t testing.TB, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && (len(m.GetLabel()) == 0 || m.GetLabel()[0].GetValue() != label) {
				continue
			}
			if m.GetCounter() != nil {
				sum += m.GetCounter().GetValue()
			} else {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// waitPinned waits until the pinned-clients gauge reads want.
func waitPinned(t testing.TB, reg *prometheus.Registry, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := metricValue(t, reg, "pgquic_pooler_pinned_clients", "")
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgquic_pooler_pinned_clients = %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func create(ctx context.Context, t testing.TB, pc *pgconn.PgConn, tc stateCase) {
	t.Helper()
	for _, sql := range tc.create {
		var err error
		if tc.extended {
			err = pc.ExecParams(ctx, sql, nil, nil, nil, nil).Read().Err
		} else {
			_, err = pc.Exec(ctx, sql).ReadAll()
		}
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// TestSessionStatePinned: each kind of unmovable state keeps its client on
// its server connection for many later transactions (simple, extended and
// inside blocks) while two other clients race for the pool's two
// connections and never see the state; the pin is counted and gauged;
// after the releasing statement the client is unpinned and every server
// connection of the pool is clean.
func TestSessionStatePinned(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	for _, tc := range stateCases {
		t.Run(tc.name, func(t *testing.T) {
			h, reg := pinHarness(t, pooler.Config{})
			p := h.connect(ctx, t)
			create(ctx, t, p.PgConn(), tc)
			pinned := simpleOne(ctx, t, p.PgConn(), "SELECT pg_backend_pid()::text")
			waitPinned(t, reg, 1)
			if got := metricValue(t, reg, "pgquic_pooler_pins_total", tc.reason); got != 1 {
				t.Errorf("pins_total{reason=%q} = %v, want 1", tc.reason, got)
			}

			const others, rounds = 2, 15
			errs := make(chan error, others)
			var wg sync.WaitGroup
			for i := range others {
				o := h.connect(ctx, t).PgConn()
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := range rounds {
						res := o.ExecParams(ctx, withPID(tc.check), nil, nil, nil, nil).Read()
						if res.Err != nil {
							errs <- fmt.Errorf("other client %d round %d: %w", i, r, res.Err)
							return
						}
						if got, pid := string(res.Rows[0][0]), string(res.Rows[0][1]); got != tc.absent || pid == pinned {
							errs <- fmt.Errorf("other client %d round %d: %q on server process %s, want %q and not the pinned %s", i, r, got, pid, tc.absent, pinned)
							return
						}
					}
				}()
			}
			for r := range rounds {
				if got := simpleOne(ctx, t, p.PgConn(), "SELECT ("+tc.check+")"); got != tc.held {
					t.Fatalf("pinned client round %d, simple protocol: %q, want %q", r, got, tc.held)
				}
				if got := extendedOne(ctx, t, p.PgConn(), withPID(tc.check)); got != tc.held {
					t.Fatalf("pinned client round %d, extended protocol: %q, want %q", r, got, tc.held)
				}
				tx, err := p.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var got, pid string
				if err := tx.QueryRow(ctx, withPID(tc.check)).Scan(&got, &pid); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				if got != tc.held || pid != pinned {
					t.Fatalf("pinned client round %d, transaction block: %q on %s, want %q on %s", r, got, pid, tc.held, pinned)
				}
			}
			useState(ctx, t, p, tc)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}

			if _, err := p.PgConn().Exec(ctx, tc.release).ReadAll(); err != nil {
				t.Fatalf("%s: %v", tc.release, err)
			}
			waitPinned(t, reg, 0)
			h.waitNoneInUse(t)
			checkEveryConnClean(ctx, t, h, tc, pinned)
		})
	}
}

// useState exercises the state itself beyond the catalogue check.
func useState(ctx context.Context, t *testing.T, p *pgx.Conn, tc stateCase) {
	t.Helper()
	switch tc.reason {
	case "listen":
		d := direct(ctx, t, sharedCluster(t))
		for i := range 3 {
			payload := fmt.Sprintf("n%d", i)
			if _, err := d.Exec(ctx, "SELECT pg_notify('Pin_Chan', $1)", payload); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			n, err := p.WaitForNotification(wctx)
			cancel()
			if err != nil {
				t.Fatalf("notification %d not delivered to the listening client: %v", i, err)
			}
			if n.Channel != "Pin_Chan" || n.Payload != payload {
				t.Fatalf("notification %d: %s %q", i, n.Channel, n.Payload)
			}
			// A transaction in between, on the same connection.
			_ = simpleOne(ctx, t, p.PgConn(), "SELECT 1")
		}
	case "cursor_with_hold":
		for want := 1; want <= 5; want++ {
			if got := simpleOne(ctx, t, p.PgConn(), "FETCH 1 FROM pin_c"); got != fmt.Sprint(want) {
				t.Fatalf("FETCH %d from the WITH HOLD cursor: %s", want, got)
			}
		}
	case "prepare":
		if got := simpleOne(ctx, t, p.PgConn(), "EXECUTE pin_p(21)"); got != "42" {
			t.Fatalf("EXECUTE pin_p(21) = %s", got)
		}
	case "advisory_lock":
		d := direct(ctx, t, sharedCluster(t))
		var ok bool
		if err := d.QueryRow(ctx, "SELECT pg_try_advisory_lock(4242)").Scan(&ok); err != nil {
			t.Fatal(err)
		}
		if ok {
			t.Fatal("another session took the advisory lock the pinned client holds")
		}
	}
}

// checkEveryConnClean holds a transaction open on both server connections
// of the pool at once and checks that neither holds the state; the one the
// client was pinned to must be among them (it was returned, not closed).
func checkEveryConnClean(ctx context.Context, t *testing.T, h *harness, tc stateCase, pinned string) {
	t.Helper()
	seen := map[string]bool{}
	for i := range 2 {
		c := h.connect(ctx, t).PgConn()
		if _, err := c.Exec(ctx, "BEGIN").ReadAll(); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = c.Exec(ctx, "ROLLBACK").ReadAll() }()
		res := c.ExecParams(ctx, withPID(tc.check), nil, nil, nil, nil).Read()
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		got, pid := string(res.Rows[0][0]), string(res.Rows[0][1])
		if got != tc.absent {
			t.Errorf("after %s, client %d on server process %s sees %q, want %q", tc.release, i, pid, got, tc.absent)
		}
		seen[pid] = true
	}
	if !seen[pinned] {
		t.Errorf("the server connection %s the client was pinned to did not go back to the pool", pinned)
	}
}

// TestSessionStateDisconnect: a client that leaves while pinned gives its
// server connection back clean, for every kind of state.
func TestSessionStateDisconnect(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, reg := pinHarness(t, pooler.Config{})
	for _, tc := range stateCases {
		p := h.connect(ctx, t)
		create(ctx, t, p.PgConn(), tc)
		pinned := simpleOne(ctx, t, p.PgConn(), "SELECT pg_backend_pid()::text")
		waitPinned(t, reg, 1)
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		waitPinned(t, reg, 0)
		h.waitNoneInUse(t)
		checkEveryConnClean(ctx, t, h, tc, pinned)
	}
}

// TestSessionStateNotReleased: statements that leave some of the state in
// place keep the client pinned: UNLISTEN of another channel, CLOSE of
// another cursor, a rolled-back UNLISTEN *, an unlock of a lock not held.
func TestSessionStateNotReleased(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, reg := pinHarness(t, pooler.Config{})
	p := h.connect(ctx, t).PgConn()
	create(ctx, t, p, stateCase{create: []string{"LISTEN a; LISTEN b", "SELECT pg_advisory_lock(7)"}})
	pinned := simpleOne(ctx, t, p, "SELECT pg_backend_pid()::text")
	for _, sql := range []string{
		"UNLISTEN a",
		"BEGIN; UNLISTEN *; ROLLBACK",
		"SELECT pg_advisory_unlock(8)",
		"UNLISTEN *",
	} {
		if _, err := p.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		// The probe that follows a releasing statement has been answered
		// once a later query has run.
		if pid := simpleOne(ctx, t, p, "SELECT pg_backend_pid()::text"); pid != pinned {
			t.Fatalf("after %s the client moved from %s to %s", sql, pinned, pid)
		}
		if got := metricValue(t, reg, "pgquic_pooler_pinned_clients", ""); got != 1 {
			t.Fatalf("after %s: pinned_clients = %v, want 1", sql, got)
		}
	}
	// The last lock, released through the extended protocol: the probe
	// follows the Sync.
	if err := p.ExecParams(ctx, "SELECT pg_advisory_unlock($1::bigint)", [][]byte{[]byte("7")}, nil, nil, nil).Read().Err; err != nil {
		t.Fatal(err)
	}
	waitPinned(t, reg, 0)
	h.waitNoneInUse(t)
}

// TestSessionStateReleasedInBlock: state released inside a transaction
// block unpins the client when the block commits, without waiting for
// another request.
func TestSessionStateReleasedInBlock(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	h, reg := pinHarness(t, pooler.Config{})
	p := h.connect(ctx, t)
	create(ctx, t, p.PgConn(), stateCase{create: []string{"LISTEN a"}})
	waitPinned(t, reg, 1)
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.PgConn().ExecParams(ctx, "UNLISTEN *", nil, nil, nil, nil).Read().Err; err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitPinned(t, reg, 0)
	h.waitNoneInUse(t)
}

// TestSessionStateGoneAtCommit: state that does not outlive its statement
// or block (a failed LISTEN, a rolled-back temporary table, a temporary
// table ON COMMIT DROP, a failed lock call) pins the client only until the
// server says so.
func TestSessionStateGoneAtCommit(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	h, reg := pinHarness(t, pooler.Config{})
	p := h.connect(ctx, t).PgConn()
	for i, sql := range []string{
		"BEGIN; CREATE TEMP TABLE pin_t (a int) ON COMMIT DROP; INSERT INTO pin_t VALUES (1); COMMIT",
		"BEGIN; LISTEN pin_gone; ROLLBACK",
		"BEGIN; CREATE TEMP TABLE pin_t (a int); ROLLBACK",
		"LISTEN pin_gone; SELECT 1/0",
		"SELECT pg_advisory_lock(1/0)",
	} {
		_, _ = p.Exec(ctx, sql).ReadAll()
		if got := metricValue(t, reg, "pgquic_pooler_pins_total", ""); got != float64(i+1) {
			t.Errorf("after %s: pins_total = %v, want %d", sql, got, i+1)
		}
		waitPinned(t, reg, 0)
		h.waitNoneInUse(t)
	}
}

// TestSessionStateLookalikesNotPinned: the statements' keywords inside
// strings, comments, dollar quotes and quoted identifiers, transaction-scoped
// advisory locks and cursors without HOLD pin nobody: the pool of two
// serves three clients in turn.
func TestSessionStateLookalikesNotPinned(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	h, reg := pinHarness(t, pooler.Config{})
	p := h.connect(ctx, t).PgConn()
	for _, sql := range []string{
		"SELECT 'LISTEN x; CREATE TEMP TABLE t ()'",
		"SELECT $$PREPARE p AS SELECT 1$$, $q$ $$ $q$ -- LISTEN x",
		"/* DECLARE c CURSOR WITH HOLD FOR SELECT 1; */ SELECT 1",
		`SELECT 1 AS "pg_advisory_lock"`,
		"SELECT E'\\' LISTEN x'",
		"SELECT pg_advisory_xact_lock(5)",
		"BEGIN; DECLARE c CURSOR FOR SELECT 1; COMMIT",
		"CREATE TABLE IF NOT EXISTS pin_lookalike_temp (a int); DROP TABLE pin_lookalike_temp",
	} {
		if _, err := p.Exec(ctx, sql).ReadAll(); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		h.waitNoneInUse(t)
	}
	if got := metricValue(t, reg, "pgquic_pooler_pinned_clients", ""); got != 0 {
		t.Errorf("pinned_clients = %v", got)
	}
}

// TestSessionStateKeepsRolePin: with RoleChangesPin, a client pinned by an
// identity change stays pinned after DISCARD ALL, which the state pin alone
// would not survive; the reasons are counted apart.
func TestSessionStateKeepsRolePin(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	h, reg := pinHarness(t, pooler.Config{RoleChanges: pooler.RoleChangesPin})
	p := h.connect(ctx, t).PgConn()
	create(ctx, t, p, stateCase{create: []string{"LISTEN a", "SET ROLE postgres"}})
	pinned := simpleOne(ctx, t, p, "SELECT pg_backend_pid()::text")
	if _, err := p.Exec(ctx, "DISCARD ALL").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if pid := simpleOne(ctx, t, p, "SELECT pg_backend_pid()::text"); pid != pinned {
		t.Fatalf("after DISCARD ALL the role-pinned client moved from %s to %s", pinned, pid)
	}
	if got := metricValue(t, reg, "pgquic_pooler_pinned_clients", ""); got != 1 {
		t.Errorf("pinned_clients = %v, want 1", got)
	}
	for _, reason := range []string{"listen", "role"} {
		if got := metricValue(t, reg, "pgquic_pooler_pins_total", reason); got != 1 {
			t.Errorf("pins_total{reason=%q} = %v, want 1", reason, got)
		}
	}
}

// TestSessionStateError: with SessionStateError, statements creating
// unmovable state outside a transaction block get 0A000 naming the
// statement and the setting, and the client keeps sharing the pool; inside
// a block they run and pin the client.
func TestSessionStateError(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	h, reg := pinHarness(t, pooler.Config{SessionState: pooler.SessionStateError})
	p := h.connect(ctx, t).PgConn()
	for _, tc := range []struct{ sql, kind string }{
		{"CREATE TEMP TABLE pin_t (a int)", "CREATE TEMP"},
		{"SELECT 1 INTO TEMP pin_t", "SELECT INTO TEMP"},
		{"SELECT 1; LISTEN x", "LISTEN"},
		{"SELECT pg_advisory_lock(1)", "pg_advisory_lock"},
		{"DECLARE c CURSOR WITH HOLD FOR SELECT 1", "DECLARE WITH HOLD"},
		{"PREPARE q AS SELECT 1", "PREPARE"},
	} {
		_, err := p.Exec(ctx, tc.sql).ReadAll()
		if pgCode(err) != "0A000" || !strings.Contains(err.Error(), tc.kind) || !strings.Contains(err.Error(), "session_state") {
			t.Errorf("simple %s: %v, want 0A000 naming %s and session_state", tc.sql, err, tc.kind)
		}
		if !strings.Contains(tc.sql, ";") {
			err := p.ExecParams(ctx, tc.sql, nil, nil, nil, nil).Read().Err
			if pgCode(err) != "0A000" {
				t.Errorf("extended %s: %v, want 0A000", tc.sql, err)
			}
		}
	}
	if got := simpleOne(ctx, t, p, "SELECT count(*)::text FROM pg_prepared_statements WHERE from_sql"); got != "0" {
		t.Errorf("a refused PREPARE ran: %s statements", got)
	}
	if got := metricValue(t, reg, "pgquic_pooler_pinned_clients", ""); got != 0 {
		t.Errorf("pinned_clients = %v after refusals", got)
	}
	h.waitNoneInUse(t)
	if _, err := p.Exec(ctx, "BEGIN; CREATE TEMP TABLE pin_t (a int); COMMIT").ReadAll(); err != nil {
		t.Fatalf("CREATE TEMP inside a block: %v", err)
	}
	waitPinned(t, reg, 1)
	if got := simpleOne(ctx, t, p, "SELECT coalesce(to_regclass('pin_t')::text, 'none')"); got != "pin_t" {
		t.Errorf("temp table created in a block: %s", got)
	}
	if _, err := p.Exec(ctx, "DISCARD ALL").ReadAll(); err != nil {
		t.Fatal(err)
	}
	waitPinned(t, reg, 0)
	h.waitNoneInUse(t)
}

// TestListenNotifiedWhileIdle: a LISTENing client that sends nothing more
// still gets its notifications, in session mode as in transaction mode, and
// keeps working afterwards.
func TestListenNotifiedWhileIdle(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	for _, mode := range []pooler.Mode{pooler.ModeSession, pooler.ModeTransaction} {
		t.Run(string(mode), func(t *testing.T) {
			h, _ := pinHarness(t, pooler.Config{Mode: mode})
			p := h.connect(ctx, t)
			if _, err := p.Exec(ctx, "LISTEN idle_chan"); err != nil {
				t.Fatal(err)
			}
			d := direct(ctx, t, sharedCluster(t))
			for i := range 3 {
				payload := fmt.Sprint(i)
				if _, err := d.Exec(ctx, "SELECT pg_notify('idle_chan', $1)", payload); err != nil {
					t.Fatal(err)
				}
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				n, err := p.WaitForNotification(wctx)
				cancel()
				if err != nil {
					t.Fatalf("notification %d: %v", i, err)
				}
				if n.Payload != payload {
					t.Fatalf("notification %d: payload %q", i, n.Payload)
				}
			}
			if got := preparedOne(ctx, t, p, "SELECT count(*)::text FROM pg_listening_channels()"); got != "1" {
				t.Errorf("listening channels: %s", got)
			}
		})
	}
}

// TestSessionStateResetQueryNotDiscard: when ResetQuery is not DISCARD ALL,
// a client leaving while pinned by session state still gets DISCARD ALL, so
// its temporary table and lock never reach the next borrower.
func TestSessionStateResetQueryNotDiscard(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	h, reg := pinHarness(t, pooler.Config{ResetQuery: "RESET ALL"})
	tc := stateCase{
		create:  []string{"CREATE TEMP TABLE pin_t (a int)", "SELECT pg_advisory_lock(99)"},
		check:   "SELECT coalesce(to_regclass('pin_t')::text, 'none') || (SELECT count(*)::text FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())",
		absent:  "none0",
		release: "disconnect",
	}
	p := h.connect(ctx, t)
	create(ctx, t, p.PgConn(), tc)
	pinned := simpleOne(ctx, t, p.PgConn(), "SELECT pg_backend_pid()::text")
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitPinned(t, reg, 0)
	h.waitNoneInUse(t)
	checkEveryConnClean(ctx, t, h, tc, pinned)
}
