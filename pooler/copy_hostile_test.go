package pooler_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/pooler"
)

// TestSessionStateBehindCopy: a client (B) pipelines, in the same write as
// a COPY, requests that leave session state on the server. A COPY sets
// a.copyOpen and a.copy until its ReadyForQuery is relayed (or the client
// ends its data), and while they are set the pooler holds back what would
// normally follow the request: the state probe (probeLocked), the
// parameter read-back (followLocked). The sequence check was skipped there
// too until 2026-12-07. With one server connection (pool_size 1) the other
// client (A) runs on B's server process whenever B is not pinned, and
// must never observe B's settings, role, temporary tables, prepared
// statements, LISTEN or advisory locks; where B is pinned, A must not run
// at all until B leaves and its connection is reset. B must keep what it
// set for itself.
//
// No state reached A. B once lost its own unreported parameters
// (work_mem, search_path) set behind a COPY, and a RESET ALL or RESET
// behind a COPY did not hold for B: followLocked (params.go) skipped the
// read-back and the startup values' set_config while a.copy, and nothing
// ran them before the connection went back to the pool. Now the query is
// owed (a.followOwed) and sent once the COPY's ReadyForQuery has come,
// before the connection is released. The NoCopy case is the control.
func TestSessionStateBehindCopy(t *testing.T) {
	const missing = "COPY copyh_missing FROM STDIN" // fails to start: 42P01
	copyTo := []pgproto3.FrontendMessage{qm("COPY (SELECT 1) TO STDOUT")}
	copyMissing := []pgproto3.FrontendMessage{qm(missing)}
	copyFrom := []pgproto3.FrontendMessage{qm("COPY copyh_t FROM STDIN"),
		&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}}
	extCopyTo := ext("COPY (SELECT 1) TO STDOUT")

	// A SET behind a COPY: its read-back is held back until the COPY's
	// ReadyForQuery (followLocked, followAtRest), so the next borrower
	// must still reset the parameter, and B must still find its value
	// when it comes back after A used the connection. Reported parameters (application_name) follow
	// ParameterStatus; unreported ones (work_mem, search_path) depend on
	// the read-back.
	t.Run("Settings", func(t *testing.T) {
		for _, tc := range []struct {
			name         string
			front, set   []pgproto3.FrontendMessage
			param, value string
		}{
			{"NoCopy/work_mem", nil, []pgproto3.FrontendMessage{qm("SET work_mem = '7MB'")}, "work_mem", "7MB"}, // the control: no COPY
			{"InBlock/SetLocal", []pgproto3.FrontendMessage{qm("BEGIN"), qm("COPY (SELECT 1) TO STDOUT")},
				[]pgproto3.FrontendMessage{qm("SET LOCAL work_mem = '3MB'"), qm("COMMIT")}, "work_mem", ""},
			{"CopyTo/application_name", copyTo, []pgproto3.FrontendMessage{qm("SET application_name = 'copyh_b'")}, "application_name", "copyh_b"},
			{"CopyTo/search_path", copyTo, []pgproto3.FrontendMessage{qm("SET search_path = copyh_s, public")}, "search_path", "copyh_s, public"},
			{"CopyTo/work_mem", copyTo, []pgproto3.FrontendMessage{qm("SET work_mem = '7MB'")}, "work_mem", "7MB"},
			{"FailedCopy/work_mem", copyMissing, []pgproto3.FrontendMessage{qm("SET work_mem = '7MB'")}, "work_mem", "7MB"},
			{"FailedCopy/application_name", copyMissing, []pgproto3.FrontendMessage{qm("SET application_name = 'copyh_b'")}, "application_name", "copyh_b"},
			{"CopyToThenExtended/application_name", copyTo, ext("SET application_name = 'copyh_x'"), "application_name", "copyh_x"},
			{"CopyToThenExtended/work_mem", copyTo, ext("SET work_mem = '8MB'"), "work_mem", "8MB"},
			{"ExtendedCopyTo/work_mem", extCopyTo, []pgproto3.FrontendMessage{qm("SET work_mem = '8MB'")}, "work_mem", "8MB"},
			{"CopyFromWithData/work_mem", copyFrom, []pgproto3.FrontendMessage{qm("SET work_mem = '9MB'")}, "work_mem", "9MB"},
			{"CopyFromWithData/application_name", copyFrom, []pgproto3.FrontendMessage{qm("SET application_name = 'copyh_f'")}, "application_name", "copyh_f"},
			// An earlier SET's read-back, answered after the owed one was
			// held back, must not stand in for it: it ran before the
			// second SET.
			{"SetCopySet/work_mem", append([]pgproto3.FrontendMessage{qm("SET work_mem = '3MB'")}, copyTo...),
				[]pgproto3.FrontendMessage{qm("SET work_mem = '11MB'")}, "work_mem", "11MB"},
			{"InBlock/work_mem", []pgproto3.FrontendMessage{qm("BEGIN"), qm("COPY (SELECT 1) TO STDOUT")},
				[]pgproto3.FrontendMessage{qm("SET work_mem = '13MB'"), qm("COMMIT")}, "work_mem", "13MB"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx, h, _, a, b := twoRawClients(t)
				copyTable(ctx, t, h)
				aWas := one(t, a, "SHOW "+tc.param)
				pid := hostilePID(t, b)
				noErrors(t, "B's COPY and SET", behind(b, append(tc.front, tc.set...)...), missing)
				samePID(t, a, pid)
				if v := one(t, a, "SHOW "+tc.param); v != aWas {
					t.Errorf("LEAK: A sees %s = %q, B's SET behind a COPY; A had %q", tc.param, v, aWas)
				}
				want := tc.value
				if want == "" {
					want = aWas // SET LOCAL: gone with B's block
				}
				if v := one(t, b, "SHOW "+tc.param); v != want {
					t.Errorf("B lost its own SET behind a COPY once A used the connection: %s = %q, want %q", tc.param, v, want)
				}
			})
		}
	})

	// B's read-back, held back behind its COPY, runs after B's next
	// request, on a connection A has set parameters of its own on: it
	// must read B's values there, never take A's for B's.
	t.Run("DeferredReadBackAfterA", func(t *testing.T) {
		_, _, _, a, b := twoRawClients(t)
		def := one(t, b, "SHOW work_mem")
		noErrors(t, "B's COPY and SET", behind(b, append(copyTo, qm("SET work_mem = '7MB'"))...))
		noErrors(t, "A's SET", q(a, "SET work_mem = '64MB'"))
		for range 2 { // the second statement runs after the read-back
			if v := one(t, b, "SHOW work_mem"); v == "64MB" {
				t.Errorf("LEAK: B sees A's work_mem %q", v)
			} else if v != "7MB" && v != def {
				t.Errorf("B's work_mem: %q", v)
			}
		}
	})

	// RESET behind a COPY: the read-back, and the set_config of a startup
	// value a RESET took away, wait for B's next request. B's RESET must
	// hold for B both when A borrowed the connection in between (A's
	// parameter sync must not bring back B's value from before the RESET)
	// and when B comes straight back (its startup value, as PostgreSQL
	// gives on RESET).
	t.Run("ResetBehindCopy", func(t *testing.T) {
		ctx, h, _, a, b := twoRawClients(t)
		def := one(t, a, "SHOW work_mem")
		noErrors(t, "B's SET", q(b, "SET work_mem = '5MB'"))
		noErrors(t, "B's RESET ALL behind a COPY", behind(b, append(copyTo, qm("RESET ALL"))...))
		if v := one(t, a, "SHOW work_mem"); v != def {
			t.Errorf("LEAK: A sees work_mem = %q, B's; want %q", v, def)
		}
		if v := one(t, b, "SHOW work_mem"); v != def {
			t.Errorf("B's RESET ALL behind a COPY was undone after A used the connection: work_mem = %q, want %q", v, def)
		}
		c, _ := startRaw(ctx, t, h.ln.Addr().String(), map[string]string{"work_mem": "6MB"})
		noErrors(t, "B's RESET behind a COPY", behind(c, append(copyTo, qm("RESET work_mem"))...))
		if v := one(t, c, "SHOW work_mem"); v != "6MB" {
			t.Errorf("RESET work_mem behind a COPY: B's next statement sees %q, want its startup value 6MB", v)
		}
	})

	// State that pins: a temporary table, an SQL PREPARE, a session
	// advisory lock. B must be pinned at once (the probe that could lift
	// the pin is owed behind the COPY), A must not run while B holds the
	// only connection, and once B leaves (its connection reset) A finds
	// none of it.
	t.Run("Pinned", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			front  []pgproto3.FrontendMessage
			stmt   string
			checks [][2]string // A's query, and its expected reply: a row D[...] or an error E[ERROR ...]
		}{
			{"CopyTo/TempTable", copyTo, "CREATE TEMP TABLE copyh_tmp (a int)", tempChecks},
			{"FailedCopy/TempTable", copyMissing, "CREATE TEMP TABLE copyh_tmp (a int)", tempChecks},
			{"ExtendedCopyTo/TempTable", extCopyTo, "CREATE TEMP TABLE copyh_tmp (a int)", tempChecks},
			{"CopyFromWithData/TempTable", copyFrom, "CREATE TEMP TABLE copyh_tmp (a int)", tempChecks},
			{"CopyTo/Prepare", copyTo, "PREPARE copyh_p AS SELECT 42", prepChecks},
			{"FailedCopy/Prepare", copyMissing, "PREPARE copyh_p AS SELECT 42", prepChecks},
			{"CopyTo/AdvisoryLock", copyTo, "SELECT pg_advisory_lock(4242)", lockChecks},
			{"FailedCopy/AdvisoryLock", copyMissing, "SELECT pg_advisory_lock(4242)", lockChecks},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx, h, reg, a, b := twoRawClients(t)
				copyTable(ctx, t, h)
				pid := hostilePID(t, b)
				noErrors(t, "B's COPY and "+tc.stmt, behind(b, append(tc.front, qm(tc.stmt))...), missing)
				mustBePinned(t, reg, tc.stmt)
				if strings.Contains(tc.stmt, "advisory") {
					if holder := lockHolder(ctx, t, h); holder != pid {
						t.Fatalf("advisory lock 4242 held by %q, want B's server process %s", holder, pid)
					}
				}
				stalled(t, a, tc.checks[0][0])
				b.send(&pgproto3.Terminate{})
				expectReply(t, tc.checks[0][0], rawBatch(a, 1), tc.checks[0][1])
				for _, c := range tc.checks[1:] {
					expectReply(t, c[0], q(a, c[0]), c[1])
				}
				if strings.Contains(tc.stmt, "advisory") {
					if holder, mine := lockHolder(ctx, t, h), hostilePID(t, a); holder != mine {
						t.Errorf("A's pg_try_advisory_lock(4242) gave true, but the lock is held by %q, not A's %s", holder, mine)
					}
				}
			})
		}
	})

	// LISTEN behind a COPY pins B, which must receive a notification
	// while idle; A must never receive one on the connection once B left.
	t.Run("Listen", func(t *testing.T) {
		ctx, h, reg, a, b := twoRawClients(t)
		d := direct(ctx, t, h.cluster)
		noErrors(t, "B's COPY and LISTEN", behind(b, append(copyTo, qm("LISTEN copyh_ch"))...))
		mustBePinned(t, reg, "LISTEN")
		stalled(t, a, "SELECT count(*) FROM pg_listening_channels()")
		if _, err := d.Exec(ctx, "NOTIFY copyh_ch, 'one'"); err != nil {
			t.Fatal(err)
		}
		_ = b.nc.SetReadDeadline(time.Now().Add(20 * time.Second))
		if msg, err := b.fe.Receive(); err != nil {
			t.Fatalf("B, listening, got no notification: %v", err)
		} else if n, ok := msg.(*pgproto3.NotificationResponse); !ok || n.Payload != "one" {
			t.Errorf("B, listening, got %s, want its notification", summarise(msg))
		}
		b.send(&pgproto3.Terminate{})
		expectReply(t, "pg_listening_channels", rawBatch(a, 1), "D[0]")
		if _, err := d.Exec(ctx, "NOTIFY copyh_ch, 'two'"); err != nil {
			t.Fatal(err)
		}
		for _, sql := range []string{"SELECT 1", "SELECT pg_sleep(0.1)"} {
			if got := q(a, sql); slices.Contains(got, "NotificationResponse") {
				t.Errorf("LEAK: A received a notification of B's LISTEN: %v", got)
			}
		}
	})

	// SET ROLE behind a COPY: refused outside a block by default; inside
	// a block sent in the same write it runs and outlives the COMMIT, so
	// the connection must be reset before A borrows it; with role_changes
	// "pin" B keeps its connection.
	t.Run("Role", func(t *testing.T) {
		const setRole = "SET ROLE copyh_role"
		for _, tc := range []struct {
			name string
			pin  bool
			set  []pgproto3.FrontendMessage
			want string // an error B gets, or ""
		}{
			{"Refused", false, []pgproto3.FrontendMessage{qm(setRole)}, "E[ERROR 0A000]"},
			{"RefusedExtended", false, ext(setRole), "E[ERROR 0A000]"},
			{"InBlock", false, []pgproto3.FrontendMessage{qm("BEGIN"), qm(setRole), qm("COMMIT")}, ""},
			{"SessionAuthorizationInBlock", false, []pgproto3.FrontendMessage{qm("BEGIN"),
				qm("SET SESSION AUTHORIZATION copyh_role"), qm("COMMIT")}, ""},
			{"Pinned", true, []pgproto3.FrontendMessage{qm(setRole)}, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				clients := twoRawClients
				if tc.pin {
					clients = rolePinClients
				}
				ctx, h, reg, a, b := clients(t)
				clusterObjects(ctx, t, h, []string{"DROP ROLE IF EXISTS copyh_role"}, "CREATE ROLE copyh_role")
				got := behind(b, append(copyTo, tc.set...)...)
				if tc.want != "" {
					if !slices.Contains(got, tc.want) {
						t.Errorf("B's %s behind a COPY: %v, want %s", setRole, got, tc.want)
					}
				} else {
					noErrors(t, "B's role change behind a COPY", got)
				}
				if tc.pin {
					mustBePinned(t, reg, setRole)
					if v := one(t, b, "SELECT current_user"); v != "copyh_role" {
						t.Errorf("B, pinned after SET ROLE, runs as %q", v)
					}
					stalled(t, a, "SELECT current_user, session_user")
					b.send(&pgproto3.Terminate{})
					expectReply(t, "current_user", rawBatch(a, 1), "D[postgres,postgres]")
					return
				}
				expectReply(t, "current_user", q(a, "SELECT current_user, session_user"), "D[postgres,postgres]")
			})
		}
	})

	// A DO block behind a COPY is opaque: the probe that would read what
	// it left is owed, and the connection, if released, must be closed
	// rather than lent to A (finishRelease). A DISCARD ALL behind a COPY
	// from a pinned B is answered by the owed probe at B's next request.
	t.Run("Opaque", func(t *testing.T) {
		_, _, reg, a, b := twoRawClients(t)
		def := one(t, a, "SHOW work_mem")
		pid := hostilePID(t, b)
		do := "DO $$BEGIN PERFORM pg_catalog.set_config('work_mem', '11MB', false); " +
			"EXECUTE 'CREATE TEMP TABLE copyh_do (a int)'; END$$"
		noErrors(t, "B's COPY and DO", behind(b, append(copyTo, qm(do))...))
		if v := metricValue(t, reg, "pgquic_pooler_pinned_clients", ""); v != 0 {
			t.Logf("B is pinned after a DO behind a COPY (%v); A then waits", v)
			b.send(&pgproto3.Terminate{})
		}
		if mine := hostilePID(t, a); mine == pid {
			t.Errorf("A got B's server process %s after B's DO behind a COPY, whose probe never ran", pid)
		}
		expectReply(t, "work_mem", q(a, "SHOW work_mem"), "D["+def+"]")
		expectReply(t, "copyh_do", q(a, "SELECT * FROM copyh_do"), "E[ERROR 42P01]")
	})
	t.Run("DiscardBehindCopy", func(t *testing.T) {
		_, _, reg, a, b := twoRawClients(t)
		noErrors(t, "B's temp table", q(b, "CREATE TEMP TABLE copyh_tmp (a int)"))
		mustBePinned(t, reg, "CREATE TEMP TABLE")
		noErrors(t, "B's COPY and DISCARD ALL", behind(b, append(copyTo, qm("DISCARD ALL"))...))
		noErrors(t, "B's next request", q(b, "SELECT 1"))
		for _, c := range tempChecks {
			expectReply(t, c[0], q(a, c[0]), c[1])
		}
	})
}

// A's checks for B's temporary table, PREPARE and advisory lock.
var (
	tempChecks = [][2]string{
		{"SELECT count(*) FROM pg_class WHERE relname = 'copyh_tmp' AND relnamespace = pg_my_temp_schema()", "D[0]"},
		{"SELECT * FROM copyh_tmp", "E[ERROR 42P01]"},
	}
	prepChecks = [][2]string{{"EXECUTE copyh_p", "E[ERROR 26000]"}}
	lockChecks = [][2]string{{"SELECT pg_try_advisory_lock(4242)", "D[t]"}}
)

// qm is a simple Query message.
func qm(sql string) *pgproto3.Query { return &pgproto3.Query{String: sql} }

// ext is sql as an extended-protocol request: Parse, Bind, Execute, Sync.
func ext(sql string) []pgproto3.FrontendMessage {
	return []pgproto3.FrontendMessage{&pgproto3.Parse{Query: sql}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}}
}

// q runs one simple Query on c and returns its replies summarised.
func q(c *rawConn, sql string) []string { return rawBatch(c, 1, qm(sql)) }

// behind sends msgs on c in one write and returns the replies up to the
// ReadyForQuery of its last Query or Sync.
func behind(c *rawConn, msgs ...pgproto3.FrontendMessage) []string {
	c.t.Helper()
	zs := 0
	for _, m := range msgs {
		switch m.(type) {
		case *pgproto3.Query, *pgproto3.Sync:
			zs++
		}
	}
	return rawBatch(c, zs, msgs...)
}

// one returns the single value sql yields on c.
func one(t *testing.T, c *rawConn, sql string) string {
	t.Helper()
	rows := rowsOf(q(c, sql))
	if len(rows) != 1 {
		t.Fatalf("%s: rows %v, want one", sql, rows)
	}
	return strings.TrimSuffix(strings.TrimPrefix(rows[0], "D["), "]")
}

// noErrors fails t if got holds an error other than the 42P01 of the
// failing COPY (when allowed is that COPY).
func noErrors(t *testing.T, what string, got []string, allowed ...string) {
	t.Helper()
	errs := 0
	for _, f := range got {
		if strings.HasPrefix(f, "E[") {
			errs++
		}
	}
	if errs > 0 && !(len(allowed) > 0 && errs == 1 && slices.Contains(got, "E[ERROR 42P01]")) {
		t.Fatalf("%s: %v", what, got)
	}
}

// expectReply fails t unless got holds want.
func expectReply(t *testing.T, what string, got []string, want string) {
	t.Helper()
	if !slices.Contains(got, want) {
		t.Errorf("LEAK? A's %s: %v, want %s", what, got, want)
	}
}

// samePID fails t unless A runs on B's server process pid: otherwise the
// case proves nothing.
func samePID(t *testing.T, a *rawConn, pid string) {
	t.Helper()
	if got := hostilePID(t, a); got != pid {
		t.Fatalf("A runs on server process %s, not B's %s: the case proves nothing", got, pid)
	}
}

// mustBePinned fails t unless one client (B) is pinned.
func mustBePinned(t *testing.T, reg *prometheus.Registry, what string) {
	t.Helper()
	if v := metricValue(t, reg, "pgquic_pooler_pinned_clients", ""); v != 1 {
		t.Errorf("B is not pinned after %s behind a COPY (pinned clients: %v)", what, v)
	}
}

// stalled sends sql on a, which must get no reply while B holds the only
// server connection pinned: a reply means A ran on some server while B's
// state was on it. It waits 300 ms for a message that must not come.
func stalled(t *testing.T, a *rawConn, sql string) {
	t.Helper()
	a.send(qm(sql))
	_ = a.nc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	msg, err := a.fe.Receive()
	_ = a.nc.SetReadDeadline(time.Time{})
	var ne net.Error
	switch {
	case err == nil:
		t.Fatalf("LEAK: A's %q was answered (%s, then %v) while B, pinned, held the only server connection",
			sql, summarise(msg), rawBatch(a, 1))
	case !errors.As(err, &ne) || !ne.Timeout():
		t.Fatalf("A's %q while B is pinned: %v", sql, err)
	}
}

// lockHolder returns the server process holding advisory lock 4242, as
// the server says, or "" when none does.
func lockHolder(ctx context.Context, t *testing.T, h *harness) string {
	t.Helper()
	var pid string
	err := direct(ctx, t, h.cluster).QueryRow(ctx, "SELECT coalesce((SELECT pid::text FROM pg_locks"+
		" WHERE locktype = 'advisory' AND objid = 4242 AND granted LIMIT 1), '')").Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// copyTable creates the table COPY FROM STDIN cases write to.
func copyTable(ctx context.Context, t *testing.T, h *harness) {
	t.Helper()
	clusterObjects(ctx, t, h, []string{"DROP TABLE IF EXISTS public.copyh_t"}, "CREATE TABLE public.copyh_t (a int)")
}

// rolePinClients is twoRawClients with role_changes "pin".
func rolePinClients(t *testing.T) (context.Context, *harness, *prometheus.Registry, *rawConn, *rawConn) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := pooler.Config{RoleChanges: pooler.RoleChangesPin}
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, minPool: 1, cfg: cfg, reg: reg})
	ctx := withTimeout(t, 60*time.Second)
	a, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
	b, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
	return ctx, h, reg, a, b
}
