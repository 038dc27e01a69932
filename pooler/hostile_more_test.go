package pooler_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/pooler"
)

// More hostile-client isolation tests, in the style of
// TestSessionStateBehindCopy: with one server connection (pool_size 1)
// two or three protocol-level clients share one server process, one of
// them (B) shapes its traffic to slip session state past the pooler, and
// the others must never observe it, B must keep what it set for itself,
// and bad input must end in an error or a clean close, never a hang.

// hmObjects creates the sequence, table and function OIDs these tests
// use and returns the OIDs of set_config, nextval, pg_advisory_lock and
// lastval, by regprocedure.
func hmObjects(ctx context.Context, t *testing.T, h *harness) map[string]uint32 {
	t.Helper()
	clusterObjects(ctx, t, h, []string{"DROP SEQUENCE IF EXISTS public.hm_seq", "DROP TABLE IF EXISTS public.copyh_t"},
		"CREATE SEQUENCE public.hm_seq START 777001", "CREATE TABLE public.copyh_t (a int)")
	oids := map[string]uint32{}
	d := direct(ctx, t, h.cluster)
	for _, fn := range []string{"set_config(text,text,boolean)", "nextval(regclass)", "pg_advisory_lock(bigint)", "lastval()"} {
		var oid uint32
		if err := d.QueryRow(ctx, "SELECT $1::text::pg_catalog.regprocedure::pg_catalog.oid", fn).Scan(&oid); err != nil {
			t.Fatalf("oid of %s: %v", fn, err)
		}
		oids[fn[:strings.IndexByte(fn, '(')]] = oid
	}
	return oids
}

// fcall is a FunctionCall of the function oid with text arguments and a
// text result.
func fcall(oid uint32, args ...string) *pgproto3.FunctionCall {
	m := &pgproto3.FunctionCall{Function: oid, ArgFormatCodes: []uint16{0}}
	for _, a := range args {
		m.Arguments = append(m.Arguments, []byte(a))
	}
	return m
}

// zsOf counts the ReadyForQuery messages msgs draw from PostgreSQL when
// nothing fails: one per Query, Sync and FunctionCall.
func zsOf(msgs []pgproto3.FrontendMessage) int {
	zs := 0
	for _, m := range msgs {
		switch m.(type) {
		case *pgproto3.Query, *pgproto3.Sync, *pgproto3.FunctionCall:
			zs++
		}
	}
	return zs
}

// seqLast reads hm_seq's last_value straight from the server.
func seqLast(ctx context.Context, t *testing.T, h *harness) string {
	t.Helper()
	var v string
	if err := direct(ctx, t, h.cluster).QueryRow(ctx, "SELECT last_value::text FROM public.hm_seq").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestHostileFunctionCall: FunctionCall messages ('F', a function called
// by OID, which the pooler cannot read) sent where the pooler holds back
// its own follow-up queries: behind a COPY in the same write, in the
// middle of an extended-protocol batch, first in a write with a Query
// behind it. set_config, nextval and pg_advisory_lock called so leave
// state on B's server process; the FunctionCall pins B (reason opaque,
// until it leaves), so A must not run at all while B holds the only
// connection, must find none of it once B left (its connection reset),
// and B must keep its own state meanwhile.
func TestHostileFunctionCall(t *testing.T) {
	const missing = "COPY copyh_missing FROM STDIN" // fails to start: 42P01
	copyTo := []pgproto3.FrontendMessage{qm("COPY (SELECT 1) TO STDOUT")}
	copyMissing := []pgproto3.FrontendMessage{qm(missing)}
	pbe := func(sql string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{&pgproto3.Parse{Query: sql}, &pgproto3.Bind{}, &pgproto3.Execute{}}
	}
	type call struct {
		fn   string
		args []string
	}
	setWM := call{"set_config", []string{"work_mem", "7MB", "false"}}
	next := call{"nextval", []string{"hm_seq"}}
	lock := call{"pg_advisory_lock", []string{"4242"}}
	for _, tc := range []struct {
		name          string
		front, behind []pgproto3.FrontendMessage // around the FunctionCall
		call          call
	}{
		{"BehindCopyTo/set_config", copyTo, nil, setWM},
		{"BehindCopyTo/nextval", copyTo, nil, next},
		{"BehindCopyTo/advisory_lock", copyTo, nil, lock},
		{"BehindFailedCopy/set_config", copyMissing, nil, setWM},
		{"BehindFailedCopy/nextval", copyMissing, nil, next},
		{"BehindExtendedCopyTo/set_config", ext("COPY (SELECT 1) TO STDOUT"), nil, setWM},
		{"InExtendedBatch/set_config", pbe("SELECT 1"), append(pbe("SELECT 2"), &pgproto3.Sync{}), setWM},
		{"InExtendedBatch/nextval", pbe("SELECT 1"), append(pbe("SELECT 2"), &pgproto3.Sync{}), next},
		{"InExtendedBatch/advisory_lock", pbe("SELECT 1"), append(pbe("SELECT 2"), &pgproto3.Sync{}), lock},
		{"FirstThenQuery/set_config", nil, []pgproto3.FrontendMessage{qm("SELECT 'hm_b'")}, setWM},
		{"FirstThenQuery/nextval", nil, []pgproto3.FrontendMessage{qm("SELECT currval('hm_seq')")}, next},
		{"FirstThenQuery/advisory_lock", nil, []pgproto3.FrontendMessage{qm("SELECT 'hm_b'")}, lock},
		{"FirstThenBatch/nextval", nil, append(pbe("SELECT currval('hm_seq')"), &pgproto3.Sync{}), next},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, h, reg, a, b := twoRawClients(t)
			oids := hmObjects(ctx, t, h)
			def := one(t, a, "SHOW work_mem")
			noErrors(t, "A's nextval", q(a, "SELECT nextval('hm_seq')"))
			pid := hostilePID(t, b)
			msgs := append(append(slices.Clone(tc.front), fcall(oids[tc.call.fn], tc.call.args...)), tc.behind...)
			got := rawBatch(b, zsOf(msgs), msgs...)
			noErrors(t, "B's FunctionCall", got, missing)
			if !slices.Contains(got, "FunctionCallResponse") {
				t.Fatalf("B's FunctionCall was not answered: %v", got)
			}
			if v := metricValue(t, reg, "pgquic_pooler_pinned_clients", ""); v != 1 {
				t.Errorf("B is not pinned after a FunctionCall of %s (pinned clients: %v)", tc.call.fn, v)
			}
			// B keeps what it set.
			switch tc.call.fn {
			case "set_config":
				if v := one(t, b, "SHOW work_mem"); v != "7MB" {
					t.Errorf("B lost its own set_config by FunctionCall: work_mem = %q", v)
				}
			case "nextval":
				if v, want := one(t, b, "SELECT currval('hm_seq')"), seqLast(ctx, t, h); v != want {
					t.Errorf("B's currval after its own nextval by FunctionCall: %s, want %s", v, want)
				}
			case "pg_advisory_lock":
				if holder := lockHolder(ctx, t, h); holder != pid {
					t.Errorf("advisory lock 4242 held by %q, want B's server process %s", holder, pid)
				}
			}
			// A must not run while B, pinned, holds the only connection.
			stalled(t, a, "SELECT pg_backend_pid()::text")
			b.send(&pgproto3.Terminate{})
			rawBatch(a, 1)
			expectReply(t, "work_mem", q(a, "SHOW work_mem"), "D["+def+"]")
			expectReply(t, "lastval", q(a, "SELECT lastval()"), "E[ERROR 55000]")
			expectReply(t, "advisory lock", q(a, "SELECT pg_try_advisory_lock(4242)"), "D[t]")
			if holder, mine := lockHolder(ctx, t, h), hostilePID(t, a); holder != mine {
				t.Errorf("advisory lock 4242 is held by %q after A took it, not A's %s", holder, mine)
			}
		})
	}

	// A FunctionCall inside COPY FROM STDIN, in the same write: the server
	// fails the COPY and ends the session (08P01) without running it, and
	// A gets a connection of its own, clean.
	t.Run("InsideCopyFrom/advisory_lock", func(t *testing.T) {
		ctx, h, _, a, b := twoRawClients(t)
		oids := hmObjects(ctx, t, h)
		_ = b.nc.SetDeadline(time.Now().Add(20 * time.Second))
		b.send(qm("COPY copyh_t FROM STDIN"), fcall(oids["pg_advisory_lock"], "4242"), &pgproto3.Sync{})
		got := b.untilEOF()
		if slices.Contains(got, "FunctionCallResponse") || !slices.Contains(got, "E[FATAL 08P01]") || got[len(got)-1] != "EOF" {
			t.Errorf("B's FunctionCall inside COPY FROM STDIN: %v, want 08P01 and the end of the session", got)
		}
		if holder := lockHolder(ctx, t, h); holder != "" {
			t.Errorf("LEAK: advisory lock 4242 held by %s after B's session ended", holder)
		}
		expectReply(t, "advisory lock", q(a, "SELECT pg_try_advisory_lock(4242)"), "D[t]")
		expectReply(t, "copyh_t", q(a, "SELECT count(*) FROM copyh_t"), "D[0]")
	})

	// With session_state "error" a FunctionCall outside a transaction
	// block is refused (0A000), also behind a COPY in the same write,
	// where the pooler still holds B's connection: the function must not
	// run, and A, on B's server process, must see nothing.
	t.Run("RefusedBehindCopy", func(t *testing.T) {
		h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, minPool: 1,
			cfg: pooler.Config{SessionState: pooler.SessionStateError}})
		ctx := withTimeout(t, 60*time.Second)
		a, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
		b, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
		oids := hmObjects(ctx, t, h)
		def := one(t, a, "SHOW work_mem")
		pid := hostilePID(t, b)
		for _, front := range [][]pgproto3.FrontendMessage{copyTo, copyMissing} {
			msgs := append(slices.Clone(front), fcall(oids["set_config"], "work_mem", "7MB", "false"),
				fcall(oids["pg_advisory_lock"], "4242"))
			got := rawBatch(b, zsOf(msgs), msgs...)
			if slices.Contains(got, "FunctionCallResponse") || !slices.Contains(got, "E[ERROR 0A000]") {
				t.Errorf("B's FunctionCalls behind %q with session_state error: %v, want 0A000", front[0].(*pgproto3.Query).String, got)
			}
			samePID(t, a, pid)
			expectReply(t, "work_mem", q(a, "SHOW work_mem"), "D["+def+"]")
			if v := one(t, b, "SHOW work_mem"); v != def {
				t.Errorf("B's refused set_config ran: work_mem = %q", v)
			}
			if holder := lockHolder(ctx, t, h); holder != "" {
				t.Errorf("LEAK: a refused pg_advisory_lock by FunctionCall holds the lock (process %s)", holder)
			}
		}
	})
}

// TestHostileReplication: a client asking for a replication connection
// (walsender: IDENTIFY_SYSTEM, CREATE_REPLICATION_SLOT, START_REPLICATION
// and their COPY BOTH) would turn a shared server connection into a
// replication session. The pooler refuses one at startup (FATAL 0A000,
// then closes); replication commands sent on an ordinary session are
// what PostgreSQL makes of them there, a syntax error, and leave the
// connection as it was for the next client.
func TestHostileReplication(t *testing.T) {
	c := sharedCluster(t)
	h := newHarness(t, harnessOpts{cluster: c, poolSize: 1, minPool: 1})
	ctx := withTimeout(t, 2*time.Minute)
	addr := h.ln.Addr().String()

	t.Run("Startup", func(t *testing.T) {
		for _, v := range []string{"database", "true", "on", "yes", "1", "TRUE", "t", "postgres"} {
			rc := dialRaw(ctx, t, addr)
			rc.send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
				Parameters: map[string]string{"user": "postgres", "database": "postgres", "replication": v}})
			got := rc.untilEOF()
			if !slices.Contains(got, "E[FATAL 0A000]") || slices.Contains(got, "Z[I]") || got[len(got)-1] != "EOF" {
				t.Errorf("startup with replication=%s: %v, want FATAL 0A000 and a close", v, got)
			}
		}
		// replication=false is an ordinary session.
		rc, _ := startRaw(ctx, t, addr, map[string]string{"replication": "false"})
		expectReply(t, "SELECT after replication=false", q(rc, "SELECT 'hr_ok'"), "D[hr_ok]")
		// Through options: not a run-time parameter. PostgreSQL refuses
		// it at startup (FATAL 42704); the pooler must at least never run
		// a statement for such a client (see OptionsFatalAtStartup).
		rc = dialRaw(ctx, t, addr)
		rc.send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
			Parameters: map[string]string{"user": "postgres", "database": "postgres", "options": "-c replication=database"}})
		if got := replStartup(t, rc); got[len(got)-1] == "Z[I]" {
			for range 3 {
				if got := q(rc, "SELECT 'hr_ran'"); !slices.Equal(got, []string{"E[ERROR 42704]", "Z[I]"}) {
					t.Errorf("a client with options -c replication=database ran a statement: %v, want 42704", got)
				}
			}
		}
	})

	// PostgreSQL ends the startup of a client whose options name an
	// unknown parameter with FATAL 42704, or give a known one a bad value
	// with FATAL 22023. Before 2026-12-07 the pooler greeted such a client
	// without asking a server (only reported parameters were checked at
	// login) and failed each statement instead.
	t.Run("OptionsFatalAtStartup", func(t *testing.T) {
		for _, tc := range []struct{ options, want string }{
			{"-c replication=database", "E[FATAL 42704]"},
			{"-c work_mem=banana", "E[FATAL 22023]"},
		} {
			for _, target := range []string{clusterAddr(c), addr} {
				rc := dialRaw(ctx, t, target)
				rc.send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
					Parameters: map[string]string{"user": "postgres", "database": "postgres", "options": tc.options}})
				if got := replStartup(t, rc); !slices.Contains(got, tc.want) || slices.Contains(got, "Z[I]") {
					t.Errorf("%s, options %q: %v, want %s and no ReadyForQuery", target, tc.options, got, tc.want)
				}
			}
		}
	})

	// A temporary replication slot made with SQL (no walsender needed)
	// belongs to the server process until it exits: DISCARD ALL does not
	// drop it. Whoever runs on that process next could read or drop it,
	// and it would hold back WAL for the connection's lifetime.
	t.Run("TemporarySlotBySQL", func(t *testing.T) {
		clusterObjects(ctx, t, h, []string{"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'hr\\_%' AND NOT active"})
		reg := prometheusRegistry()
		h := newHarness(t, harnessOpts{cluster: c, poolSize: 1, minPool: 1, reg: reg})
		addr := h.ln.Addr().String()
		a, _ := startRaw(ctx, t, addr, nil)
		b, _ := startRaw(ctx, t, addr, nil)
		pid := hostilePID(t, b)
		got := q(b, "SELECT 'hr_made' FROM pg_create_physical_replication_slot('hr_tmp', true, true)")
		if !slices.Contains(got, "D[hr_made]") {
			t.Fatalf("B's temporary slot: %v", got)
		}
		const mine = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'hr_tmp' AND active_pid = pg_backend_pid()"
		pinned := metricValue(t, reg, "pgquic_pooler_pinned_clients", "") == 1
		if pinned {
			if n := one(t, b, mine); n != "1" {
				t.Errorf("B, pinned, lost its temporary slot: %s", n)
			}
			stalled(t, a, "SELECT 1")
			b.send(&pgproto3.Terminate{})
			rawBatch(a, 1)
		}
		if n := one(t, a, mine); n != "0" {
			apid := hostilePID(t, a)
			dropped := q(a, "SELECT pg_drop_replication_slot('hr_tmp')")
			processLeak(t, "A, on server process %s (B's was %s; B pinned: %v), holds B's temporary replication slot hr_tmp; "+
				"A's pg_drop_replication_slot of it: %v", apid, pid, pinned, dropped)
		}
	})
	// Replication commands on an ordinary session, in both protocols:
	// the frames PostgreSQL sends, and B, next on the same server
	// process, finds no COPY BOTH, no slot, a clean connection.
	t.Run("CommandsOnOrdinarySession", func(t *testing.T) {
		clusterObjects(ctx, t, h, []string{"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'hr\\_%'"})
		for _, cmd := range []string{
			"IDENTIFY_SYSTEM",
			"CREATE_REPLICATION_SLOT hr_slot TEMPORARY PHYSICAL",
			"CREATE_REPLICATION_SLOT hr_slot LOGICAL pgoutput",
			"START_REPLICATION 0/0",
			"START_REPLICATION SLOT hr_slot LOGICAL 0/0",
			"TIMELINE_HISTORY 1",
			"BASE_BACKUP",
		} {
			for _, proto := range []string{"simple", "extended"} {
				msgs := []pgproto3.FrontendMessage{qm(cmd)}
				if proto == "extended" {
					msgs = ext(cmd)
				}
				d, _ := startRaw(ctx, t, clusterAddr(c), nil)
				want := rawBatch(d, 1, msgs...)
				a, _ := startRaw(ctx, t, addr, nil)
				pid := hostilePID(t, a)
				sameFrames(t, proto+" "+cmd, want, rawBatch(a, 1, msgs...))
				b, _ := startRaw(ctx, t, addr, nil)
				samePID(t, b, pid)
				hostileExpect(t, "B after A's "+cmd, q(b, "SELECT 'hr_b', count(*) FROM pg_replication_slots WHERE slot_name LIKE 'hr\\_%'"),
					"RowDescription", "D[hr_b,0]", "C[SELECT 1]", "Z[I]")
				a.send(&pgproto3.Terminate{})
				b.send(&pgproto3.Terminate{})
			}
		}
	})
}

// TestHostileSessionBuiltins: built-ins whose state belongs to the
// server process and that the lexer marks opaque (sqllex's
// sessionBuiltins), so that the probe behind them decides whether B
// stays pinned: a temporary replication slot (see also
// TestHostileReplication/TemporarySlotBySQL), a base backup in
// progress, the seed of random(). Either B is pinned and the state gone
// when A gets the server process, or A must not find it there.
func TestHostileSessionBuiltins(t *testing.T) {
	for _, tc := range []struct {
		name, stmt, check, want string // B's statement, A's check and its answer
	}{
		{"BackupInProgress", "SELECT 'hs_made' FROM pg_backup_start('hs_b', true)",
			"SELECT pg_backup_stop(false) IS NOT NULL", "E[ERROR 55000]"},
		// want is filled in below: the first random() after setseed(0.25).
		{"Setseed", "SELECT 'hs_made' FROM setseed(0.25)", "SELECT random() = %s::float8", "D[f]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := withTimeout(t, time.Minute)
			reg := prometheus.NewRegistry()
			h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, minPool: 1, reg: reg})
			addr := h.ln.Addr().String()
			a, _ := startRaw(ctx, t, addr, nil)
			b, _ := startRaw(ctx, t, addr, nil)
			if tc.name == "Setseed" {
				// The first random() after setseed(0.25), as PostgreSQL gives it.
				d, _ := startRaw(ctx, t, clusterAddr(h.cluster), nil)
				q(d, "SELECT setseed(0.25)")
				tc.check = fmt.Sprintf(tc.check, one(t, d, "SELECT random()::text"))
			}
			pid := hostilePID(t, b)
			if got := q(b, tc.stmt); !slices.Contains(got, "D[hs_made]") {
				t.Fatalf("B's %s: %v", tc.stmt, got)
			}
			pinned := metricValue(t, reg, "pgquic_pooler_pinned_clients", "") == 1
			if pinned {
				stalled(t, a, "SELECT 1")
				b.send(&pgproto3.Terminate{})
				rawBatch(a, 1)
			}
			apid := hostilePID(t, a)
			if got := q(a, tc.check); !slices.Contains(got, tc.want) {
				processLeak(t, "A, on server process %s (B's was %s; B pinned: %v), after B's %q: %s gave %v, want %s",
					apid, pid, pinned, tc.stmt, tc.check, got, tc.want)
			}
		})
	}
}

// replStartup reads a startup's replies up to ReadyForQuery or the end,
// for at most 5 s.
func replStartup(t *testing.T, rc *rawConn) []string {
	t.Helper()
	_ = rc.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer func() { _ = rc.nc.SetReadDeadline(time.Time{}) }()
	var out []string
	for {
		msg, err := rc.fe.Receive()
		if err != nil {
			return append(out, "EOF")
		}
		out = append(out, summarise(msg))
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			return out
		}
	}
}

// prometheusRegistry is a fresh metrics registry.
func prometheusRegistry() *prometheus.Registry { return prometheus.NewRegistry() }

// processLeak fails t for state that belongs to the server process and
// reached the next client. The lexer marks the call ProcessState
// (internal/sqllex processFuncs): the client is pinned (reason process)
// for the rest of its session and its connection closed when it leaves,
// since neither the probe (pooler/pinning) sees the state nor DISCARD
// ALL ends it. Before 2026-12-07 the probe unpinned the client and the
// next borrower inherited it; these cases were skipped as known leaks.
func processLeak(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Errorf("LEAK (server-process state): "+format, args...)
}

// laneTrio is a pooler with one server connection and a fast-query
// threshold of 10 s, and three protocol-level clients: A leads a lane
// with a slow query, B rides behind it, C behind B. The kinds of query
// they send are made known fast first.
type laneTrio struct {
	ctx     context.Context
	h       *harness
	reg     *prometheus.Registry
	a, b, c *rawConn
}

const (
	laneSlow  = "SELECT pg_sleep(0.4), 'hl_a'"
	laneB     = "SELECT 'hl_b1'"
	laneCheck = "SELECT current_setting('work_mem'), 'hl_c'"
)

func newLaneTrio(t *testing.T) *laneTrio {
	t.Helper()
	ctx, h, reg, a, b := twoRawClients(t)
	c, _ := startRaw(ctx, t, h.ln.Addr().String(), nil)
	for range 6 {
		noErrors(t, "warming A's kind", q(a, "SELECT pg_sleep(0), 'hl_a'"))
		noErrors(t, "warming B's kind", q(b, "SELECT 'hl_b0'"))
		noErrors(t, "warming C's kind", q(c, laneCheck))
	}
	return &laneTrio{ctx: ctx, h: h, reg: reg, a: a, b: b, c: c}
}

// ride sends A's slow query, waits until it runs, sends B's request and
// waits until it is written behind A's, then sends B's later write (in
// a write of its own, while B's first reply is still owed) and C's
// request, and waits until C's is written behind B's. It returns B's
// replies to the later write (up to zs ReadyForQuery, or to the end of
// the session when zs is 0) and C's reply; A's and B's first replies
// must be their own.
func (l *laneTrio) ride(t *testing.T, later []pgproto3.FrontendMessage, zs int, raw []byte) (bLater, c []string) {
	t.Helper()
	base := metricValue(t, l.reg, pipelinedMetric, "")
	l.a.send(qm(laneSlow))
	waitRunning(l.ctx, t, l.h, "hl_a")
	l.b.send(qm(laneB))
	waitMetric(t, l.reg, pipelinedMetric, base+1)
	if len(later) > 0 {
		l.b.send(later...)
	}
	if raw != nil {
		l.b.writeBytes(raw)
	}
	l.c.send(qm(laneCheck))
	waitMetric(t, l.reg, pipelinedMetric, base+2) // or C's request proves nothing
	if got := rawBatch(l.a, 1); !slices.Contains(got, "D[,hl_a]") {
		t.Errorf("A's slow query: %v", got)
	}
	if got := rawBatch(l.b, 1); !slices.Equal(got, []string{"RowDescription", "D[hl_b1]", "C[SELECT 1]", "Z[I]"}) {
		t.Errorf("B's first request, on the lane: %v", got)
	}
	if zs > 0 {
		bLater = rawBatch(l.b, zs)
	} else {
		_ = l.b.nc.SetDeadline(time.Now().Add(20 * time.Second))
		bLater = l.b.untilEOF()
	}
	return bLater, rawBatch(l.c, 1)
}

// TestHostileLaneLaterWrite: B's request qualified for a shared lane
// (cross-client pipelining, pipeline.go) on the only server connection,
// behind A's slow query; while its reply is still owed, B sends more in
// a later write: a SET, a nextval, a PREPARE, a temporary table, an
// advisory lock, LISTEN, a failing statement, a bad message, a request
// it then abandons. C's request rides behind B's first one. Nothing of
// B's later write may run before C's request on the lane (the session
// reads its client only once its turn on the lane is over), C's answer
// must be its own, C must never observe B's state afterwards, and B
// keeps its own.
func TestHostileLaneLaterWrite(t *testing.T) {
	cOK := func(t *testing.T, def string, got []string) {
		t.Helper()
		if !slices.Equal(got, []string{"RowDescription", "D[" + def + ",hl_c]", "C[SELECT 1]", "Z[I]"}) {
			t.Errorf("C's request on the lane, behind B's: %v, want its own row with work_mem %s", got, def)
		}
	}
	for _, tc := range []struct {
		name  string
		later []pgproto3.FrontendMessage
		zs    int
		// after checks what follows, with C's default work_mem.
		after func(t *testing.T, l *laneTrio, def string, bLater []string)
	}{
		{"Set", []pgproto3.FrontendMessage{qm("SET work_mem = '77MB'")}, 1, func(t *testing.T, l *laneTrio, def string, bLater []string) {
			noErrors(t, "B's SET", bLater)
			expectReply(t, "work_mem", q(l.c, "SHOW work_mem"), "D["+def+"]")
			if v := one(t, l.b, "SHOW work_mem"); v != "77MB" {
				t.Errorf("B lost its SET sent while on a lane: work_mem = %q", v)
			}
			expectReply(t, "work_mem", q(l.c, laneCheck), "D["+def+",hl_c]")
		}},
		{"SetExtended", ext("SET work_mem = '78MB'"), 1, func(t *testing.T, l *laneTrio, def string, bLater []string) {
			noErrors(t, "B's SET", bLater)
			expectReply(t, "work_mem", q(l.c, "SHOW work_mem"), "D["+def+"]")
			if v := one(t, l.b, "SHOW work_mem"); v != "78MB" {
				t.Errorf("B lost its SET sent while on a lane: work_mem = %q", v)
			}
		}},
		{"SetThenSelect", []pgproto3.FrontendMessage{qm("SET work_mem = '79MB'"), qm("SELECT current_setting('work_mem'), 'hl_b2'")}, 2,
			func(t *testing.T, l *laneTrio, def string, bLater []string) {
				if !slices.Contains(bLater, "D[79MB,hl_b2]") {
					t.Errorf("B's SET and SELECT in a later write: %v", bLater)
				}
				expectReply(t, "work_mem", q(l.c, "SHOW work_mem"), "D["+def+"]")
			}},
		// Sequence state does not follow a client from one request to the
		// next once another client used the server process (a DISCARD
		// SEQUENCES goes ahead of a read then): B may get 55000, as on a
		// fresh connection, but never another client's value, and its
		// own value within one request.
		{"Nextval", []pgproto3.FrontendMessage{qm("SELECT nextval('hm_seq'); SELECT currval('hm_seq')")}, 1,
			func(t *testing.T, l *laneTrio, def string, bLater []string) {
				if rows := rowsOf(bLater); len(rows) != 2 || rows[0] != rows[1] {
					t.Errorf("B's nextval and currval in one request sent while on a lane: %v", bLater)
				}
				expectReply(t, "lastval", q(l.c, "SELECT lastval()"), "E[ERROR 55000]")
				noErrors(t, "C's nextval", q(l.c, "SELECT nextval('hm_seq')"))
				expectReply(t, "B's currval after C's nextval", q(l.b, "SELECT currval('hm_seq')"), "E[ERROR 55000]")
			}},
		{"Error", []pgproto3.FrontendMessage{qm("SELECT 1/0")}, 1, func(t *testing.T, l *laneTrio, def string, bLater []string) {
			if !slices.Equal(bLater, []string{"E[ERROR 22012]", "Z[I]"}) {
				t.Errorf("B's failing statement in a later write: %v", bLater)
			}
			expectReply(t, "B's next", q(l.b, "SELECT 'hl_b3'"), "D[hl_b3]")
			expectReply(t, "C's next", q(l.c, laneCheck), "D["+def+",hl_c]")
		}},
		{"Prepare", []pgproto3.FrontendMessage{qm("PREPARE copyh_p AS SELECT 42")}, 1, func(t *testing.T, l *laneTrio, def string, bLater []string) {
			noErrors(t, "B's PREPARE", bLater)
			expectReply(t, "B's EXECUTE", q(l.b, "EXECUTE copyh_p"), "D[42]")
			laneAfterPin(t, l, prepChecks)
		}},
		{"TempTable", []pgproto3.FrontendMessage{qm("CREATE TEMP TABLE copyh_tmp (a int)")}, 1, func(t *testing.T, l *laneTrio, def string, bLater []string) {
			noErrors(t, "B's temp table", bLater)
			expectReply(t, "B's temp table", q(l.b, "SELECT count(*) FROM copyh_tmp"), "D[0]")
			laneAfterPin(t, l, tempChecks)
		}},
		{"AdvisoryLock", []pgproto3.FrontendMessage{qm("SELECT pg_advisory_lock(4242)")}, 1, func(t *testing.T, l *laneTrio, def string, bLater []string) {
			noErrors(t, "B's advisory lock", bLater)
			if holder, mine := lockHolder(l.ctx, t, l.h), hostilePID(t, l.b); holder != mine {
				t.Errorf("advisory lock 4242 held by %q, not B's %s", holder, mine)
			}
			laneAfterPin(t, l, lockChecks)
		}},
		{"Listen", []pgproto3.FrontendMessage{qm("LISTEN copyh_ch")}, 1, func(t *testing.T, l *laneTrio, def string, bLater []string) {
			noErrors(t, "B's LISTEN", bLater)
			laneAfterPin(t, l, [][2]string{{"SELECT count(*) FROM pg_listening_channels()", "D[0]"}})
			if _, err := direct(l.ctx, t, l.h.cluster).Exec(l.ctx, "NOTIFY copyh_ch, 'hl'"); err != nil {
				t.Fatal(err)
			}
			if got := q(l.c, "SELECT pg_sleep(0.1)"); slices.Contains(got, "NotificationResponse") {
				t.Errorf("LEAK: C received a notification of B's LISTEN: %v", got)
			}
		}},
		{"BadMessage", nil, 0, func(t *testing.T, l *laneTrio, def string, bLater []string) {
			if !slices.Equal(bLater, []string{"E[FATAL 08P01]", "EOF"}) {
				t.Errorf("B's message of type 'z' in a later write: %v, want FATAL 08P01 and the end", bLater)
			}
			expectReply(t, "C's next", q(l.c, laneCheck), "D["+def+",hl_c]")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLaneTrio(t)
			hmObjects(l.ctx, t, l.h)
			def := one(t, l.c, "SHOW work_mem")
			var raw []byte
			if tc.name == "BadMessage" {
				raw = []byte{'z', 0, 0, 0, 8, 'a', 'b', 'c', 'd'}
			}
			bLater, c := l.ride(t, tc.later, tc.zs, raw)
			cOK(t, def, c)
			tc.after(t, l, def, bLater)
		})
	}

	// B's later write is an extended-protocol SET with no Sync, and B
	// vanishes: its implicit transaction is rolled back, and C finds
	// the server process (or a new one) with its own settings.
	t.Run("AbandonedSet", func(t *testing.T) {
		l := newLaneTrio(t)
		def := one(t, l.c, "SHOW work_mem")
		base := metricValue(t, l.reg, pipelinedMetric, "")
		l.a.send(qm(laneSlow))
		waitRunning(l.ctx, t, l.h, "hl_a")
		l.b.send(qm(laneB))
		waitMetric(t, l.reg, pipelinedMetric, base+1)
		l.b.send(&pgproto3.Parse{Query: "SET work_mem = '80MB'"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Flush{})
		l.c.send(qm(laneCheck))
		waitMetric(t, l.reg, pipelinedMetric, base+2)
		_ = l.b.nc.Close()
		if got := rawBatch(l.a, 1); !slices.Contains(got, "D[,hl_a]") {
			t.Errorf("A's slow query: %v", got)
		}
		cOK(t, def, rawBatch(l.c, 1))
		expectReply(t, "work_mem", q(l.c, "SHOW work_mem"), "D["+def+"]")
		expectReply(t, "work_mem", q(l.a, "SHOW work_mem"), "D["+def+"]")
	})
}

// laneAfterPin: B is pinned to the only server connection by its later
// write; C's checks must wait until B leaves, then find none of its
// state.
func laneAfterPin(t *testing.T, l *laneTrio, checks [][2]string) {
	t.Helper()
	if v := metricValue(t, l.reg, "pgquic_pooler_pinned_clients", ""); v != 1 {
		t.Errorf("B is not pinned (pinned clients: %v)", v)
	}
	stalled(t, l.c, checks[0][0])
	l.b.send(&pgproto3.Terminate{})
	expectReply(t, checks[0][0], rawBatch(l.c, 1), checks[0][1])
	for _, c := range checks[1:] {
		expectReply(t, c[0], q(l.c, c[0]), c[1])
	}
}

// untilCopyIn reads c's replies up to CopyInResponse, for at most 20 s.
func untilCopyIn(t *testing.T, c *rawConn) []string {
	t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	defer func() { _ = c.nc.SetReadDeadline(time.Time{}) }()
	var out []string
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			t.Fatalf("waiting for CopyInResponse: %v (so far %v)", err, out)
		}
		out = append(out, summarise(msg))
		switch msg.(type) {
		case *pgproto3.CopyInResponse:
			return out
		case *pgproto3.ReadyForQuery:
			t.Fatalf("no COPY IN: %v", out)
		}
	}
}

// TestHostileOwedReadBackCopyFrom: B's SET shares a simple Query with a
// COPY FROM STDIN, so the read-back of B's parameters cannot follow the
// Query (it would fail the COPY) and is owed (a.followOwed) until the
// COPY's ReadyForQuery; B ends the data only in a later write, fails
// it, or vanishes in it. A, waiting for the only server connection
// meanwhile, must never see B's work_mem; B must keep its SET when the
// COPY succeeded and lose it, as on PostgreSQL, when the COPY failed
// (the Query's implicit transaction rolls the SET back); a B that
// vanishes leaves a connection A can use at once, clean, and no rows.
func TestHostileOwedReadBackCopyFrom(t *testing.T) {
	for _, shape := range []struct{ name, sql string }{
		{"SetThenCopy", "SET work_mem = '9MB'; COPY copyh_t FROM STDIN"},
		{"CopyThenSet", "COPY copyh_t FROM STDIN; SET work_mem = '9MB'"},
		{"SetInBlock", "BEGIN; SET work_mem = '9MB'; COPY copyh_t FROM STDIN; COMMIT"},
		{"CopyOnly", "COPY copyh_t FROM STDIN"}, // the control: no read-back owed
	} {
		for _, end := range []struct {
			name string
			msgs []pgproto3.FrontendMessage // B's later write; nil: B closes its socket
			gone bool
		}{
			{"DataLater", []pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}}, false},
			{"DataLaterWithSyncs", []pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.Sync{},
				&pgproto3.Flush{}, &pgproto3.CopyDone{}}, false},
			{"CopyFail", []pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyFail{Message: "hm gives up"}}, false},
			{"BadData", []pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("not a number\n")}, &pgproto3.CopyDone{}}, false},
			{"Vanish", nil, true},
			{"VanishMidData", []pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("1\n")}}, true},
			{"TerminateInCopy", []pgproto3.FrontendMessage{&pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.Terminate{}}, true},
		} {
			t.Run(shape.name+"/"+end.name, func(t *testing.T) {
				ctx, h, _, a, b := twoRawClients(t)
				hmObjects(ctx, t, h)
				def := one(t, a, "SHOW work_mem")
				// What PostgreSQL gives B: its frames, its work_mem after.
				d, _ := startRaw(ctx, t, clusterAddr(h.cluster), nil)
				var want []string
				wantWM := ""
				if !end.gone {
					d.send(qm(shape.sql))
					untilCopyIn(t, d)
					want = rawBatch(d, 1, end.msgs...)
					if want[len(want)-1] == "Z[E]" {
						q(d, "ROLLBACK")
					}
					wantWM = one(t, d, "SHOW work_mem")
					q(d, "TRUNCATE copyh_t")
				}
				b.send(qm(shape.sql))
				untilCopyIn(t, b)
				stalled(t, a, "SHOW work_mem") // B holds the only connection in COPY
				if end.msgs != nil {
					b.send(end.msgs...)
				}
				if end.gone {
					_ = b.nc.Close()
				} else if got := rawBatch(b, 1); !slices.Equal(got, want) {
					t.Errorf("B's end of the COPY:\n  PostgreSQL: %v\n  pgquic:     %v", want, got)
				} else if got[len(got)-1] == "Z[E]" {
					q(b, "ROLLBACK") // sent before A's reply is read: A may be held up until B ends its block
				}
				// B now idles (or is gone): A must get the connection
				// without B sending anything more.
				aGot, answered := replyWithin(a, 2*time.Second)
				held := !answered
				if held {
					// Nudge: B's next request, which sends what B owed.
					noErrors(t, "B's next request", q(b, "SELECT 'hm_nudge'"))
					aGot, answered = replyWithin(a, 20*time.Second)
					if !answered {
						t.Fatalf("A's SHOW work_mem was never answered, even after B's next request: %v", aGot)
					}
				}
				expectReply(t, "work_mem", aGot, "D["+def+"]")
				rows := "0"
				if !end.gone && slices.Contains(want, "C[COPY 1]") {
					rows = "1"
				}
				expectReply(t, "copyh_t", q(a, "SELECT count(*) FROM copyh_t"), "D["+rows+"]")
				if end.gone {
					return
				}
				if v := one(t, b, "SHOW work_mem"); v != wantWM {
					t.Errorf("B's work_mem after A used the connection: %q, PostgreSQL gives %q", v, wantWM)
				}
				expectReply(t, "work_mem", q(a, "SHOW work_mem"), "D["+def+"]")
				if held {
					owedHang(t, "B, idle after ending its COPY FROM STDIN (%q, then %s in a later write), kept the only server "+
						"connection: A's request waited until B sent another; the parameter read-back owed behind the COPY "+
						"(a.followOwed) is sent only by the owner (followAtRest, or B's next synchronisation message), "+
						"and the COPY's ReadyForQuery was read by the relay goroutine while the owner waited for B", shape.sql, end.name)
				}
			})
		}
	}
}

// replyWithin reads c's replies up to ReadyForQuery for at most d, and
// reports whether it came.
func replyWithin(c *rawConn, d time.Duration) ([]string, bool) {
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = c.nc.SetReadDeadline(time.Time{}) }()
	var out []string
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			return out, false
		}
		out = append(out, summarise(msg))
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			return out, true
		}
	}
}

// owedHang fails t for a client that, idle after ending its COPY, kept
// the connection because the parameter read-back owed behind the COPY
// waited for its next message. Since 2026-12-07 the owner waits for the
// COPY's ReadyForQuery instead (awaitOwedRest) and sends the read-back
// then; before, the case was skipped as a known bug.
func owedHang(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Errorf("HANG: "+format, args...)
}

// cutShort is the start of a message of type typ announcing a body of n
// bytes, of which only body is sent.
func cutShort(typ byte, n int, body []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{typ}, uint32(4+n)), body...)
}

// TestHostilePartialMessage: B announces a message length and sends only
// part of the bytes (a CopyData, a Bind, a Parse, a Query, a
// FunctionCall, a bare header), where the pooler may already have
// forwarded the start of the message to the server (it streams a message
// larger than its buffer), inside COPY FROM STDIN or a transaction block
// that holds the connection, then B vanishes, or first stays silent. A,
// on the only server connection, must then get exactly its own answer
// (the server must never take A's bytes for the rest of B's message), no
// row of B's, and no hang.
func TestHostilePartialMessage(t *testing.T) {
	const big = 200 << 10
	digits := []byte(strings.Repeat("1\n", big/4)) // half of big
	bindBody := func(param []byte) []byte {
		b := []byte{0, 0, 0, 0, 0, 1} // portal "", statement "", no format codes, 1 parameter
		b = binary.BigEndian.AppendUint32(b, uint32(len(param)))
		return append(b, param...)
	}
	textParam := []byte(strings.Repeat("x", big))
	for _, tc := range []struct {
		name  string
		front []pgproto3.FrontendMessage // sent first, answered up to zs ReadyForQuery or CopyInResponse
		zs    int
		copy  bool
		cut   []byte // then these bytes: a message cut short
		stay  bool   // B stays connected, silent, for a while before it vanishes
	}{
		{"CopyDataCutShort", []pgproto3.FrontendMessage{qm("COPY copyh_t FROM STDIN")}, 0, true,
			cutShort('d', big, digits), false},
		{"CopyDataCutShortStays", []pgproto3.FrontendMessage{qm("COPY copyh_t FROM STDIN")}, 0, true,
			cutShort('d', big, digits), true},
		{"CopyDataHeaderOnly", []pgproto3.FrontendMessage{qm("COPY copyh_t FROM STDIN"), &pgproto3.CopyData{Data: []byte("1\n")}}, 0, true,
			cutShort('d', 100, nil), false},
		{"BindCutShort", []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "INSERT INTO copyh_t SELECT length($1::text)"}}, 0, false,
			cutShort('B', len(bindBody(textParam)), bindBody(textParam)[:big/2]), false},
		{"BindCutShortStays", []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "INSERT INTO copyh_t SELECT length($1::text)"}}, 0, false,
			cutShort('B', len(bindBody(textParam)), bindBody(textParam)[:big/2]), true},
		{"BindCutShortInBlock", []pgproto3.FrontendMessage{qm("BEGIN"), qm("INSERT INTO copyh_t VALUES (7)"),
			&pgproto3.Parse{Query: "INSERT INTO copyh_t SELECT length($1::text)"}}, 2, false,
			cutShort('B', len(bindBody(textParam)), bindBody(textParam)[:big/2]), false},
		{"ParseCutShortInBlock", []pgproto3.FrontendMessage{qm("BEGIN"), qm("INSERT INTO copyh_t VALUES (7)")}, 2, false,
			cutShort('P', big, append([]byte{0}, []byte("INSERT INTO copyh_t VALUES (8) -- "+string(textParam[:big/2]))...)), false},
		{"QueryCutShortInBlock", []pgproto3.FrontendMessage{qm("BEGIN"), qm("INSERT INTO copyh_t VALUES (7)")}, 2, false,
			cutShort('Q', big, []byte("INSERT INTO copyh_t VALUES (8) -- "+string(textParam[:big/2]))), true},
		{"QueryHeaderOnlyInBlock", []pgproto3.FrontendMessage{qm("BEGIN"), qm("INSERT INTO copyh_t VALUES (7)")}, 2, false,
			cutShort('Q', 100, nil), false},
		{"FunctionCallCutShortInBlock", []pgproto3.FrontendMessage{qm("BEGIN"), qm("INSERT INTO copyh_t VALUES (7)")}, 2, false,
			cutShort('F', 1000, []byte{0, 0, 0x0b}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, h, _, a, b := twoRawClients(t)
			hmObjects(ctx, t, h)
			const check = "SELECT 'hp_a', count(*) FROM copyh_t"
			want := []string{"RowDescription", "D[hp_a,0]", "C[SELECT 1]", "Z[I]"}
			hostileExpect(t, "A before", q(a, check), want...)
			switch {
			case tc.copy:
				b.send(tc.front...)
				untilCopyIn(t, b)
			case tc.zs > 0:
				noErrors(t, "B's start", rawBatch(b, tc.zs, tc.front...))
			default:
				b.send(tc.front...)
			}
			b.writeBytes(tc.cut)
			if tc.stay {
				// A may wait for B, holding the connection; it must not
				// get anything but its own answer either way.
				a.send(qm(check))
				if got, ok := replyWithin(a, 500*time.Millisecond); ok {
					hostileExpect(t, "A while B sits mid-message", got, want...)
					a.send(qm(check))
				}
			} else {
				a.send(qm(check))
			}
			_ = b.nc.Close()
			// Promptly: not only once a 10 s fallback closed the
			// connection (awaitRelayEnd).
			got, ok := replyWithin(a, 5*time.Second)
			if !ok {
				t.Fatalf("A was not answered within 5 s after B vanished mid-message: %v", got)
			}
			hostileExpect(t, "A after B vanished mid-message", got, want...)
			hostileExpect(t, "A again", q(a, check), want...)
			hostileExpect(t, "A, extended", rawBatch(a, 1, ext("SELECT 'hp_a', count(*) FROM copyh_t")...),
				"ParseComplete", "BindComplete", "D[hp_a,0]", "C[SELECT 1]", "Z[I]")
		})
	}
}

// TestOwedReadBackTwoCopies: a SET and two COPY FROM STDIN in one Query
// (PostgreSQL's copy2 regression test sends "select 0; copy test3 from
// stdin; copy test3 from stdin; select 1;"). The SET's read-back is owed
// behind the first COPY; its CopyDone clears copyOpen while the second
// COPY still waits for data. On b6e62b7 the owner then waited for the
// ReadyForQuery (awaitOwedRest) instead of reading the second COPY's
// data, and the session hung with the server in COPY; now the second
// CopyInResponse sets copyOpen again and wakes the owner. A, the other
// client of the one connection, must get its answer with the default
// work_mem once B's Query is done, and B keeps its own.
func TestOwedReadBackTwoCopies(t *testing.T) {
	ctx := withTimeout(t, time.Minute)
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	addr := h.ln.Addr().String()
	b, _ := startRaw(ctx, t, addr, nil)
	a, _ := startRaw(ctx, t, addr, nil)
	noErrors(t, "table", q(b, "CREATE TABLE IF NOT EXISTS public.hm_two (a int)"))
	def := one(t, a, "SHOW work_mem")
	b.send(qm("SET work_mem = '9MB'; select 0; copy public.hm_two from stdin; copy public.hm_two from stdin; select 1;"))
	for i := range 2 {
		untilCopyIn(t, b)
		b.send(&pgproto3.CopyData{Data: []byte(strconv.Itoa(i) + "\n")}, &pgproto3.CopyDone{})
	}
	got := hostileUntilZWithin(t, b, 20*time.Second, "B's Query with two COPYs")
	if !slices.Contains(got, "C[COPY 1]") || !slices.Contains(got, "D[1]") || got[len(got)-1] != "Z[I]" {
		t.Fatalf("B's Query with two COPYs: %v", got)
	}
	if got := one(t, a, "SHOW work_mem"); got != def {
		t.Errorf("LEAK: A sees work_mem %s after B's SET, want %s", got, def)
	}
	if got := one(t, b, "SHOW work_mem"); got != "9MB" {
		t.Errorf("B's own work_mem: %s, want 9MB", got)
	}
	noErrors(t, "drop", q(b, "DROP TABLE public.hm_two"))
}
