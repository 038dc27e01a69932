package pooler_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/pooler"
)

// The TestHostile tests: one client (A) sends broken, abandoned or hostile
// protocol traffic; with a pool of one server connection the next client
// (B) provably gets A's server connection (the same pg_backend_pid) and
// must find it clean: no transaction, no portal, no COPY mode, its own
// settings, none of A's messages, A's unnamed statement and portal gone.
// Where A left inside an extended-protocol request (before its Sync) the
// pooler drops A's connection instead, and the server rolls back, as for
// a client that disconnects from PostgreSQL: B then gets a new one, which
// must be as clean, and A's rows must not be committed.
//
// They found, on main e337ef0: an abandoned request (Execute and Flush,
// a suspended portal, an extended BEGIN) handed its open implicit
// transaction and portal to B, whose Sync committed A's rows; a Query or
// FunctionCall after a failed Parse and before the Sync, which PostgreSQL
// skips, left the session waiting for its answer for good; Syncs sent
// inside COPY FROM STDIN, which PostgreSQL ignores, did the same.

// hostileAddr is the pooler's address.
func hostileAddr(h *harness) string { return h.ln.Addr().String() }

// hostileLogin logs in through the pooler as the superuser with
// application_name app and returns the connection at ReadyForQuery.
func hostileLogin(ctx context.Context, t testing.TB, h *harness, app string) *rawConn {
	t.Helper()
	c, _ := startRaw(ctx, t, hostileAddr(h), map[string]string{"application_name": app})
	return c
}

// hostilePID asks the server which process serves c.
func hostilePID(t testing.TB, c *rawConn) string {
	t.Helper()
	c.send(&pgproto3.Query{String: "select pg_backend_pid()::text"})
	out := c.untilZ()
	if len(out) != 4 || !strings.HasPrefix(out[1], "D[") || out[3] != "Z[I]" {
		t.Fatalf("pg_backend_pid: %v", out)
	}
	return strings.TrimSuffix(strings.TrimPrefix(out[1], "D["), "]")
}

// hostileExpect fails the test unless got equals want.
func hostileExpect(t testing.TB, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n  got  %v\n  want %v", what, got, want)
	}
}

// hostileCheckNext logs in a fresh client B and checks that it runs on the
// server process pid (when pid is not empty) and finds it clean.
func hostileCheckNext(ctx context.Context, t testing.TB, h *harness, pid string) {
	t.Helper()
	hostileCheckNextAs(ctx, t, h, pid, "hostile-client-b")
}

// hostileCheckNextAs is hostileCheckNext for a client B with application_name app
// (the same as A's, B's requests need no parameter change first).
func hostileCheckNextAs(ctx context.Context, t testing.TB, h *harness, pid, app string) {
	t.Helper()
	b := hostileLogin(ctx, t, h, app)
	// A's unnamed portal and unnamed statement do not answer B (asked
	// first, before anything of B's could replace them).
	b.send(&pgproto3.Execute{}, &pgproto3.Sync{})
	hostileExpect(t, "client B's Execute of the unnamed portal without Bind", b.untilZ(), "E[ERROR 34000]", "Z[I]")
	b.send(&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
	hostileExpect(t, "client B's Bind of the unnamed statement without Parse", b.untilZ(), "E[ERROR 26000]", "Z[I]")
	b.send(&pgproto3.Query{String: "select pg_backend_pid()::text, " +
		"coalesce(txid_current_if_assigned()::text, 'none'), " +
		"(now() = statement_timestamp())::text, " +
		"(select count(*) from pg_cursors)::text, " +
		"current_setting('application_name'), " +
		"current_setting('statement_timeout'), " +
		"current_setting('search_path')"})
	out := b.untilZ()
	if len(out) != 4 || out[0] != "RowDescription" || out[2] != "C[SELECT 1]" || out[3] != "Z[I]" {
		t.Fatalf("client B's first query: %v", out)
	}
	f := strings.Split(strings.TrimSuffix(strings.TrimPrefix(out[1], "D["), "]"), ",")
	if pid != "" && f[0] != pid {
		t.Fatalf("client B runs on server process %s, not on A's %s: A's server connection was dropped or is still held", f[0], pid)
	}
	want := []string{f[0], "none", "true", "0", app, "0", `"$user"`, " public"}
	if !slices.Equal(f, want) {
		t.Fatalf("client B found a dirty server connection: got %v, want %v "+
			"(pid, xid, now()=statement_timestamp(), cursors, application_name, statement_timeout, search_path)", f, want)
	}
	b.send(&pgproto3.Query{String: "begin"})
	hostileExpect(t, "client B's BEGIN", b.untilZ(), "C[BEGIN]", "Z[T]")
	b.send(&pgproto3.Query{String: "select 'b-own-row'"})
	hostileExpect(t, "client B's query in its transaction", b.untilZ(), "RowDescription", "D[b-own-row]", "C[SELECT 1]", "Z[T]")
	b.send(&pgproto3.Query{String: "commit"})
	hostileExpect(t, "client B's COMMIT", b.untilZ(), "C[COMMIT]", "Z[I]")
	b.send(&pgproto3.Terminate{})
	h.waitNoneInUse(t)
}

// hostileReceive reads n messages from c, summarised; who names c in a
// failure.
func hostileReceive(t testing.TB, c *rawConn, n int, who string) []string {
	t.Helper()
	var got []string
	for len(got) < n {
		msg, err := c.fe.Receive()
		if err != nil {
			t.Fatalf("%s: %v (so far %v)", who, err, got)
		}
		got = append(got, summarise(msg))
	}
	return got
}

// hostileCheckClean is hostileCheckNext, then a check that none of A's rows
// tagged tag were committed (what names them in the failure).
func hostileCheckClean(ctx context.Context, t testing.TB, h *harness, pid, tag, what string) {
	t.Helper()
	hostileCheckNext(ctx, t, h, pid)
	if n := hostileCount(ctx, t, h, tag); n != "D[0]" {
		t.Fatalf("%s: %s", what, n)
	}
}

// hostileBind is a Bind of the unnamed statement to the unnamed portal with
// the given text parameters.
func hostileBind(params ...string) *pgproto3.Bind {
	b := &pgproto3.Bind{}
	for _, p := range params {
		b.Parameters = append(b.Parameters, []byte(p))
	}
	return b
}

// hostileSetup creates the tables the tests write to.
func hostileSetup(ctx context.Context, t testing.TB, h *harness) {
	t.Helper()
	if err := h.cluster.Exec(ctx, "create table if not exists hostile_t (x text)"); err != nil {
		t.Fatal(err)
	}
}

// hostileCount counts hostile_t's rows with x = v, on the server directly.
func hostileCount(ctx context.Context, t testing.TB, h *harness, v string) string {
	t.Helper()
	d, _ := startRaw(ctx, t, clusterAddr(h.cluster), nil)
	d.send(&pgproto3.Query{String: "select count(*) from hostile_t where x = '" + v + "'"})
	out := d.untilZ()
	d.send(&pgproto3.Terminate{})
	if len(out) != 4 {
		t.Fatalf("count: %v", out)
	}
	return out[1]
}

// TestHostileErrorMidPipeline: A's extended pipeline fails in the middle (a Bind
// with the wrong parameter count) inside an explicit transaction, after an
// INSERT; then A vanishes before Sync, sends Sync, sends more Executes
// before Sync, or several Syncs. A sees what PostgreSQL sends; B finds
// the connection clean and A's row never committed.
func TestHostileErrorMidPipeline(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, 2*time.Minute)
	hostileSetup(ctx, t, h)
	head := func(tag string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{
			&pgproto3.Query{String: "begin"},
			&pgproto3.Parse{Query: "insert into hostile_t values ($1)"},
			hostileBind(tag), &pgproto3.Execute{},
			&pgproto3.Parse{Query: "select $1::int"},
			hostileBind(), // wrong parameter count: 08P01
			&pgproto3.Execute{},
			&pgproto3.Parse{Name: "hostile_after_error", Query: "select 2"},
		}
	}
	cases := []struct {
		name string
		tail []pgproto3.FrontendMessage
		want []string // A's replies after its BEGIN's, nil when A vanishes
	}{
		{"vanish before Sync", nil, nil},
		{"Sync", []pgproto3.FrontendMessage{&pgproto3.Sync{}},
			[]string{"ParseComplete", "BindComplete", "C[INSERT 0 1]", "ParseComplete", "E[ERROR 08P01]", "Z[E]"}},
		{"more Execute after the error", []pgproto3.FrontendMessage{
			&pgproto3.Bind{PreparedStatement: "hostile_after_error"}, &pgproto3.Execute{}, &pgproto3.Execute{}, &pgproto3.Sync{}},
			[]string{"ParseComplete", "BindComplete", "C[INSERT 0 1]", "ParseComplete", "E[ERROR 08P01]", "Z[E]"}},
		{"several Syncs", []pgproto3.FrontendMessage{&pgproto3.Sync{}, &pgproto3.Sync{}, &pgproto3.Sync{}},
			[]string{"ParseComplete", "BindComplete", "C[INSERT 0 1]", "ParseComplete", "E[ERROR 08P01]", "Z[E]", "Z[E]", "Z[E]"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tag := fmt.Sprintf("hostile-mid-%d", i)
			a := hostileLogin(ctx, t, h, "hostile-client-a")
			pid := hostilePID(t, a)
			a.send(append(head(tag), tc.tail...)...)
			if tc.want == nil {
				// Wait for the error so the server has the failed
				// transaction, then vanish.
				a.send(&pgproto3.Flush{})
				var got []string
				for len(got) == 0 || got[len(got)-1] != "E[ERROR 08P01]" {
					msg, err := a.fe.Receive()
					if err != nil {
						t.Fatalf("A waiting for its error: %v (so far %v)", err, got)
					}
					got = append(got, summarise(msg))
				}
				_ = a.nc.Close()
			} else {
				hostileExpect(t, "A's BEGIN", a.untilZ(), "C[BEGIN]", "Z[T]")
				var got []string
				for range strings.Count(strings.Join(tc.want, " "), "Z[") {
					got = append(got, a.untilZ()...)
				}
				hostileExpect(t, "A's pipeline", got, tc.want...)
				// A is still in its failed transaction: a query is refused.
				a.send(&pgproto3.Query{String: "select 1"})
				hostileExpect(t, "A's query in the failed transaction", a.untilZ(), "E[ERROR 25P02]", "Z[E]")
				_ = a.nc.Close()
			}
			if tc.want == nil {
				// A left before its Sync: the pooler drops the
				// connection and the server rolls back.
				pid = ""
			}
			hostileCheckClean(ctx, t, h, pid, tag, "A's row of the failed transaction is visible")
		})
	}
}

// TestHostileAbandonedImplicitTransaction: A's extended messages without Sync
// open an implicit transaction on the server; A reads the replies after
// Flush (or a row-limited Execute's PortalSuspended) and vanishes, or
// Syncs and leaves. B must not find A's portal, statement or transaction.
func TestHostileAbandonedImplicitTransaction(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, 2*time.Minute)
	hostileSetup(ctx, t, h)
	// PostgreSQL itself rolls back the implicit transaction of a client
	// that disconnects before Sync.
	d, _ := startRaw(ctx, t, clusterAddr(h.cluster), nil)
	d.send(&pgproto3.Parse{Query: "insert into hostile_t values ($1)"}, hostileBind("hostile-implicit-direct"), &pgproto3.Execute{}, &pgproto3.Flush{})
	for range 3 {
		if _, err := d.fe.Receive(); err != nil {
			t.Fatal(err)
		}
	}
	_ = d.nc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		// wait for the direct backend to exit
		e, _ := startRaw(ctx, t, clusterAddr(h.cluster), nil)
		e.send(&pgproto3.Query{String: "select count(*) from pg_stat_activity where backend_type = 'client backend' and query like 'insert into hostile_t%'"})
		out := e.untilZ()
		e.send(&pgproto3.Terminate{})
		if len(out) == 4 && out[1] == "D[0]" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("direct backend still there: %v", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := hostileCount(ctx, t, h, "hostile-implicit-direct"); n != "D[0]" {
		t.Fatalf("direct PostgreSQL committed the row of a client gone before Sync: %s", n)
	}
	cases := []struct {
		name    string
		maxRows uint32
		sync    bool
		app     string // B's application_name
	}{
		{"Flush then vanish", 0, false, "hostile-client-b"},
		{"PortalSuspended then vanish", 2, false, "hostile-client-b"},
		{"PortalSuspended then Sync", 2, true, "hostile-client-b"},
		{"Flush then vanish, B same settings", 0, false, "hostile-client-a"},
		{"PortalSuspended then vanish, B same settings", 2, false, "hostile-client-a"},
		{"extended BEGIN, Flush then vanish, B same settings", 0, false, "hostile-client-a"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tag := fmt.Sprintf("hostile-implicit-%d", i)
			a := hostileLogin(ctx, t, h, "hostile-client-a")
			pid := hostilePID(t, a)
			if strings.Contains(tc.name, "BEGIN") {
				a.send(&pgproto3.Parse{Query: "begin"}, hostileBind(), &pgproto3.Execute{}, &pgproto3.Flush{})
				got := hostileReceive(t, a, 3, "A")
				hostileExpect(t, "A's extended BEGIN", got, "ParseComplete", "BindComplete", "C[BEGIN]")
			}
			a.send(
				&pgproto3.Parse{Query: "insert into hostile_t values ($1)"}, hostileBind(tag), &pgproto3.Execute{},
				&pgproto3.Parse{Query: "select 'a-row-' || g from generate_series(1, 5) g"}, hostileBind(),
				&pgproto3.Execute{MaxRows: tc.maxRows}, &pgproto3.Flush{})
			want := []string{"ParseComplete", "BindComplete", "C[INSERT 0 1]", "ParseComplete", "BindComplete"}
			if tc.maxRows > 0 {
				want = append(want, "D[a-row-1]", "D[a-row-2]", "PortalSuspended")
			} else {
				want = append(want, "D[a-row-1]", "D[a-row-2]", "D[a-row-3]", "D[a-row-4]", "D[a-row-5]", "C[SELECT 5]")
			}
			got := hostileReceive(t, a, len(want), "A")
			hostileExpect(t, "A's replies before Sync", got, want...)
			if tc.sync {
				a.send(&pgproto3.Sync{})
				hostileExpect(t, "A's Sync", a.untilZ(), "Z[I]")
				a.send(&pgproto3.Terminate{})
			} else {
				_ = a.nc.Close()
			}
			wantCount := "D[0]"
			if tc.sync {
				wantCount = "D[1]"
			}
			defer func() {
				if n := hostileCount(ctx, t, h, tag); n != wantCount {
					t.Errorf("A's row (inserted before A's Sync): count %s, want %s", n, wantCount)
				}
			}()
			if !tc.sync {
				// A left before its Sync, inside its implicit transaction:
				// the pooler drops the connection and the server rolls
				// back, as for a client that disconnects from PostgreSQL.
				pid = ""
			}
			hostileCheckNextAs(ctx, t, h, pid, tc.app)
		})
	}
}

// TestHostileUnnamedAndNamedStatementsPerClient: A prepares the unnamed
// statement and a named one "s1"; B, on the same server connection, names
// its own "s1" with another text, and each client gets its own text's
// results, in turns; B cannot Bind A's unnamed statement.
func TestHostileUnnamedAndNamedStatementsPerClient(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	a := hostileLogin(ctx, t, h, "hostile-client-a")
	b := hostileLogin(ctx, t, h, "hostile-client-b")
	pidA := hostilePID(t, a)
	a.send(&pgproto3.Parse{Query: "select 'a-unnamed'"}, &pgproto3.Parse{Name: "s1", Query: "select 'a-s1'::text"}, &pgproto3.Sync{})
	hostileExpect(t, "A's Parses", a.untilZ(), "ParseComplete", "ParseComplete", "Z[I]")
	if pidB := hostilePID(t, b); pidB != pidA {
		t.Fatalf("B on %s, A on %s", pidB, pidA)
	}
	b.send(&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
	hostileExpect(t, "B's Bind of the unnamed statement", b.untilZ(), "E[ERROR 26000]", "Z[I]")
	b.send(&pgproto3.Bind{PreparedStatement: "s1"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	hostileExpect(t, "B's Bind of A's s1", b.untilZ(), "E[ERROR 26000]", "Z[I]")
	b.send(&pgproto3.Describe{ObjectType: 'S', Name: "s1"}, &pgproto3.Sync{})
	hostileExpect(t, "B's Describe of A's s1", b.untilZ(), "E[ERROR 26000]", "Z[I]")
	b.send(&pgproto3.Close{ObjectType: 'S', Name: "s1"}, &pgproto3.Sync{})
	hostileExpect(t, "B's Close of A's s1", b.untilZ(), "CloseComplete", "Z[I]")
	a.send(&pgproto3.Bind{PreparedStatement: "s1"}, &pgproto3.Execute{}, &pgproto3.Sync{})
	hostileExpect(t, "A's s1 after B's Close of its own s1", a.untilZ(), "BindComplete", "D[a-s1]", "C[SELECT 1]", "Z[I]")
	b.send(&pgproto3.Parse{Name: "s1", Query: "select 'b-s1'::text"}, &pgproto3.Sync{})
	hostileExpect(t, "B's Parse of s1", b.untilZ(), "ParseComplete", "Z[I]")
	for round := range 3 {
		for _, c := range []struct {
			who  string
			conn *rawConn
		}{{"a", a}, {"b", b}} {
			c.conn.send(&pgproto3.Bind{PreparedStatement: "s1"}, &pgproto3.Execute{}, &pgproto3.Sync{})
			hostileExpect(t, fmt.Sprintf("round %d: %s's s1", round, c.who), c.conn.untilZ(),
				"BindComplete", "D["+c.who+"-s1]", "C[SELECT 1]", "Z[I]")
		}
	}
	a.send(&pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{})
	hostileExpect(t, "A's unnamed statement", a.untilZ(), "BindComplete", "D[a-unnamed]", "C[SELECT 1]", "Z[I]")
}

// TestHostileCopy: A's COPY FROM STDIN ends badly: A vanishes mid-copy, sends
// CopyFail, or sends a Query instead of CopyData (PostgreSQL: ERROR 08P01,
// the Query consumed, ReadyForQuery). No row of A's arrives, B finds no
// COPY mode.
func TestHostileCopy(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, 2*time.Minute)
	hostileSetup(ctx, t, h)
	cases := []struct {
		name string
		next []pgproto3.FrontendMessage
		want []string
	}{
		{"vanish mid-copy", nil, nil},
		{"CopyFail", []pgproto3.FrontendMessage{&pgproto3.CopyFail{Message: "a gives up"}},
			[]string{"E[ERROR 57014]", "Z[I]"}},
		{"Query instead of CopyData", []pgproto3.FrontendMessage{&pgproto3.Query{String: "select 'smuggled'"}},
			[]string{"E[ERROR 08P01]", "E[FATAL 08P01]", "EOF"}},
		{"Parse instead of CopyData", []pgproto3.FrontendMessage{&pgproto3.Parse{Query: "select 'smuggled'"}, &pgproto3.Sync{}},
			[]string{"E[ERROR 08P01]", "E[FATAL 08P01]", "EOF"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tag := fmt.Sprintf("hostile-copy-%d", i)
			// What PostgreSQL itself answers.
			if tc.want != nil {
				d, _ := startRaw(ctx, t, clusterAddr(h.cluster), nil)
				d.send(&pgproto3.Query{String: "copy hostile_t from stdin"})
				d.fe.Receive() // CopyInResponse
				d.send(&pgproto3.CopyData{Data: []byte("direct-" + tag + "\n")})
				d.send(tc.next...)
				if tc.want[len(tc.want)-1] == "EOF" {
					sameFrames(t, "direct PostgreSQL, the test's expectation", d.untilEOF(), tc.want)
				} else {
					sameFrames(t, "direct PostgreSQL, the test's expectation", d.untilZ(), tc.want)
					d.send(&pgproto3.Terminate{})
				}
			}
			a := hostileLogin(ctx, t, h, "hostile-client-a")
			pid := hostilePID(t, a)
			a.send(&pgproto3.Query{String: "copy hostile_t from stdin"})
			if msg, err := a.fe.Receive(); err != nil {
				t.Fatal(err)
			} else if s := summarise(msg); s != "CopyInResponse" {
				t.Fatalf("A's COPY: %s", s)
			}
			a.send(&pgproto3.CopyData{Data: []byte(tag + "\n" + tag + "\n")})
			switch {
			case tc.next == nil:
				_ = a.nc.Close()
				pid = "" // the pooler may close the server connection instead
			case tc.want[len(tc.want)-1] == "EOF":
				a.send(tc.next...)
				hostileExpect(t, "A's COPY end", a.untilEOF(), tc.want...)
				pid = "" // the server process is gone
			default:
				a.send(tc.next...)
				hostileExpect(t, "A's COPY end", a.untilZ(), tc.want...)
				a.send(&pgproto3.Query{String: "select 'a-after-copy'"})
				hostileExpect(t, "A after its COPY", a.untilZ(), "RowDescription", "D[a-after-copy]", "C[SELECT 1]", "Z[I]")
				_ = a.nc.Close()
			}
			hostileCheckClean(ctx, t, h, pid, tag, "A's COPY rows arrived")
		})
	}
}

// TestHostileCopyOutStalledReader: A starts a large COPY TO STDOUT and stops
// reading. B, on the other server connection, keeps being served, the
// pooler's heap does not grow with the COPY's size, and when A leaves its
// server connection comes back clean.
func TestHostileCopyOutStalledReader(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2})
	ctx := testCtx(t, 2*time.Minute)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	a := hostileLogin(ctx, t, h, "hostile-client-a")
	// About 400 MB.
	a.send(&pgproto3.Query{String: "copy (select repeat('x', 4000) from generate_series(1, 100000)) to stdout"})
	b := hostileLogin(ctx, t, h, "hostile-client-b")
	// Wait until A's COPY is stalled on its socket: the server's process
	// waits on ClientWrite. Its process is found by its query (in
	// transaction mode A's earlier statements may have run elsewhere).
	deadline := time.Now().Add(30 * time.Second)
	var pid string
	for {
		b.send(&pgproto3.Query{String: "select coalesce((select pid::text || ' ' || coalesce(wait_event, '') from pg_stat_activity" +
			" where query like 'copy (select repeat(''x'', 4000)%' and pid <> pg_backend_pid() limit 1), 'gone')"})
		out := b.untilZ()
		if len(out) == 4 && strings.HasSuffix(out[1], " ClientWrite]") {
			pid = strings.TrimPrefix(strings.Fields(out[1])[0], "D[")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A's COPY never stalled: %v", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := range 20 {
		v := fmt.Sprintf("b-%d", i)
		b.send(&pgproto3.Query{String: "select '" + v + "'"})
		hostileExpect(t, "B while A stalls", b.untilZ(), "RowDescription", "D["+v+"]", "C[SELECT 1]", "Z[I]")
	}
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	if grow := int64(during.HeapInuse) - int64(before.HeapInuse); grow > 64<<20 {
		t.Fatalf("the pooler's heap grew by %d MB while A's COPY stalled", grow>>20)
	}
	b.send(&pgproto3.Terminate{})
	_ = a.nc.Close()
	h.waitNoneInUse(t)
	// Both server connections are clean; one of them is A's.
	c1 := hostileLogin(ctx, t, h, "hostile-client-b")
	c2 := hostileLogin(ctx, t, h, "hostile-client-b")
	c1.send(&pgproto3.Query{String: "begin; select pg_backend_pid()"})
	c2.send(&pgproto3.Query{String: "begin; select pg_backend_pid()"})
	o1, o2 := c1.untilZ(), c2.untilZ()
	if !slices.Contains(o1, "D["+pid+"]") && !slices.Contains(o2, "D["+pid+"]") {
		t.Fatalf("A's server connection %s was not returned to the pool: %v %v", pid, o1, o2)
	}
	for _, c := range []*rawConn{c1, c2} {
		c.send(&pgproto3.Query{String: "select count(*) from pg_cursors union all select count(*) from pg_stat_activity where state = 'active' and query like 'copy (select repeat%'"})
		hostileExpect(t, "after A's stalled COPY", c.untilZ(), "RowDescription", "D[0]", "D[0]", "C[SELECT 2]", "Z[T]")
		c.send(&pgproto3.Query{String: "commit"})
		c.untilZ()
	}
}

// hostileRaw is a raw frontend message with a body as given.
func hostileRaw(typ byte, body []byte) []byte {
	b := binary.BigEndian.AppendUint32([]byte{typ}, uint32(len(body)+4))
	return append(b, body...)
}

// hostileStr is s NUL-terminated.
func hostileStr(s string) []byte { return append([]byte(s), 0) }

// hostileQ is a simple Query message.
func hostileQ(sql string) []byte { return hostileRaw('Q', hostileStr(sql)) }

// hostileSync is a Sync message.
var hostileSync = []byte{'S', 0, 0, 0, 4}

// hostileUntilMarker reads c's messages until the DataRow "hostile-end" and the
// ReadyForQuery after it, or until the peer closes ("EOF"), failing the
// test when neither comes within 10 s.
func hostileUntilMarker(t testing.TB, c *rawConn) []string {
	t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = c.nc.SetReadDeadline(time.Now().Add(30 * time.Second)) }()
	var out []string
	marked := false
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			if isReset(err) || strings.Contains(err.Error(), "EOF") {
				return append(out, "EOF")
			}
			t.Fatalf("no end marker and no close within 10 s: %v (so far %v)", err, out)
		}
		s := summarise(msg)
		out = append(out, s)
		if s == "D[hostile-end]" {
			marked = true
		}
		if marked && strings.HasPrefix(s, "Z[") {
			return out
		}
	}
}

// hostileUntilZWithin is untilZ failing the test when no ReadyForQuery comes
// within d.
func hostileUntilZWithin(t testing.TB, c *rawConn, d time.Duration, what string) []string {
	t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = c.nc.SetReadDeadline(time.Now().Add(30 * time.Second)) }()
	var out []string
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			t.Fatalf("%s: no ReadyForQuery within %s: %v (so far %v)", what, d, err, out)
		}
		out = append(out, summarise(msg))
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			return out
		}
	}
}

// TestHostileOddMessages sends single odd or broken messages after login, each
// followed by a marker query, to PostgreSQL directly and through the
// pooler: the pooler's client sees the same frames (or a clean close
// where PostgreSQL closes), and the next client on the same server
// connection finds it clean.
func TestHostileOddMessages(t *testing.T) {
	ctx := testCtx(t, 4*time.Minute)
	hostileSetup(ctx, t, newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1}))
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	u16 := func(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
	u32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	manyTypes := cat(hostileStr(""), hostileStr("select 1"), u16(65535), make([]byte, 4*65535))
	fcall := cat(u32(177), u16(0), u16(2), u32(1), []byte("1"), u32(1), []byte("2"), u16(0)) // int4pl('1', '2')
	cases := []struct {
		name string
		send []byte
	}{
		{"Query with a NUL inside", hostileRaw('Q', []byte("select 'a-nul'\x00select 'a-hidden'\x00"))},
		{"empty Query", hostileQ("")},
		{"blank Query", hostileQ("  ;  ")},
		{"two Queries in one write, the first failing", cat(hostileQ("select 1/0"), hostileQ("select 'a-second'"))},
		{"Close of a statement that does not exist", cat(hostileRaw('C', cat([]byte{'S'}, hostileStr("hostile_nosuch"))), hostileSync)},
		{"Close of a portal that does not exist", cat(hostileRaw('C', cat([]byte{'P'}, hostileStr("hostile_nosuch"))), hostileSync)},
		{"Close with a bad kind", cat(hostileRaw('C', cat([]byte{'X'}, hostileStr(""))), hostileSync)},
		{"Describe of a portal that does not exist", cat(hostileRaw('D', cat([]byte{'P'}, hostileStr("hostile_nosuch"))), hostileSync)},
		{"Describe of a statement that does not exist", cat(hostileRaw('D', cat([]byte{'S'}, hostileStr("hostile_nosuch"))), hostileSync)},
		{"Describe with a bad kind", cat(hostileRaw('D', cat([]byte{'X'}, hostileStr(""))), hostileSync)},
		{"Execute of a portal that does not exist", cat(hostileRaw('E', cat(hostileStr("hostile_nosuch"), u32(0))), hostileSync)},
		{"Bind of a statement that does not exist", cat(hostileRaw('B', cat(hostileStr(""), hostileStr("hostile_nosuch"), u16(0), u16(0), u16(0))), hostileSync)},
		{"Parse with 65535 parameter types", cat(hostileRaw('P', manyTypes), hostileRaw('B', cat(hostileStr(""), hostileStr(""), u16(0), u16(0), u16(0))), hostileSync)},
		{"Parse announcing 10 types, sending none", cat(hostileRaw('P', cat(hostileStr(""), hostileStr("select 1"), u16(10))), hostileSync)},
		{"Parse of two statements", cat(hostileRaw('P', cat(hostileStr(""), hostileStr("select 1; select 2"), u16(0))), hostileSync)},
		{"Bind with a negative parameter count", cat(hostileRaw('P', cat(hostileStr(""), hostileStr("select $1::int"), u16(0))), hostileRaw('B', cat(hostileStr(""), hostileStr(""), u16(0), u16(0xffff))), hostileSync)},
		{"Sync alone, twice", cat(hostileSync, hostileSync)},
		{"Flush alone", []byte{'H', 0, 0, 0, 4}},
		{"CopyData outside COPY", hostileRaw('d', []byte("a-stray\n"))},
		{"CopyDone outside COPY", []byte{'c', 0, 0, 0, 4}},
		{"CopyFail outside COPY", hostileRaw('f', hostileStr("a-stray"))},
		{"FunctionCall", hostileRaw('F', fcall)},
		{"SSLRequest after login", cat(u32(8), u32(80877103))},
		{"StartupMessage after login", cat(u32(41), u32(196608), hostileStr("user"), hostileStr("postgres"), hostileStr("database"), hostileStr("postgres"), []byte{0})},
		{"unknown type 'z' with a body", hostileRaw('z', []byte("abcd"))},
		{"Terminate with a body", hostileRaw('X', []byte("junk"))},
		{"COPY FROM STDIN with Syncs and Flushes inside", cat(hostileQ("copy hostile_t from stdin"), hostileRaw('d', []byte("a-copy-sync\n")), hostileSync, []byte{'H', 0, 0, 0, 4}, hostileSync, []byte{'c', 0, 0, 0, 4})},
		{"extended COPY FROM STDIN, Sync before the data", cat(hostileRaw('P', cat(hostileStr(""), hostileStr("copy hostile_t from stdin"), u16(0))), hostileRaw('B', cat(hostileStr(""), hostileStr(""), u16(0), u16(0), u16(0))), hostileRaw('E', cat(hostileStr(""), u32(0))), hostileSync, hostileRaw('d', []byte("a-copy-ext\n")), []byte{'c', 0, 0, 0, 4}, hostileSync)},
		{"extended COPY FROM STDIN, CopyFail", cat(hostileRaw('P', cat(hostileStr(""), hostileStr("copy hostile_t from stdin"), u16(0))), hostileRaw('B', cat(hostileStr(""), hostileStr(""), u16(0), u16(0), u16(0))), hostileRaw('E', cat(hostileStr(""), u32(0))), hostileRaw('d', []byte("a-copy-ext\n")), hostileRaw('f', hostileStr("no")), hostileSync)},
		{"COPY FROM STDIN between other statements", cat(hostileQ("select 'a-1'; copy hostile_t from stdin; select 'a-2'"), hostileRaw('d', []byte("a-copy-mid\n")), []byte{'c', 0, 0, 0, 4})},
		{"CopyData and CopyDone while skipping after an error, then Sync", cat(hostileRaw('P', cat(hostileStr(""), hostileStr("select from from"), u16(0))), hostileRaw('d', []byte("x\n")), []byte{'c', 0, 0, 0, 4}, hostileSync)},
		{"extended insert, then a Query without Sync", cat(hostileRaw('P', cat(hostileStr(""), hostileStr("select 'a-ext'"), u16(0))), hostileRaw('B', cat(hostileStr(""), hostileStr(""), u16(0), u16(0), u16(0))), hostileRaw('E', cat(hostileStr(""), u32(0))), hostileQ("select 'a-q'"))},
		{"Sync after COPY TO STDOUT", cat(hostileQ("copy (select 'a-out') to stdout"), hostileSync)},
		{"COPY FROM STDIN in a failed pipeline, then Sync", cat(hostileRaw('P', cat(hostileStr(""), hostileStr("select from from"), u16(0))), hostileQ("copy hostile_t from stdin"), hostileRaw('d', []byte("x\n")), []byte{'c', 0, 0, 0, 4}, hostileSync)},
		{"COPY TO STDOUT between other statements, with a Query inside", cat(hostileQ("select 'a-1'; copy (select 'a-out') to stdout; select 'a-2'"), hostileQ("select 'a-3'"))},
	}
	marker := hostileQ("select 'hostile-end'")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A pooler of its own, so that a stuck case does not hold up
			// the next.
			h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
			d, _ := startRaw(ctx, t, clusterAddr(h.cluster), map[string]string{"application_name": "hostile-client-a"})
			d.writeBytes(append(slices.Clip(tc.send), marker...))
			direct := hostileUntilMarker(t, d)
			_ = d.nc.Close()

			a := hostileLogin(ctx, t, h, "hostile-client-a")
			pid := hostilePID(t, a)
			a.writeBytes(append(slices.Clip(tc.send), marker...))
			pooled := hostileUntilMarker(t, a)
			// A clean close with FATAL 08P01 where PostgreSQL sends
			// ERROR 08P01 and goes on is allowed.
			closed := len(pooled) == 2 && pooled[0] == "E[FATAL 08P01]" && pooled[1] == "EOF" &&
				len(direct) > 0 && direct[0] == "E[ERROR 08P01]"
			if !closed {
				sameFrames(t, tc.name, direct, pooled)
			}
			if pooled[len(pooled)-1] != "EOF" {
				a.send(&pgproto3.Query{String: "select 'a-still-here'"})
				hostileExpect(t, "A's next query", hostileUntilZWithin(t, a, 10*time.Second, "A's next query"), "RowDescription", "D[a-still-here]", "C[SELECT 1]", "Z[I]")
			}
			_ = a.nc.Close()
			if tc.name == "FunctionCall" {
				// Its connection is closed when A leaves, not reset: the
				// OID may be setseed's (handleFunctionCall). B runs on a
				// new server process, which must be clean all the same.
				pid = ""
			}
			hostileCheckNext(ctx, t, h, pid)
		})
	}
}

// hostileDirect returns the frames PostgreSQL itself answers to req up to the
// ReadyForQuery after the marker query.
func hostileDirect(ctx context.Context, t testing.TB, h *harness, req []byte) []string {
	t.Helper()
	d, _ := startRaw(ctx, t, clusterAddr(h.cluster), map[string]string{"application_name": "hostile-client-a"})
	d.writeBytes(append(slices.Clip(req), hostileQ("select 'hostile-end'")...))
	out := hostileUntilMarker(t, d)
	_ = d.nc.Close()
	return out
}

// hostilePlain sends c's well-behaved requests (a pipelinable extended one and
// a simple Query) n times and reports the first reply that is not exactly
// its own, without failing the test (it runs on its own goroutine).
func hostilePlain(c *rawConn, who string, n int) error {
	recv := func() ([]string, error) {
		var out []string
		_ = c.nc.SetReadDeadline(time.Now().Add(15 * time.Second))
		for {
			msg, err := c.fe.Receive()
			if err != nil {
				return out, err
			}
			out = append(out, summarise(msg))
			if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
				return out, nil
			}
		}
	}
	for i := range n {
		v := fmt.Sprintf("%s-%d", who, i)
		c.fe.Send(&pgproto3.Parse{Query: "select $1::text"})
		c.fe.Send(hostileBind(v))
		c.fe.Send(&pgproto3.Describe{ObjectType: 'P'})
		c.fe.Send(&pgproto3.Execute{})
		c.fe.Send(&pgproto3.Sync{})
		if err := c.fe.Flush(); err != nil {
			return err
		}
		out, err := recv()
		want := []string{"ParseComplete", "BindComplete", "RowDescription", "D[" + v + "]", "C[SELECT 1]", "Z[I]"}
		if err != nil || !slices.Equal(out, want) {
			return fmt.Errorf("%s extended round %d: got %v (%v), want %v", who, i, out, err, want)
		}
		c.fe.Send(&pgproto3.Query{String: "select '" + v + "-q'"})
		if err := c.fe.Flush(); err != nil {
			return err
		}
		out, err = recv()
		want = []string{"RowDescription", "D[" + v + "-q]", "C[SELECT 1]", "Z[I]"}
		if err != nil || !slices.Equal(out, want) {
			return fmt.Errorf("%s simple round %d: got %v (%v), want %v", who, i, out, err, want)
		}
	}
	return nil
}

// TestHostileBusyPool: A misbehaves (complete requests only, each ending in
// Sync or a Query) while the only server connection is shared by other
// clients' requests (cross-client pipelining) or busy with C's
// pg_sleep. A sees exactly what PostgreSQL sends it, B and the hammering
// clients exactly their own replies, and the connection ends clean.
func TestHostileBusyPool(t *testing.T) {
	h, reg := pipeHarness(t, 1, 0)
	ctx := testCtx(t, 3*time.Minute)
	hostileSetup(ctx, t, h)
	u16 := func(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	parse := func(name, sql string) []byte { return hostileRaw('P', cat(hostileStr(name), hostileStr(sql), u16(0))) }
	bind0 := func(stmt string) []byte {
		return hostileRaw('B', cat(hostileStr(""), hostileStr(stmt), u16(0), u16(0), u16(0)))
	}
	exec := hostileRaw('E', cat(hostileStr(""), []byte{0, 0, 0, 0}))
	misdeeds := []struct {
		name string
		req  []byte
	}{
		{"error mid-pipeline, Sync", cat(parse("", "select $1::int"), bind0(""), exec, parse("", "select 2"), bind0(""), exec, hostileSync)},
		{"error mid-pipeline, three Syncs", cat(parse("", "select $1::int"), bind0(""), exec, hostileSync, hostileSync, hostileSync)},
		{"failing Parse, then more", cat(parse("", "select from from"), bind0(""), exec, exec, hostileSync)},
		{"Query with a NUL inside", hostileRaw('Q', []byte("select 'a-nul'\x00select 'a-hidden'\x00"))},
		{"two Queries, the first failing", cat(hostileQ("select 1/0"), hostileQ("select 'a-second'"))},
		{"Describe of a missing portal", cat(hostileRaw('D', cat([]byte{'P'}, hostileStr("hostile_nosuch"))), hostileSync)},
		{"Bind of a missing statement", cat(bind0("hostile_nosuch"), exec, hostileSync)},
		{"COPY with CopyFail", cat(hostileQ("copy hostile_t from stdin"), hostileRaw('d', []byte("a-busy-copy\n")), hostileRaw('f', hostileStr("no")))},
		{"failing transaction, rolled back", cat(hostileQ("begin; insert into hostile_t values ('a-busy-tx'); select 1/0"), hostileQ("rollback"))},
		{"empty Query", hostileQ("")},
	}
	want := make([][]string, len(misdeeds))
	for i, m := range misdeeds {
		want[i] = hostileDirect(ctx, t, h, m.req)
	}
	run := func(t *testing.T, busy func(stop <-chan struct{}) error) {
		a := hostileLogin(ctx, t, h, "hostile-client-a")
		b := hostileLogin(ctx, t, h, "hostile-client-b")
		stop := make(chan struct{})
		busyErr := make(chan error, 1)
		go func() { busyErr <- busy(stop) }()
		bErr := make(chan error, 1)
		go func() { bErr <- hostilePlain(b, "b", 60) }()
		for round := range 3 {
			for i, m := range misdeeds {
				a.writeBytes(append(slices.Clip(m.req), hostileQ("select 'hostile-end'")...))
				if got := hostileUntilMarker(t, a); !slices.Equal(got, want[i]) {
					t.Errorf("round %d, %s: A got %v, PostgreSQL sends %v", round, m.name, got, want[i])
				}
			}
		}
		if err := <-bErr; err != nil {
			t.Errorf("client B: %v", err)
		}
		close(stop)
		if err := <-busyErr; err != nil {
			t.Errorf("busy clients: %v", err)
		}
		_ = a.nc.Close()
		_ = b.nc.Close()
		h.waitNoneInUse(t)
		hostileCheckNext(ctx, t, h, "")
		if n := hostileCount(ctx, t, h, "a-busy-copy"); n != "D[0]" {
			t.Errorf("A's failed COPY left rows: %s", n)
		}
		if n := hostileCount(ctx, t, h, "a-busy-tx"); n != "D[0]" {
			t.Errorf("A's rolled back row is there: %s", n)
		}
	}
	t.Run("pipelined", func(t *testing.T) {
		base := metricValue(t, reg, pipelinedMetric, "")
		run(t, func(stop <-chan struct{}) error {
			errs := make(chan error, 2)
			for c := range 2 {
				go func() {
					cc, _ := startRaw(ctx, t, hostileAddr(h), nil)
					for j := 0; ; j++ {
						select {
						case <-stop:
							errs <- nil
							return
						default:
						}
						if err := hostilePlain(cc, fmt.Sprintf("c%d-%d", c, j), 1); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			return errors.Join(<-errs, <-errs)
		})
		if n := metricValue(t, reg, pipelinedMetric, ""); n == base {
			t.Errorf("no request was pipelined: the test proves nothing")
		}
	})
	t.Run("behind pg_sleep", func(t *testing.T) {
		run(t, func(stop <-chan struct{}) error {
			cc, _ := startRaw(ctx, t, hostileAddr(h), nil)
			for j := 0; ; j++ {
				select {
				case <-stop:
					return nil
				default:
				}
				v := fmt.Sprintf("c-sleep-%d", j)
				cc.fe.Send(&pgproto3.Query{String: "select '" + v + "' from pg_sleep(0.3)"})
				if err := cc.fe.Flush(); err != nil {
					return err
				}
				var out []string
				_ = cc.nc.SetReadDeadline(time.Now().Add(15 * time.Second))
				for {
					msg, err := cc.fe.Receive()
					if err != nil {
						return fmt.Errorf("C: %v (so far %v)", err, out)
					}
					out = append(out, summarise(msg))
					if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
						break
					}
				}
				if w := []string{"RowDescription", "D[" + v + "]", "C[SELECT 1]", "Z[I]"}; !slices.Equal(out, w) {
					return fmt.Errorf("C got %v, want %v", out, w)
				}
			}
		})
	})
}

// TestHostileOpenPortalHoldsConnection: A's Execute with a row limit, after a
// Flush and no Sync, leaves the server inside A's implicit transaction
// with A's portal suspended, and A stays connected. B's Execute of the
// unnamed portal must not be run on that connection meanwhile (it would
// get A's rows); after A's Sync B gets 34000.
func TestHostileOpenPortalHoldsConnection(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	a := hostileLogin(ctx, t, h, "hostile-client-a")
	b := hostileLogin(ctx, t, h, "hostile-client-a")
	pid := hostilePID(t, a)
	if p := hostilePID(t, b); p != pid {
		t.Fatalf("B on %s, A on %s", p, pid)
	}
	a.send(&pgproto3.Parse{Query: "select 'a-row-' || g from generate_series(1, 5) g"}, hostileBind(),
		&pgproto3.Execute{MaxRows: 2}, &pgproto3.Flush{})
	got := hostileReceive(t, a, 5, "A")
	hostileExpect(t, "A's suspended portal", got, "ParseComplete", "BindComplete", "D[a-row-1]", "D[a-row-2]", "PortalSuspended")
	b.send(&pgproto3.Execute{}, &pgproto3.Sync{})
	// B must wait for the connection A still holds: the pooler has B
	// waiting for it, and nothing has come to B.
	waitState(t, "B waiting for the connection A holds", func() bool {
		for _, ci := range h.pooler.Clients() {
			if ci.State == pooler.ClientWaiting {
				return true
			}
		}
		return false
	})
	_ = b.nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if msg, err := b.fe.Receive(); err == nil {
		t.Fatalf("B's Execute ran while A's portal was open: got %s", summarise(msg))
	}
	// pgproto3 cannot go on after a timeout: B reads raw below.
	a.send(&pgproto3.Execute{MaxRows: 1}, &pgproto3.Sync{})
	hostileExpect(t, "A's next row and Sync", a.untilZ(), "D[a-row-3]", "PortalSuspended", "Z[I]")
	a.send(&pgproto3.Terminate{})
	_ = b.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	b2 := &rawConn{t: t, nc: b.nc, fe: pgproto3.NewFrontend(b.nc, b.nc)}
	hostileExpect(t, "B's Execute of the unnamed portal", b2.untilZ(), "E[ERROR 34000]", "Z[I]")
}

// TestHostileTerminateMidPipeline: A's Terminate comes in the middle of its
// pipeline, before the Sync (in one write, or after reading the replies
// to a Flush): as on PostgreSQL, A's insert is not committed, and B finds
// the connection clean.
func TestHostileTerminateMidPipeline(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	hostileSetup(ctx, t, h)
	for _, flush := range []bool{false, true} {
		name := "one write"
		if flush {
			name = "after Flush"
		}
		t.Run(name, func(t *testing.T) {
			tag := "hostile-terminate-" + strings.ReplaceAll(name, " ", "-")
			run := func(c *rawConn) {
				c.fe.Send(&pgproto3.Parse{Query: "insert into hostile_t values ($1)"})
				c.fe.Send(hostileBind(tag))
				c.fe.Send(&pgproto3.Execute{})
				if flush {
					c.send(&pgproto3.Flush{})
					got := hostileReceive(t, c, 3, "the client")
					hostileExpect(t, "replies before Terminate", got, "ParseComplete", "BindComplete", "C[INSERT 0 1]")
				}
				c.send(&pgproto3.Terminate{}, &pgproto3.Sync{})
				_ = c.untilEOF()
			}
			d, _ := startRaw(ctx, t, clusterAddr(h.cluster), nil)
			run(d)
			a := hostileLogin(ctx, t, h, "hostile-client-a")
			pid := hostilePID(t, a)
			run(a)
			// A left inside its request: before the Sync (its request
			// still running, or answered after a Flush), where the pooler
			// drops the connection and the server rolls back, as for a
			// client that disconnects from PostgreSQL.
			pid = ""
			defer func() {
				if n := hostileCount(ctx, t, h, tag); n != "D[0]" {
					t.Errorf("the insert of a client that terminated before Sync is committed: count %s", n)
				}
			}()
			hostileCheckNextAs(ctx, t, h, pid, "hostile-client-a")
		})
	}
}

// TestHostileCopySyncsRelease: Sync and Flush messages inside COPY FROM STDIN
// are ignored by PostgreSQL (no ReadyForQuery answers them). After such
// a COPY, A stays connected and idle; its server connection, the only
// one, must be lent to B and be the same server process (the pooler must
// not wait for ReadyForQuery replies that never come, nor drop it).
func TestHostileCopySyncsRelease(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	hostileSetup(ctx, t, h)
	u16 := func(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
	u32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	cases := []struct {
		name string
		req  []byte
		want []string
	}{
		{"simple COPY with Syncs inside",
			cat(hostileQ("copy hostile_t from stdin"), hostileRaw('d', []byte("a-copy-sync\n")), hostileSync, []byte{'H', 0, 0, 0, 4}, hostileSync, []byte{'c', 0, 0, 0, 4}),
			[]string{"CopyInResponse", "C[COPY 1]", "Z[I]"}},
		{"extended COPY, Sync before the data",
			cat(hostileRaw('P', cat(hostileStr(""), hostileStr("copy hostile_t from stdin"), u16(0))), hostileRaw('B', cat(hostileStr(""), hostileStr(""), u16(0), u16(0), u16(0))),
				hostileRaw('E', cat(hostileStr(""), u32(0))), hostileSync, hostileRaw('d', []byte("a-copy-ext\n")), []byte{'c', 0, 0, 0, 4}, hostileSync),
			[]string{"ParseComplete", "BindComplete", "CopyInResponse", "C[COPY 1]", "Z[I]"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := startRaw(ctx, t, clusterAddr(h.cluster), nil)
			d.writeBytes(tc.req)
			hostileExpect(t, "PostgreSQL, the test's expectation", d.untilZ(), tc.want...)
			d.send(&pgproto3.Query{String: "select 'direct-after'"})
			hostileExpect(t, "PostgreSQL afterwards", d.untilZ(), "RowDescription", "D[direct-after]", "C[SELECT 1]", "Z[I]")
			_ = d.nc.Close()

			a := hostileLogin(ctx, t, h, "hostile-client-a")
			pid := hostilePID(t, a)
			a.writeBytes(tc.req)
			hostileExpect(t, "A's COPY", a.untilZ(), tc.want...)
			a.send(&pgproto3.Query{String: "select 'a-after'"})
			hostileExpect(t, "A afterwards", a.untilZ(), "RowDescription", "D[a-after]", "C[SELECT 1]", "Z[I]")
			// A stays connected and idle; B must get the connection.
			b := hostileLogin(ctx, t, h, "hostile-client-a")
			_ = b.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			b.send(&pgproto3.Query{String: "select pg_backend_pid()::text"})
			var got []string
			for {
				msg, err := b.fe.Receive()
				if err != nil {
					t.Fatalf("B, while A is idle after its COPY, got no reply within 5 s: %v (so far %v)", err, got)
				}
				got = append(got, summarise(msg))
				if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
					break
				}
			}
			hostileExpect(t, "B while A is idle after its COPY", got, "RowDescription", "D["+pid+"]", "C[SELECT 1]", "Z[I]")
			_ = b.nc.Close()
			_ = a.nc.Close()
			hostileCheckNextAs(ctx, t, h, pid, "hostile-client-a")
		})
	}
}

// TestHostileQueryWhileSkipping: after a failed Parse, PostgreSQL ignores
// everything up to Sync, a simple Query included (no reply at all to
// it). A sends Parse (failing), Query, Sync and a marker query, then one
// more query; A must be answered like PostgreSQL answers, and once A has
// gone, B must be served.
func TestHostileQueryWhileSkipping(t *testing.T) {
	u16 := func(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
	u32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	fcall := append(append(append(append(append(u32(177), u16(0)...), u16(2)...), u32(1)...), '1'), append(append(u32(1), '2'), u16(0)...)...) // int4pl('1', '2')
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"Query", hostileQ("select 'a-ignored'")},
		{"FunctionCall", hostileRaw('F', fcall)},
	} {
		t.Run(tc.name, func(t *testing.T) { hostileQueryWhileSkipping(t, tc.msg) })
	}
}

func hostileQueryWhileSkipping(t *testing.T, ignored []byte) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	u16 := func(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
	req := append(hostileRaw('P', append(append(hostileStr(""), hostileStr("select from from")...), u16(0)...)), ignored...)
	req = append(req, hostileSync...)
	req = append(req, hostileQ("select 'hostile-end'")...)
	direct := hostileDirect(ctx, t, h, req[:len(req)-len(hostileQ("select 'hostile-end'"))])
	hostileExpect(t, "PostgreSQL, the test's expectation", direct, "E[ERROR 42601]", "Z[I]", "RowDescription", "D[hostile-end]", "C[SELECT 1]", "Z[I]")

	a := hostileLogin(ctx, t, h, "hostile-client-a")
	pid := hostilePID(t, a)
	a.writeBytes(req)
	sameFrames(t, "A's pipeline", direct, hostileUntilMarker(t, a))
	a.send(&pgproto3.Query{String: "select 'a-next'"})
	_ = a.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var got []string
	for {
		msg, err := a.fe.Receive()
		if err != nil {
			t.Errorf("A's next query: no ReadyForQuery within 10 s: %v (so far %v)", err, got)
			break
		}
		got = append(got, summarise(msg))
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			if !slices.Equal(got, []string{"RowDescription", "D[a-next]", "C[SELECT 1]", "Z[I]"}) {
				t.Errorf("A's next query: %v", got)
			}
			break
		}
	}
	_ = a.nc.Close()
	// A is gone: B must be served (on A's server connection or a new one)
	// well within the 30 s connection wait.
	b := hostileLogin(ctx, t, h, "hostile-client-b")
	_ = b.nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	b.send(&pgproto3.Query{String: "select pg_backend_pid()::text"})
	got = nil
	for {
		msg, err := b.fe.Receive()
		if err != nil {
			t.Fatalf("B after A left: no reply within 20 s: %v (so far %v)", err, got)
		}
		got = append(got, summarise(msg))
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	if len(got) != 4 || got[0] != "RowDescription" || got[3] != "Z[I]" {
		t.Fatalf("B after A left: %v (A was on %s)", got, pid)
	}
	_ = b.nc.Close()
	hostileCheckNext(ctx, t, h, "")
}

// TestHostileAbandonedImplicitTransactionSessionMode is the session-mode
// counterpart of TestHostileAbandonedImplicitTransaction: A's insert without
// Sync, read after a Flush, must not be committed when A vanishes (the
// connection is reset before B gets it).
func TestHostileAbandonedImplicitTransactionSessionMode(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{Mode: pooler.ModeSession}})
	ctx := testCtx(t, time.Minute)
	hostileSetup(ctx, t, h)
	const tag = "hostile-implicit-session"
	a := hostileLogin(ctx, t, h, "hostile-client-a")
	a.send(&pgproto3.Parse{Query: "insert into hostile_t values ($1)"}, hostileBind(tag), &pgproto3.Execute{}, &pgproto3.Flush{})
	got := hostileReceive(t, a, 3, "A")
	hostileExpect(t, "A's insert before Sync", got, "ParseComplete", "BindComplete", "C[INSERT 0 1]")
	_ = a.nc.Close()
	b := hostileLogin(ctx, t, h, "hostile-client-a")
	b.send(&pgproto3.Query{String: "select coalesce(txid_current_if_assigned()::text, 'none'), (now() = statement_timestamp())::text"})
	hostileExpect(t, "B after A left", hostileUntilZWithin(t, b, 15*time.Second, "B after A left"), "RowDescription", "D[none,true]", "C[SELECT 1]", "Z[I]")
	b.send(&pgproto3.Terminate{})
	if n := hostileCount(ctx, t, h, tag); n != "D[0]" {
		t.Fatalf("A's row (inserted before A's Sync, A vanished): count %s, want D[0]", n)
	}
}
