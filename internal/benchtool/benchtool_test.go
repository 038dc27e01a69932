package benchtool

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// buildDir holds the pgquic binary the tests share; TestMain removes it.
var (
	buildDir  string
	buildOnce sync.Once
	buildErr  error
	buildOut  []byte
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// lockedBuffer is a bytes.Buffer safe for the tool's writes and the test's
// reads, with a hook called on every write.
type lockedBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	onWrite func(string)
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	n, err := l.b.Write(p)
	s := l.b.String()
	l.mu.Unlock()
	if l.onWrite != nil {
		l.onWrite(s)
	}
	return n, err
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// requireTools skips (fails under CI=true) without PostgreSQL or pgbench.
func requireTools(t *testing.T) {
	t.Helper()
	if _, err := pgtest.Binaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI: %v", err)
		}
		t.Skipf("PostgreSQL not installed: %v", err)
	}
	if _, err := lookBin("pgbench"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("pgbench is required under CI (apt-get install postgresql-client)")
		}
		t.Skip("pgbench not installed")
	}
}

// havePgBouncer reports whether PgBouncer is installed; under CI=true it
// must be.
func havePgBouncer(t *testing.T) bool {
	t.Helper()
	if _, err := lookBin("pgbouncer", "/usr/sbin/pgbouncer"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("PgBouncer is required under CI (apt-get install pgbouncer)")
		}
		return false
	}
	return true
}

// buildPgquic builds the pgquic binary once for every test, with the race
// detector when this test has it, so the build reuses the packages
// `go test -race` already compiled.
func buildPgquic(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		if buildDir, buildErr = os.MkdirTemp("", "benchtool-test-"); buildErr != nil {
			return
		}
		for name, pkg := range map[string]string{
			"pgquic":     "github.com/pgquic/pgquic/cmd/pgquic",
			"bare-relay": "github.com/pgquic/pgquic/internal/benchtool/cmd/bare-relay",
		} {
			args := []string{"build", "-o", filepath.Join(buildDir, name)}
			if raceEnabled {
				args = append(args, "-race")
			}
			args = append(args, pkg)
			if buildOut, buildErr = exec.Command(goBin, args...).CombinedOutput(); buildErr != nil {
				buildErr = fmt.Errorf("go build %s: %w", name, buildErr)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatalf("%v\n%s", buildErr, buildOut)
	}
	return filepath.Join(buildDir, "pgquic")
}

// buildRelay returns the bare-relay binary buildPgquic builds beside
// pgquic.
func buildRelay(t *testing.T) string {
	t.Helper()
	return filepath.Join(filepath.Dir(buildPgquic(t)), "bare-relay")
}

// TestQuickRun runs the tool end to end in quick mode, extended protocol,
// 10 clients at saturation and at 1,000 q/s, against direct, pgquic,
// pgquic without pipelining (when the binary has the flag) and PgBouncer
// (when installed; required under CI), and checks that every column of
// every run holds a plausible figure, the summary has its tables and every
// process the tool started is gone afterwards.
func TestQuickRun(t *testing.T) {
	requireTools(t)
	pgquic := buildPgquic(t)
	pipeline, err := hasPipelineFlag(pgquic)
	if err != nil {
		t.Fatal(err)
	}
	// pgquic-nopipe is always asked for: without the flag the tool skips it.
	args := []string{targetDirect, targetPgquic, targetNoPipe, targetRelay}
	targets := []string{targetDirect, targetPgquic, targetRelay}
	if pipeline {
		targets = append(targets, targetNoPipe)
	}
	if havePgBouncer(t) {
		args = append(args, targetBouncer)
		targets = append(targets, targetBouncer)
	}
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr lockedBuffer
	// Ten clients and 2 s runs: a direct client's backend costs tens of
	// milliseconds of CPU to start (direct runs get extra seconds for it).
	code := Main(ctx, []string{"--quick", "--duration", "2", "--pgquic", pgquic, "--relay", buildRelay(t), "--modes", "extended",
		"--clients", "10", "--rate", "1000", "--rate-clients", "10", "--high-rate", "0", "--targets", strings.Join(args, ","),
		"--out", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	text := stdout.String()
	t.Log(text)

	b, err := os.ReadFile(filepath.Join(out, "runs.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if got := strings.Split(lines[0], "\t"); !slices.Equal(got, tsvColumns) {
		t.Fatalf("TSV header %q, want %q", got, tsvColumns)
	}
	if want := 2 * len(targets); len(lines)-1 != want {
		t.Fatalf("%d runs in the TSV, want %d (2 loads x %d targets)", len(lines)-1, want, len(targets))
	}
	seen := map[string]int{}
	for _, line := range lines[1:] {
		f := strings.Split(line, "\t")
		if len(f) != len(tsvColumns) {
			t.Fatalf("%d fields in %q", len(f), line)
		}
		col := map[string]string{}
		for i, name := range tsvColumns {
			col[name] = f[i]
		}
		target := col["target"]
		seen[target]++
		val := func(name string) float64 {
			v, err := strconv.ParseFloat(col[name], 64)
			if err != nil {
				t.Fatalf("%s: column %s = %q: %v", target, name, col[name], err)
			}
			return v
		}
		positive := func(names ...string) {
			for _, n := range names {
				if v := val(n); !(v > 0) {
					t.Errorf("%s, rate %s: %s = %v, want > 0", target, col["rate"], n, v)
				}
			}
		}
		if col["status"] != "ok" || col["failed"] != "0" || col["mode"] != "extended" || col["clients"] != "10" {
			t.Errorf("run %q: want status ok, 0 failed, extended, 10 clients", line)
		}
		positive("tps", "transactions", "latency_ms", "connect_ms", "postgres_cpu_us_per_q", "pgbench_cpu_us_per_q", "seconds")
		if col["rate"] == "1000" {
			// Only the cap is sure: a busy machine may fall short of it.
			if tps := val("tps"); tps > 1250 {
				t.Errorf("%s at 1000 q/s ran %v tps: no rate limit", target, tps)
			}
		} else if target == targetDirect {
			// Each direct client has a backend of its own. A pooler that
			// pipelines may run all ten clients' queries on one or two
			// server connections that a 100 ms sample rarely finds busy.
			positive("busy_server_conns_max")
		}
		if v := val("busy_server_conns_max"); v > 10 || val("busy_server_conns_mean") > v {
			t.Errorf("%s: busy mean %v max %v for 10 clients", target, val("busy_server_conns_mean"), v)
		}
		if target == targetDirect {
			for _, n := range []string{"pooler_cpu_us_per_q", "pooler_rw_syscalls_per_q", "pooler_syscalls_per_q", "pooler_ctx_switches_per_q"} {
				if col[n] != "NA" {
					t.Errorf("direct: %s = %q, want NA", n, col[n])
				}
			}
			continue
		}
		positive("pooler_cpu_us_per_q", "pooler_ctx_switches_per_q")
		if target != targetBouncer {
			// PgBouncer uses recv and send, which syscr/syscw leave out.
			positive("pooler_rw_syscalls_per_q")
		}
		if col["pooler_syscalls_per_q"] != "NA" {
			positive("pooler_syscalls_per_q")
		}
	}
	for _, tg := range targets {
		if seen[tg] != 2 {
			t.Errorf("%d runs of %s, want 2", seen[tg], tg)
		}
	}

	for _, want := range []string{
		"medians over 1 round(s)",
		"| mode | load | target | tps | failed | pooler µs/q | PostgreSQL µs/q | pgbench µs/q |",
		"| extended | saturation, 10 clients | pgquic |",
		"| extended | 1000 q/s, 10 clients | direct |",
		"raw runs (TSV): " + filepath.Join(out, "runs.tsv"),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if slices.Contains(targets, targetBouncer) {
		if !regexp.MustCompile(`pgquic / pgbouncer: tps \d+\.\d\dx, pooler CPU per query \d+\.\d\dx`).MatchString(text) ||
			!strings.Contains(text, "| extended | 1000 q/s, 10 clients | pgquic / pgbouncer | ") {
			t.Error("output lacks the pgquic / PgBouncer ratios")
		}
	}
	if !regexp.MustCompile(`pgquic / relay: tps \d+\.\d\dx, pooler CPU per query \d+\.\d\dx`).MatchString(text) {
		t.Error("output lacks the pgquic / relay ratios")
	}
	if slices.Contains(targets, targetBouncer) && !strings.Contains(text, "| extended | 1000 q/s, 10 clients | relay / pgbouncer | ") {
		t.Error("output lacks the relay / PgBouncer ratios")
	}
	if !pipeline && !strings.Contains(text, "pgquic-nopipe skipped") {
		t.Error("no note that pgquic-nopipe was skipped")
	}
	md, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil || !strings.Contains(text, string(md)) {
		t.Errorf("summary.md (%v) is not the printed Markdown", err)
	}
	assertGone(t, text)
}

// assertGone checks that the poolers and the postmaster whose pids the
// header printed have exited.
func assertGone(t *testing.T, text string) {
	t.Helper()
	pids := regexp.MustCompile(`pid (\d+)`).FindAllStringSubmatch(text, -1)
	for _, m := range pids {
		if _, err := os.Stat("/proc/" + m[1]); err == nil {
			t.Errorf("pid %s still running after the tool returned", m[1])
		}
	}
}

// TestCancelStopsEverything cancels the run once the poolers have started,
// during the warm-up, and checks that the tool returns promptly with an
// error and leaves no pooler or PostgreSQL running.
func TestCancelStopsEverything(t *testing.T) {
	requireTools(t)
	pgquic := buildPgquic(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr lockedBuffer
	var cancelled time.Time
	stdout.onWrite = func(s string) {
		if cancelled.IsZero() && strings.Contains(s, "warming up") {
			cancelled = time.Now()
			cancel()
		}
	}
	start := time.Now()
	code := Main(ctx, []string{"--quick", "--duration", "30", "--pgquic", pgquic, "--targets", "pgquic"},
		&stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit code %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	if cancelled.IsZero() {
		t.Fatal("never cancelled")
	}
	t.Logf("set-up %v, returned %v after cancellation", cancelled.Sub(start), time.Since(cancelled))
	if el := time.Since(cancelled); el > 20*time.Second {
		t.Errorf("returned %v after cancellation", el)
	}
	if !strings.Contains(stderr.String(), "context canceled") {
		t.Errorf("stderr %q, want the cancellation", stderr.String())
	}
	if !strings.Contains(stdout.String(), "postmaster pid") {
		t.Fatalf("no PostgreSQL line in\n%s", stdout.String())
	}
	assertGone(t, stdout.String())
}

// TestBadArguments checks that bad flags give exit code 2 and a message.
func TestBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"--modes", "extended,bogus"},
		{"--targets", "direct,odyssey"},
		{"--clients", "20 x"},
		{"--rounds", "0"},
		{"--clients", "", "--rate", "0", "--high-rate", "0"},
		{"stray"},
	} {
		var stdout, stderr bytes.Buffer
		if code := Main(context.Background(), args, &stdout, &stderr); code != 2 || stderr.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a message", args, code, stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"--targets", "direct"}, &stdout, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "--pgquic PATH is required") {
		t.Errorf("no --pgquic: exit %d, stderr %q", code, stderr.String())
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--pgquic", "/nonexistent/pgquic"}, "--pgquic: stat /nonexistent/pgquic"},
		{[]string{"--pgquic", "/bin/true", "--pgbench", "/nonexistent/pgbench", "--targets", "direct"}, "/nonexistent/pgbench --version"},
		{[]string{"--pgquic", "/bin/true", "--pgbench", "/bin/true", "--pgbouncer", "/nonexistent/pgbouncer", "--targets", "pgbouncer"}, "/nonexistent/pgbouncer --version"},
	} {
		stderr.Reset()
		if code := Main(context.Background(), c.args, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q; want 1 and %q", c.args, code, stderr.String(), c.want)
		}
	}
	if code := Main(context.Background(), []string{"--help"}, &stdout, &stderr); code != 0 ||
		!strings.Contains(stderr.String(), "-high-rate") {
		t.Errorf("--help: exit %d", code)
	}
}

func TestParsePgbench(t *testing.T) {
	out := `pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: <builtin: select only>
scaling factor: 1
query mode: extended
number of clients: 20
number of threads: 2
maximum number of tries: 1
duration: 3 s
number of transactions actually processed: 33519
number of failed transactions: 2 (0.006%)
latency average = 1.790 ms
rate limit schedule lag: avg 0.1 (max 2.0) ms
initial connection time = 21.514 ms
tps = 11173.402841 (without initial connection time)
`
	r, err := parsePgbench(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.tps != 11173.402841 || r.txns != 33519 || r.failed != 2 || r.latencyMs != 1.79 {
		t.Errorf("parsed %+v", r)
	}
	if _, err := parsePgbench("pgbench: error: connection to server failed\n"); err == nil {
		t.Error("no error for output without tps")
	}
	if r, err := parsePgbench("number of transactions actually processed: 0\nnumber of failed transactions: 0 (NaN%)\n"); err != nil || r.tps != 0 {
		t.Errorf("nothing completed: %+v, %v; want tps 0 and no error", r, err)
	}
}

func TestParseStraceAndPerf(t *testing.T) {
	strace := `% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 55.10    0.100000          10     10000           write
 40.00    0.080000           8     12000      2000 read
  4.90    0.009000           9      1000           epoll_pwait
------ ----------- ----------- --------- --------- ----------------
100.00    0.189000           8     23000      2000 total
`
	got := parseStrace(strace)
	want := []straceRow{{"write", 10000}, {"read", 12000}, {"epoll_pwait", 1000}}
	if !slices.Equal(got, want) {
		t.Errorf("strace rows %v, want %v", got, want)
	}
	n, err := parsePerf("# started on ...\n\n123456,,raw_syscalls:sys_enter,2000000000,100.00,,\n")
	if err != nil || n != 123456 {
		t.Errorf("perf: %d, %v", n, err)
	}
	if _, err := parsePerf("<not counted>,,raw_syscalls:sys_enter,0,100.00,,\n"); err == nil {
		t.Error("no error for an uncounted event")
	}
}

// TestProcCounters checks the /proc readers on this test process: CPU
// grows with work, and the counters are positive.
func TestProcCounters(t *testing.T) {
	pid := os.Getpid()
	c0, err := readCounters(pid)
	if err != nil {
		t.Fatal(err)
	}
	x := 0.0
	for i := 0; i < 20_000_000; i++ {
		x += math.Sqrt(float64(i))
	}
	if _, err := os.ReadFile("/proc/self/stat"); err != nil {
		t.Fatal(err)
	}
	c1, err := readCounters(pid)
	if err != nil {
		t.Fatal(err)
	}
	if c1.cpu <= c0.cpu || c1.rwCalls <= c0.rwCalls || c1.switches < c0.switches || x == 0 {
		t.Errorf("counters did not grow: %+v then %+v", c0, c1)
	}
	st, err := readStat(pid)
	if err != nil || st.ppid != os.Getppid() {
		t.Errorf("stat %+v, %v; want ppid %d", st, err, os.Getppid())
	}
	kids, err := childPids(os.Getppid())
	if err != nil || !slices.Contains(kids, pid) {
		t.Errorf("children of %d: %v (%v), want %d among them", os.Getppid(), kids, err, pid)
	}
}

func TestThousands(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 27972.4: "27,972", 1234567: "1,234,567", math.NaN(): "-"} {
		if got := thousands(v); got != want {
			t.Errorf("thousands(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestPgBouncerVersionAndConfig checks that `pgbouncer --version` output is
// parsed, hostile output refused, and that the generated configuration sets
// max_prepared_statements from PgBouncer 1.21 on and marks -M prepared as
// not supported before it, so it is never run and counted as failures.
func TestPgBouncerVersionAndConfig(t *testing.T) {
	for _, c := range []struct {
		out, name string
		ver       [2]int
		prepared  bool
	}{
		{"PgBouncer 1.18.0\nlibevent 2.1.12-stable\nadns: c-ares 1.18.1\ntls: OpenSSL 3.0.11\n", "PgBouncer 1.18.0", [2]int{1, 18}, false},
		{"PgBouncer 1.20.1\n", "PgBouncer 1.20.1", [2]int{1, 20}, false},
		{"PgBouncer 1.21.0\n", "PgBouncer 1.21.0", [2]int{1, 21}, true},
		{"PgBouncer 1.23.1-fixed\n", "PgBouncer 1.23.1", [2]int{1, 23}, true},
		{"PgBouncer 1.25.2\nlibevent 2.1.12-stable\nadns: evdns2\n", "PgBouncer 1.25.2", [2]int{1, 25}, true},
		{"pgbouncer version 1.7.2\n", "PgBouncer 1.7.2", [2]int{1, 7}, false},
		{"PgBouncer 2.0\n", "PgBouncer 2.0", [2]int{2, 0}, true},
	} {
		name, ver, err := parseBouncerVersion([]byte(c.out))
		if err != nil || name != c.name || ver != c.ver {
			t.Errorf("parseBouncerVersion(%q) = %q, %v, %v; want %q, %v", c.out, name, ver, err, c.name, c.ver)
			continue
		}
		if got := bouncerKeepsPrepared(ver); got != c.prepared {
			t.Errorf("%s: keeps prepared statements %v, want %v", name, got, c.prepared)
		}
		ini, flags, skip := bouncerSetup(bouncerConf{name: name, ver: ver, serverPort: 5432, port: 6432, dir: "/d", pool: 20})
		for _, want := range []string{"bench = host=127.0.0.1 port=5432 dbname=bench\n", "listen_port = 6432\n",
			"pool_mode = transaction\n", "default_pool_size = 20\n", "min_pool_size = 20\n", "logfile = /d/pgbouncer.log\n"} {
			if !strings.Contains(ini, want) {
				t.Errorf("%s: pgbouncer.ini lacks %q:\n%s", name, want, ini)
			}
		}
		if !strings.HasPrefix(flags, name+", pool_mode = transaction, default_pool_size = 20") {
			t.Errorf("%s: flags %q do not name the version and pool", name, flags)
		}
		setting := "max_prepared_statements = 200"
		if c.prepared {
			if !strings.Contains(ini, "\n"+setting+"\n") || !strings.Contains(flags, setting) || len(skip) != 0 {
				t.Errorf("%s: want %q in the ini and flags and no mode skipped; flags %q, skip %v, ini:\n%s", name, setting, flags, skip, ini)
			}
			continue
		}
		if strings.Contains(ini, "max_prepared_statements") || strings.Contains(flags, "max_prepared_statements") {
			t.Errorf("%s: max_prepared_statements set for a version without it:\n%s", name, ini)
		}
		if r, ok := skip["prepared"]; !ok || r.short != "not supported by "+name || !strings.Contains(r.why, "1.21") || len(skip) != 1 {
			t.Errorf("%s: skip %v, want only prepared, not supported by %s", name, skip, name)
		}
	}
	for _, out := range []string{"", "pgbouncer: unknown option\n", "PgBouncer x.y\n", "PgBouncer 1\n",
		"PgBouncer 99999999999999999999.1\n", "PgBouncer 1.99999999999999999999\n"} {
		if name, ver, err := parseBouncerVersion([]byte(out)); err == nil {
			t.Errorf("parseBouncerVersion(%q) = %q, %v; want an error", out, name, ver)
		}
	}
}

// TestReportNamesUnsupportedMode checks that a query mode a target skips
// shows in the medians, the ratios and the Markdown summary as not
// supported, with no figures, next to the targets that ran it, and that the
// summary names the PgBouncer it measured.
func TestReportNamesUnsupportedMode(t *testing.T) {
	var w bytes.Buffer
	e := &env{w: &w, cfg: Config{Rounds: 1, Seconds: 3, Pool: 20, Clients: []int{20}, Modes: []string{"extended", "prepared"},
		Out: t.TempDir()}, info: envInfo{bouncer: "PgBouncer 1.18.0"}}
	_, _, skip := bouncerSetup(bouncerConf{name: "PgBouncer 1.18.0", ver: [2]int{1, 18}, pool: 20})
	e.targets = []*target{
		{name: targetPgquic, proc: &child{}, flags: "--pool-size 20"},
		{name: targetBouncer, proc: &child{}, skip: skip, flags: "PgBouncer 1.18.0, pool_mode = transaction, default_pool_size = 20"},
	}
	row := func(mode, target string, tps float64) runRow {
		return runRow{round: 1, mode: mode, clients: 20, target: target, status: "ok", tps: tps, txns: int64(tps) * 3,
			poolerUs: 40, pgUs: 80, pgbenchUs: 30, rwSys: 4, sys: 5, ctxsw: 1, busyMean: 1, busyMax: 3, seconds: 3}
	}
	rows := []runRow{row("extended", targetPgquic, 12000), row("extended", targetBouncer, 10000), row("prepared", targetPgquic, 15000)}
	if err := e.report(rows, nil); err != nil {
		t.Fatal(err)
	}
	text := w.String()
	t.Log(text)
	for _, want := range []string{
		"pgquic / pgbouncer: tps 1.20x",
		"med   prepared saturation, 20 clients pgbouncer     not supported by PgBouncer 1.18.0\n",
		"      pgquic / pgbouncer: not supported by PgBouncer 1.18.0\n",
		"PgBouncer 1.18.0; 1 round(s)",
		"Poolers: pgquic: --pool-size 20; pgbouncer: PgBouncer 1.18.0, pool_mode = transaction, default_pool_size = 20.\n",
		"| prepared | saturation, 20 clients | pgquic | 15,000 | 0 |",
		"| prepared | saturation, 20 clients | pgbouncer | not supported by PgBouncer 1.18.0 | - | - | - | - | - | - | - | - |\n",
		"| extended | saturation, 20 clients | pgquic / pgbouncer | 1.20x | 1.00x | - | 1.00x |\n",
		"| prepared | saturation, 20 clients | pgquic / pgbouncer | not supported by PgBouncer 1.18.0 | - | - | - |\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "| prepared | saturation, 20 clients | pgbouncer | - |") {
		t.Errorf("a skipped mode reported as an empty run:\n%s", text)
	}
}

// TestReportRoundRange checks that the ratios carry the pooler CPU ratio's
// spread over the rounds, pairing each round's runs with each other (not
// the best of one target with the worst of the other), and that a round
// missing one target is left out.
func TestReportRoundRange(t *testing.T) {
	var w bytes.Buffer
	e := &env{w: &w, cfg: Config{Rounds: 4, Seconds: 3, Pool: 20, Rate: 2000, RateClients: 20, Modes: []string{"simple"},
		Out: t.TempDir()}, info: envInfo{bouncer: "PgBouncer 1.18.0"}}
	e.targets = []*target{{name: targetPgquic, proc: &child{}}, {name: targetBouncer, proc: &child{}}}
	row := func(round int, target string, us float64) runRow {
		return runRow{round: round, mode: "simple", clients: 20, rate: 2000, target: target, status: "ok", tps: 2000,
			txns: 6000, poolerUs: us, pgUs: 100, pgbenchUs: 70, busyMean: 0.1, busyMax: 1, seconds: 3}
	}
	rows := []runRow{
		row(1, targetPgquic, 100), row(1, targetBouncer, 80), // 1.25
		row(2, targetPgquic, 120), row(2, targetBouncer, 100), // 1.20
		row(3, targetPgquic, 90), row(3, targetBouncer, 60), // 1.50
		row(4, targetPgquic, 100), // no PgBouncer run in round 4
	}
	if err := e.report(rows, nil); err != nil {
		t.Fatal(err)
	}
	text := w.String()
	for _, want := range []string{
		"pooler CPU per query 1.25x (rounds 1.20–1.50x)",
		"| simple | 2000 q/s, 20 clients | pgquic / pgbouncer | 1.00x | 1.25x | 1.20–1.50x |",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
}
