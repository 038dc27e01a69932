package admin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Column names and types (PgBouncer's tupdesc letters: s text, i int4,
// N numeric, T timestamp sent as text) taken from PgBouncer's src/admin.c
// and src/stats.c (commit 13a344f2625381296fc02e29b986a11be9c6b983).
// pgquic appends "transport" and "connection" to the socket lists.
var pgbouncerColumns = map[string]struct {
	types string
	names []string
}{
	"SHOW POOLS": {"ssiiiiiiiiiiiiiss", []string{"database", "user", "cl_active", "cl_waiting", "cl_active_cancel_req",
		"cl_waiting_cancel_req", "sv_active", "sv_active_cancel", "sv_being_canceled", "sv_idle", "sv_used",
		"sv_tested", "sv_login", "maxwait", "maxwait_us", "pool_mode", "load_balance_hosts"}},
	"SHOW CLIENTS": {"ssssssisiTTiiississii" + "ss", socketNames},
	"SHOW SERVERS": {"ssssssisiTTiiississii" + "ss", socketNames},
	"SHOW STATS": {"sNNNNNNNNNNNNNNNNNNNNNNNN", []string{"database", "total_server_assignment_count",
		"total_xact_count", "total_query_count", "total_received", "total_sent", "total_xact_time",
		"total_query_time", "total_wait_time", "total_client_parse_count", "total_server_parse_count",
		"total_bind_count", "total_client_login_count", "avg_server_assignment_count", "avg_xact_count",
		"avg_query_count", "avg_recv", "avg_sent", "avg_xact_time", "avg_query_time", "avg_wait_time",
		"avg_client_parse_count", "avg_server_parse_count", "avg_bind_count", "avg_client_login_count"}},
	"SHOW STATS_TOTALS": {"sNNNNNNNNNNNN", []string{"database", "server_assignment_count", "xact_count",
		"query_count", "bytes_received", "bytes_sent", "xact_time", "query_time", "wait_time",
		"client_parse_count", "server_parse_count", "bind_count", "client_login_count"}},
	"SHOW DATABASES": {"ssissiiiissiiiiii", []string{"name", "host", "port", "database", "force_user", "pool_size",
		"min_pool_size", "reserve_pool_size", "server_lifetime", "pool_mode", "load_balance_hosts",
		"max_connections", "current_connections", "max_client_connections", "current_client_connections",
		"paused", "disabled"}},
	"SHOW CONFIG":  {"ssss", []string{"key", "value", "default", "changeable"}},
	"SHOW VERSION": {"s", []string{"version"}},
	"SHOW LISTS":   {"si", []string{"list", "items"}},
	"SHOW STATE":   {"ss", []string{"key", "value"}},
}

var socketNames = []string{"type", "user", "database", "replication", "state", "addr", "port", "local_addr",
	"local_port", "connect_time", "request_time", "wait", "wait_us", "close_needed", "ptr", "link",
	"remote_pid", "tls", "application_name", "prepared_statements", "id", "transport", "connection"}

var typeOIDs = map[byte]uint32{'s': 25, 'T': 25, 'i': 23, 'q': 20, 'N': 1700}

func TestColumnsMatchPgBouncer(t *testing.T) {
	h := newHarness(t, 2)
	ctx := testCtx(t)
	con := h.connect(ctx, t, "admin", "pgquic")
	app := h.connect(ctx, t, "postgres", "postgres") // so every list has a row
	if _, err := app.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	for cmd, want := range pgbouncerColumns {
		tb := mustQuery(ctx, t, con, cmd)
		if !slices.Equal(tb.names, want.names) {
			t.Errorf("%s columns:\n got %v\nwant %v", cmd, tb.names, want.names)
			continue
		}
		for i := range want.types {
			if tb.oids[i] != typeOIDs[want.types[i]] {
				t.Errorf("%s column %s: type OID %d, want %d", cmd, want.names[i], tb.oids[i], typeOIDs[want.types[i]])
			}
		}
		if len(tb.rows) == 0 && cmd != "SHOW SERVERS" {
			t.Errorf("%s: no rows", cmd)
		}
	}
	v := mustQuery(ctx, t, con, "show version;")
	if got := v.get(t, 0, "version"); got != "pgquic test" {
		t.Errorf("SHOW VERSION = %q", got)
	}
	cfg := mustQuery(ctx, t, con, "SHOW CONFIG")
	if cfg.find(t, "key", "pool_size") < 0 {
		t.Errorf("SHOW CONFIG lacks pool_size: %v", cfg.rows)
	}
	lists := mustQuery(ctx, t, con, "SHOW LISTS")
	if i := lists.find(t, "list", "used_clients"); i < 0 || lists.num(t, i, "items") != 2 {
		t.Errorf("SHOW LISTS used_clients: want 2 (the console and the app)")
	}
}

// testCtx returns a context bounded for one test.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestNonAdminRefused(t *testing.T) {
	h := newHarness(t, 2)
	ctx := testCtx(t)
	for _, db := range []string{"pgquic", "pgbouncer"} {
		_, err := pgconnConnect(ctx, h.url("postgres", db))
		if sqlState(err) != "08P01" || !strings.Contains(err.Error(), "not allowed") {
			t.Errorf("non-admin user to %s: %v, want FATAL 08P01 not allowed", db, err)
		}
		con := h.connect(ctx, t, "admin", db)
		if tb := mustQuery(ctx, t, con, "SHOW STATE"); tb.get(t, 0, "value") != "yes" {
			t.Errorf("SHOW STATE through %s: %v", db, tb.rows)
		}
	}
	// The refusal is not a server pool lookup: no pool was opened for it.
	for _, np := range h.mgr.NamedPools() {
		if np.Database == "pgquic" || np.Database == "pgbouncer" {
			t.Errorf("a server pool was opened for %s", np.Database)
		}
	}
}

func TestBadCommands(t *testing.T) {
	h := newHarness(t, 2)
	ctx := testCtx(t)
	con := h.connect(ctx, t, "admin", "pgquic")
	cases := []struct{ sql, code string }{
		{"SHOW NOTHING", "42601"},
		{"FROBNICATE", "42601"},
		{"SHOW POOLS extra words", "42601"},
		{"SHOW 'pools'", "42601"},
		{"PAUSE \"\"", "42601"},
		{"PAUSE " + strings.Repeat("x", 65), "42601"},
		{"SELECT 1; DROP TABLE x", "42601"},
		{"\x01\x02", "42601"},
		{"RELOAD", "0A000"},
		{"RESUME", "55000"},
		{"RESUME nosuchdb", "55000"},
		{"PAUSE pgquic", "0A000"},
		{"KILL pgbouncer", "0A000"},
		{"SHUTDOWN NOW", "42601"},
	}
	for _, c := range cases {
		_, err := query(ctx, t, con, c.sql)
		if sqlState(err) != c.code {
			t.Errorf("%q: %v, want SQLSTATE %s", c.sql, err, c.code)
		}
	}
	if _, err := query(ctx, t, con, "RELOAD"); err == nil || !strings.Contains(err.Error(), "not supported yet") {
		t.Errorf("RELOAD: %v", err)
	}
	// An empty query answers EmptyQueryResponse; the session still works.
	if _, err := con.Exec(ctx, " ; ").ReadAll(); err != nil {
		t.Errorf("empty query: %v", err)
	}
	mustQuery(ctx, t, con, "SHOW POOLS")
	mustQuery(ctx, t, con, `SHOW "pools";`)

	// The extended protocol ends the session with FATAL 0A000.
	ext := h.connect(ctx, t, "admin", "pgquic")
	res := ext.ExecParams(ctx, "SHOW POOLS", nil, nil, nil, nil).Read()
	if sqlState(res.Err) != "0A000" {
		t.Errorf("extended protocol: %v, want 0A000", res.Err)
	}
	// A message beyond the console's bound ends the session with 08P01.
	big := h.connect(ctx, t, "admin", "pgquic")
	_, err := big.Exec(ctx, "SHOW "+strings.Repeat("x", 70<<10)).ReadAll()
	if sqlState(err) != "08P01" {
		t.Errorf("oversized query: %v, want 08P01", err)
	}
}

// load runs n clients doing short transactions that each hold a server
// connection for hold, until stop is closed; it returns the number of
// failed and completed transactions once they all ended.
func load(ctx context.Context, t *testing.T, h *harness, n int, hold time.Duration, stop <-chan struct{}) func() (failed, done int64) {
	var wg sync.WaitGroup
	var failed, done atomic.Int64
	for range n {
		conn := h.connect(ctx, t, "postgres", "postgres")
		wg.Add(1)
		go func() {
			defer wg.Done()
			sql := fmt.Sprintf("BEGIN; SELECT pg_sleep(%f); COMMIT", hold.Seconds())
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
					failed.Add(1)
					t.Errorf("transaction failed: %v", err)
					return
				}
				done.Add(1)
			}
		}()
	}
	return func() (int64, int64) { wg.Wait(); return failed.Load(), done.Load() }
}

func TestShowPoolsUnderLoad(t *testing.T) {
	h := newHarness(t, 2)
	ctx := testCtx(t)
	con := h.connect(ctx, t, "admin", "pgbouncer")
	stop := make(chan struct{})
	wait := load(ctx, t, h, 6, 100*time.Millisecond, stop)
	var pools table
	row := -1
	waitFor(t, 20*time.Second, "cl_waiting > 0, sv_active = 2 and a growing maxwait in SHOW POOLS", func() bool {
		pools = mustQuery(ctx, t, con, "SHOW POOLS")
		row = pools.find(t, "database", "postgres")
		return row >= 0 && pools.num(t, row, "cl_waiting") > 0 && pools.num(t, row, "sv_active") == 2 &&
			pools.num(t, row, "maxwait")*1_000_000+pools.num(t, row, "maxwait_us") > 0
	})
	if got := pools.num(t, row, "cl_active") + pools.num(t, row, "cl_waiting"); got != 6 {
		t.Errorf("cl_active + cl_waiting = %d, want the 6 clients", got)
	}
	if pools.get(t, row, "pool_mode") != "transaction" || pools.get(t, row, "user") != "postgres" {
		t.Errorf("SHOW POOLS row: %v", pools.rows[row])
	}
	t.Logf("SHOW POOLS under load: cl_active=%d cl_waiting=%d sv_active=%d sv_idle=%d maxwait=%d.%06d",
		pools.num(t, row, "cl_active"), pools.num(t, row, "cl_waiting"), pools.num(t, row, "sv_active"),
		pools.num(t, row, "sv_idle"), pools.num(t, row, "maxwait"), pools.num(t, row, "maxwait_us"))

	// SHOW CLIENTS and SHOW SERVERS tell the same story: waiting clients,
	// and two active servers each linked to an active client.
	waitFor(t, 20*time.Second, "SHOW CLIENTS with waiting clients and SHOW SERVERS with 2 active", func() bool {
		cl := mustQuery(ctx, t, con, "SHOW CLIENTS")
		sv := mustQuery(ctx, t, con, "SHOW SERVERS")
		waiting, active := 0, map[string]string{}
		for i := range cl.rows {
			switch cl.get(t, i, "state") {
			case "waiting":
				waiting++
			case "active":
				if cl.get(t, i, "database") == "postgres" {
					active[cl.get(t, i, "link")] = cl.get(t, i, "ptr")
				}
			}
		}
		linked := 0
		for i := range sv.rows {
			if sv.get(t, i, "state") == "active" && active[sv.get(t, i, "ptr")] == sv.get(t, i, "link") && sv.num(t, i, "remote_pid") > 0 {
				linked++
			}
		}
		return waiting > 0 && linked == 2
	})
	close(stop)
	failed, done := wait()
	if failed != 0 || done == 0 {
		t.Errorf("load: %d failed, %d done", failed, done)
	}
	// Every transaction of the load is one simple Query: SHOW STATS counts
	// each once, with its time (each holds the server at least 100 ms).
	st := mustQuery(ctx, t, con, "SHOW STATS")
	i := st.find(t, "database", "postgres")
	if i < 0 {
		t.Fatalf("SHOW STATS lacks postgres: %v", st.rows)
	}
	for _, col := range []string{"total_xact_count", "total_query_count"} {
		if got := st.num(t, i, col); got != int(done) {
			t.Errorf("SHOW STATS %s = %d, want the %d transactions run", col, got, done)
		}
	}
	// One more server assignment: the first login borrowed a connection to
	// learn the server's parameters.
	if got := st.num(t, i, "total_server_assignment_count"); got != int(done)+1 {
		t.Errorf("SHOW STATS total_server_assignment_count = %d, want %d", got, done+1)
	}
	if got := st.num(t, i, "total_xact_time"); got < int(done)*100_000 {
		t.Errorf("SHOW STATS total_xact_time = %d µs for %d transactions of at least 100 ms", got, done)
	}
	if st.num(t, i, "total_query_time") == 0 || st.num(t, i, "total_wait_time") == 0 {
		t.Errorf("SHOW STATS times: %v", st.rows[i])
	}
	// Bytes each way and logins: six clients logged in, each sent its
	// queries and got their replies.
	if st.num(t, i, "total_client_login_count") != 6 || st.num(t, i, "total_received") < int(done)*len("BEGIN; SELECT pg_sleep(0.100000); COMMIT") ||
		st.num(t, i, "total_sent") == 0 {
		t.Errorf("SHOW STATS logins %d, received %d, sent %d", st.num(t, i, "total_client_login_count"),
			st.num(t, i, "total_received"), st.num(t, i, "total_sent"))
	}
	// One client prepares a statement and runs it twice: one Parse and two
	// Binds from the client, and one Parse the pooler sent a server.
	app := h.connect(ctx, t, "postgres", "postgres")
	sd, err := app.Prepare(ctx, "s1", "SELECT $1::int", nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if r := app.ExecPrepared(ctx, "s1", [][]byte{[]byte("7")}, nil, nil).Read(); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	_ = sd
	st = mustQuery(ctx, t, con, "SHOW STATS")
	i = st.find(t, "database", "postgres")
	if st.num(t, i, "total_client_parse_count") != 1 || st.num(t, i, "total_bind_count") != 2 || st.num(t, i, "total_server_parse_count") < 1 {
		t.Errorf("SHOW STATS after a Prepare and two executions: client_parse %d, bind %d, server_parse %d; want 1, 2, at least 1",
			st.num(t, i, "total_client_parse_count"), st.num(t, i, "total_bind_count"), st.num(t, i, "total_server_parse_count"))
	}
	t.Logf("SHOW STATS after %d transactions: xact_count=%d query_count=%d xact_time=%dµs wait_time=%dµs", done,
		st.num(t, i, "total_xact_count"), st.num(t, i, "total_query_count"), st.num(t, i, "total_xact_time"), st.num(t, i, "total_wait_time"))
	waitFor(t, 10*time.Second, "cl_waiting back to 0", func() bool {
		pools = mustQuery(ctx, t, con, "SHOW POOLS")
		row = pools.find(t, "database", "postgres")
		return pools.num(t, row, "cl_waiting") == 0 && pools.num(t, row, "sv_active") == 0
	})
}

func TestPauseResume(t *testing.T) {
	h := newHarness(t, 2)
	ctx := testCtx(t)
	con := h.connect(ctx, t, "admin", "pgquic")
	watch := h.connect(ctx, t, "admin", "pgquic")
	inTx := h.connect(ctx, t, "postgres", "postgres")
	if _, err := inTx.Exec(ctx, "BEGIN; SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}

	pauseErr := make(chan error, 1)
	go func() {
		_, err := query(ctx, t, con, "PAUSE")
		pauseErr <- err
	}()
	waitFor(t, 10*time.Second, "SHOW STATE paused", func() bool {
		return mustQuery(ctx, t, watch, "SHOW STATE").get(t, 1, "value") == "yes"
	})
	// The open transaction still holds its server connection, so PAUSE
	// cannot have returned.
	select {
	case err := <-pauseErr:
		t.Fatalf("PAUSE returned while a transaction was open: %v", err)
	default:
	}
	// The transaction goes on and commits.
	if _, err := inTx.Exec(ctx, "SELECT 2; COMMIT").ReadAll(); err != nil {
		t.Fatalf("transaction open at PAUSE: %v", err)
	}
	select {
	case err := <-pauseErr:
		if err != nil {
			t.Fatalf("PAUSE: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("PAUSE did not return after the transaction committed")
	}
	// Idle server connections were closed.
	pools := mustQuery(ctx, t, watch, "SHOW POOLS")
	if row := pools.find(t, "database", "postgres"); pools.num(t, row, "sv_idle") != 0 || pools.num(t, row, "sv_active") != 0 {
		t.Errorf("after PAUSE: %v", pools.rows[row])
	}
	if _, err := query(ctx, t, watch, "PAUSE"); sqlState(err) != "55000" {
		t.Errorf("second PAUSE: %v, want 55000", err)
	}

	// New transactions, on open sessions and on new ones, are held.
	const n = 5
	var done atomic.Int64
	errs := make(chan error, n)
	for i := range n {
		conn := inTx
		if i > 0 {
			conn = h.connect(ctx, t, "postgres", "postgres")
		}
		go func() {
			_, err := conn.Exec(ctx, "BEGIN; SELECT 1; COMMIT").ReadAll()
			done.Add(1)
			errs <- err
		}()
	}
	waitFor(t, 10*time.Second, "5 clients waiting in SHOW POOLS", func() bool {
		pools = mustQuery(ctx, t, watch, "SHOW POOLS")
		row := pools.find(t, "database", "postgres")
		return row >= 0 && pools.num(t, row, "cl_waiting") == n
	})
	if d := done.Load(); d != 0 {
		t.Fatalf("%d transactions ran while paused", d)
	}
	// maxwait grows while they are held.
	maxwait := func() int {
		p := mustQuery(ctx, t, watch, "SHOW POOLS")
		row := p.find(t, "database", "postgres")
		return p.num(t, row, "maxwait")*1_000_000 + p.num(t, row, "maxwait_us")
	}
	first := maxwait()
	waitFor(t, 10*time.Second, "maxwait to grow", func() bool { return maxwait() > first })
	mustQuery(ctx, t, watch, "RESUME")
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("transaction held by PAUSE failed after RESUME: %v", err)
		}
	}
	if st := mustQuery(ctx, t, watch, "SHOW STATE"); st.get(t, 0, "value") != "yes" {
		t.Errorf("SHOW STATE after RESUME: %v", st.rows)
	}
}

func TestPauseOneDatabase(t *testing.T) {
	h := newHarness(t, 2)
	ctx := testCtx(t)
	con := h.connect(ctx, t, "admin", "pgquic")
	// Logged in before the pause, so the test sees only their transactions
	// held (a login itself is not held).
	held := h.connect(ctx, t, "postgres", "postgres")
	canceled := h.connect(ctx, t, "postgres", "postgres")
	mustQuery(ctx, t, con, "PAUSE postgres")
	if tb := mustQuery(ctx, t, con, "SHOW DATABASES"); tb.find(t, "name", "postgres") >= 0 {
		if tb.get(t, tb.find(t, "name", "postgres"), "paused") != "1" {
			t.Errorf("SHOW DATABASES paused: %v", tb.rows)
		}
	}
	// Another database runs.
	other := h.connect(ctx, t, "postgres", "template1")
	if _, err := other.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatalf("database template1 while postgres is paused: %v", err)
	}
	errc := make(chan error, 1)
	go func() { _, err := held.Exec(ctx, "SELECT 1").ReadAll(); errc <- err }()
	cancelErr := make(chan error, 1)
	go func() { _, err := canceled.Exec(ctx, "SELECT 1").ReadAll(); cancelErr <- err }()
	waitFor(t, 10*time.Second, "both postgres clients waiting", func() bool {
		pools := mustQuery(ctx, t, con, "SHOW POOLS")
		row := pools.find(t, "database", "postgres")
		return row >= 0 && pools.num(t, row, "cl_waiting") == 2
	})
	// A CancelRequest ends a wait on a paused database, as it ends a wait
	// for a server connection.
	if err := canceled.CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-cancelErr; sqlState(err) != "57014" {
		t.Errorf("cancelled wait: %v, want 57014", err)
	}
	mustQuery(ctx, t, con, `RESUME "postgres"`)
	if err := <-errc; err != nil {
		t.Errorf("held query after RESUME: %v", err)
	}
}

func TestKill(t *testing.T) {
	h := newHarness(t, 2)
	ctx := testCtx(t)
	con := h.connect(ctx, t, "admin", "pgquic")
	victim := h.connect(ctx, t, "postgres", "postgres")
	if _, err := victim.Exec(ctx, "BEGIN; SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	mustQuery(ctx, t, con, "KILL postgres")
	if _, err := victim.Exec(ctx, "SELECT 1").ReadAll(); err == nil {
		t.Fatal("a killed client's session still works")
	}
	// A killed connection whose cancel is still settling may take up to
	// cancelSettleTimeout (6 s) to close; a loaded CI machine adds to it.
	last := ""
	defer func() {
		if t.Failed() {
			t.Logf("last SHOW POOLS row for postgres: %s", last)
		}
	}()
	waitFor(t, 30*time.Second, "no postgres clients or servers after KILL", func() bool {
		pools := mustQuery(ctx, t, con, "SHOW POOLS")
		row := pools.find(t, "database", "postgres")
		if row < 0 {
			return false
		}
		last = fmt.Sprintf("cl_active %d, sv_active %d, sv_idle %d", pools.num(t, row, "cl_active"),
			pools.num(t, row, "sv_active"), pools.num(t, row, "sv_idle"))
		return pools.num(t, row, "cl_active") == 0 && pools.num(t, row, "sv_active") == 0 &&
			pools.num(t, row, "sv_idle") == 0
	})
	// A new client waits until RESUME, as after PgBouncer's KILL.
	next := h.connect(ctx, t, "postgres", "postgres")
	errc := make(chan error, 1)
	go func() { _, err := next.Exec(ctx, "SELECT 1").ReadAll(); errc <- err }()
	waitFor(t, 10*time.Second, "the new client waiting", func() bool {
		pools := mustQuery(ctx, t, con, "SHOW POOLS")
		return pools.num(t, pools.find(t, "database", "postgres"), "cl_waiting") == 1
	})
	mustQuery(ctx, t, con, "RESUME postgres")
	if err := <-errc; err != nil {
		t.Errorf("query after RESUME: %v", err)
	}
	// The console itself survived.
	mustQuery(ctx, t, con, "SHOW VERSION")
}

func TestShutdownCommand(t *testing.T) {
	h := newHarness(t, 2)
	ctx := testCtx(t)
	con := h.connect(ctx, t, "admin", "pgquic")
	if _, err := con.Exec(ctx, "SHUTDOWN").ReadAll(); err != nil {
		t.Fatalf("SHUTDOWN: %v", err)
	}
	select {
	case <-h.shutdown:
	case <-ctx.Done():
		t.Fatal("SHUTDOWN did not start the shutdown")
	}
}

// TestPsql runs psql against the console, as an operator would.
func TestPsql(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("psql not installed (.ci/run installs postgresql-client)")
		}
		t.Skip("psql not installed")
	}
	h := newHarness(t, 2)
	ctx := testCtx(t)
	host, port, _ := strings.Cut(h.ln.Addr().String(), ":")
	run := func(user string) (string, error) {
		cmd := exec.CommandContext(ctx, psql, "-h", host, "-p", port, "-U", user, "-d", "pgquic", "-X", "-c", "SHOW POOLS")
		cmd.Env = append(cmd.Environ(), "PGSSLMODE=disable")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	app := h.connect(ctx, t, "postgres", "postgres")
	if _, err := app.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	out, err := run("admin")
	if err != nil {
		t.Fatalf("psql SHOW POOLS: %v\n%s", err, out)
	}
	for _, col := range []string{"cl_active", "cl_waiting", "sv_active", "sv_idle", "maxwait", "pool_mode"} {
		if !strings.Contains(out, col) {
			t.Errorf("psql output lacks %s:\n%s", col, out)
		}
	}
	if !strings.Contains(out, " postgres ") {
		t.Errorf("psql output lacks the postgres pool:\n%s", out)
	}
	out, err = run("postgres")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(out, "not allowed") {
		t.Errorf("psql as a non-admin user: %v\n%s", err, out)
	}
}
