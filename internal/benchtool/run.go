package benchtool

import (
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/pgquic/pgquic/internal/pgcluster"
)

// benchDB is the database pgbench -i fills and every run queries.
const benchDB = "bench"

// env is one benchmark's running world: the cluster, the poolers, the
// monitoring connection and what was learnt about the machine.
type env struct {
	cfg         Config
	w           io.Writer
	spawn       *spawner
	workDir     string
	cluster     *pgcluster.Cluster
	postmaster  int
	mon         *monitor
	children    []*child // poolers, stopped at the end
	perfBin     string   // empty: perf unusable or --no-perf
	straceBin   string
	bouncerName string // "PgBouncer 1.18.0"
	bouncerVer  [2]int
	targets     []*target
	// connectPerClient is the last direct run's connection time per client
	// and thread, for connectAllowance.
	connectPerClient time.Duration
	notes            []string // skipped targets and modes, for the report
	info             envInfo
}

// envInfo describes the machine and software versions for the report.
type envInfo struct {
	date, kernel, goVersion, pgVersion, pgbench, bouncer, loadStart, loadEnd string
	cpus                                                                     int
}

// load is one pgbench load shape: a client count and, for a fixed-rate
// run, the rate (0 at saturation).
type load struct {
	clients, rate int
}

func (l load) String() string {
	if l.rate == 0 {
		return fmt.Sprintf("saturation, %d clients", l.clients)
	}
	return fmt.Sprintf("%d q/s, %d clients", l.rate, l.clients)
}

// loads lists the load shapes of the i-th mode: every saturation client
// count, the fixed rate, and in the first mode the high rate.
func (c Config) loads(modeIndex int) []load {
	var out []load
	for _, n := range c.Clients {
		out = append(out, load{clients: n})
	}
	if c.Rate > 0 {
		out = append(out, load{clients: c.RateClients, rate: c.Rate})
	}
	if c.HighRate > 0 && modeIndex == 0 {
		out = append(out, load{clients: c.HighRateClients, rate: c.HighRate})
	}
	return out
}

// Run runs the whole benchmark and writes its report to w. Everything it
// starts is stopped before it returns, also on error or cancellation.
func Run(ctx context.Context, cfg Config, w io.Writer) (err error) {
	e := &env{cfg: cfg, w: w}
	if err := e.prerequisites(); err != nil {
		return err
	}
	e.spawn = newSpawner()
	defer e.cleanup()
	if e.workDir, err = os.MkdirTemp("", "pgquic-bench-"); err != nil {
		return err
	}
	if err := os.Chmod(e.workDir, 0o755); err != nil {
		return err
	}
	if cfg.Out == "" {
		cfg.Out = filepath.Join(os.TempDir(), "pgquic-bench-"+time.Now().Format("20060102-150405"))
		e.cfg.Out = cfg.Out
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	if err := e.setUp(ctx); err != nil {
		return err
	}
	e.printHeader()

	rows, err := e.rounds(ctx)
	if err != nil {
		return err
	}
	var traces []straceReport
	if cfg.Strace {
		if traces, err = e.straceRuns(ctx); err != nil {
			return err
		}
	}
	e.info.loadEnd = loadAvg()
	return e.report(rows, traces)
}

// prerequisites finds every program the run needs and fails with what to
// install when one is missing.
func (e *env) prerequisites() error {
	c := &e.cfg
	if runtime.GOOS != "linux" {
		return errors.New("Linux only: CPU, system calls and context switches come from /proc")
	}
	if c.PgquicBin == "" {
		return errors.New("--pgquic PATH is required (scripts/bench-pgbouncer builds the binary and passes it)")
	}
	if _, err := os.Stat(c.PgquicBin); err != nil {
		return fmt.Errorf("--pgquic: %w", err)
	}
	if slices.Contains(c.Targets, targetBaseline) {
		if c.BaselineBin == "" {
			return errors.New("the baseline target needs --baseline PATH, another pgquic binary")
		}
		if _, err := os.Stat(c.BaselineBin); err != nil {
			return fmt.Errorf("--baseline: %w", err)
		}
	}
	if slices.Contains(c.Targets, targetRelay) {
		if c.RelayBin == "" {
			return errors.New("the relay target needs --relay PATH (scripts/bench-pgbouncer builds bare-relay and passes it)")
		}
		if _, err := os.Stat(c.RelayBin); err != nil {
			return fmt.Errorf("--relay: %w", err)
		}
	}
	var err error
	if c.PgbenchBin == "" {
		if c.PgbenchBin, err = lookBin("pgbench"); err != nil {
			return errors.New("pgbench not found (apt-get install postgresql-client)")
		}
	}
	out, err := exec.Command(c.PgbenchBin, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w", c.PgbenchBin, err)
	}
	e.info.pgbench = strings.TrimSpace(string(out))
	if slices.Contains(c.Targets, targetBouncer) {
		if c.PgbouncerBin == "" {
			if c.PgbouncerBin, err = lookBin("pgbouncer", "/usr/sbin/pgbouncer"); err != nil {
				return errors.New("pgbouncer not found (apt-get install pgbouncer), or leave it out with --targets")
			}
		}
		if e.bouncerName, e.bouncerVer, err = pgbouncerVersion(c.PgbouncerBin); err != nil {
			return err
		}
	}
	if _, err := pgcluster.Binaries(); err != nil {
		return fmt.Errorf("PostgreSQL server binaries not found (apt-get install postgresql, or set PGTEST_BINDIR): %w", err)
	}
	if slices.Contains(c.Targets, targetNoPipe) {
		ok, err := hasPipelineFlag(c.PgquicBin)
		if err != nil {
			return err
		}
		if !ok {
			e.notes = append(e.notes, "pgquic-nopipe skipped: this pgquic has no `serve --pipeline-depth` flag")
			c.Targets = slices.DeleteFunc(c.Targets, func(s string) bool { return s == targetNoPipe })
			if len(c.Targets) == 0 {
				return errors.New("no target left: this pgquic has no `serve --pipeline-depth` flag for pgquic-nopipe")
			}
		}
	}
	if !c.NoPerf {
		e.perfBin, _ = perfUsable()
	}
	if c.Strace {
		if e.straceBin, err = exec.LookPath("strace"); err != nil {
			e.notes = append(e.notes, "--strace ignored: strace is not installed")
			c.Strace = false
		}
	}
	return nil
}

// setUp starts the cluster, fills the bench database, connects the
// monitor, starts the poolers and warms every target up.
func (e *env) setUp(ctx context.Context) error {
	var err error
	e.info.date, e.info.kernel = time.Now().UTC().Format("2006-01-02 15:04 UTC"), kernelRelease()
	e.info.cpus, e.info.loadStart, e.info.bouncer = runtime.NumCPU(), loadAvg(), e.bouncerName
	if bi, err := buildinfo.ReadFile(e.cfg.PgquicBin); err == nil {
		e.info.goVersion = bi.GoVersion
	} else {
		e.info.goVersion = runtime.Version()
	}
	fmt.Fprintf(e.w, "starting PostgreSQL...\n")
	e.cluster, err = pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{
		"max_connections": "400",
		"shared_buffers":  "128MB",
	}})
	if err != nil {
		return err
	}
	if e.postmaster, err = postmasterPid(e.cluster.DataDir); err != nil {
		return err
	}
	fmt.Fprintf(e.w, "  %-14s port %d, postmaster pid %d\n", "PostgreSQL", e.cluster.Port, e.postmaster)
	if err := e.cluster.Exec(ctx, "CREATE DATABASE "+benchDB); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, e.cfg.PgbenchBin, "-i", "-s", "1", "-q", "-h", "127.0.0.1",
		"-p", fmt.Sprint(e.cluster.Port), "-U", "postgres", benchDB).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgbench -i: %w\n%s", err, tail(string(out), 10))
	}
	if e.mon, err = connectMonitor(ctx, e.cluster.SuperURL("postgres"), benchDB); err != nil {
		return err
	}
	if e.info.pgVersion, err = e.mon.one(ctx, "SHOW server_version"); err != nil {
		return err
	}
	e.info.pgVersion = "PostgreSQL " + e.info.pgVersion

	for _, name := range e.cfg.Targets {
		var t *target
		switch name {
		case targetDirect:
			t = &target{name: targetDirect, port: e.cluster.Port}
		case targetPgquic:
			t, err = e.startPgquic(ctx, targetPgquic, e.cfg.PgquicFlags)
		case targetNoPipe:
			t, err = e.startPgquic(ctx, targetNoPipe, append(slices.Clone(e.cfg.PgquicFlags), "--"+pipelineFlag, "0"))
		case targetBouncer:
			t, err = e.startPgBouncer(ctx)
		case targetRelay:
			t, err = e.startRelay(ctx)
		case targetBaseline:
			t, err = e.startPgquicBin(ctx, e.cfg.BaselineBin, targetBaseline, e.cfg.PgquicFlags)
		}
		if err != nil {
			return err
		}
		if t.proc != nil {
			fmt.Fprintf(e.w, "  %-14s port %d, pid %d (%s)\n", t.name, t.port, t.pid(), t.flags)
		} else {
			fmt.Fprintf(e.w, "  %-14s port %d, PostgreSQL's own\n", t.name, t.port)
		}
		for mode, r := range t.skip {
			if slices.Contains(e.cfg.Modes, mode) {
				e.notes = append(e.notes, fmt.Sprintf("%s skipped in -M %s: %s; %s", t.name, mode, r.short, r.why))
			}
		}
		e.targets = append(e.targets, t)
	}

	// Warm-up: fill the pools and PostgreSQL's caches before measuring.
	warm := min(max(1, e.cfg.Seconds/3), 2)
	fmt.Fprintf(e.w, "warming up (%d s per target)...\n", warm)
	for _, t := range e.targets {
		mode := e.cfg.Modes[0]
		if _, skip := t.skip[mode]; skip {
			mode = "extended"
		}
		res, err := e.runPgbench(ctx, pgbenchArgs(mode, e.cfg.Pool, e.cfg.Jobs, 0, warm, t.port, benchDB))
		if err != nil {
			return fmt.Errorf("warm-up through %s: %w", t.name, err)
		}
		if t.name == targetDirect {
			// pgbench connects each thread's clients one after another.
			e.connectPerClient = time.Duration(res.connectMs*float64(time.Millisecond)) * time.Duration(min(e.cfg.Jobs, e.cfg.Pool)) / time.Duration(e.cfg.Pool)
		}
	}
	return nil
}

// plannedRuns counts the measured runs, for the time estimate.
func (e *env) plannedRuns() int {
	n := 0
	for mi, mode := range e.cfg.Modes {
		for range e.cfg.loads(mi) {
			for _, t := range e.targets {
				if _, skip := t.skip[mode]; !skip {
					n++
				}
			}
		}
	}
	return n * e.cfg.Rounds
}

// rounds runs every (mode, load, target) once per round, the targets
// interleaved and their order rotated each round so no target always
// follows the same one.
func (e *env) rounds(ctx context.Context) ([]runRow, error) {
	var rows []runRow
	printRowHeader(e.w)
	for r := 1; r <= e.cfg.Rounds; r++ {
		for mi, mode := range e.cfg.Modes {
			for _, ld := range e.cfg.loads(mi) {
				for i := range e.targets {
					t := e.targets[(i+r-1)%len(e.targets)]
					if _, skip := t.skip[mode]; skip {
						continue
					}
					row, err := e.measure(ctx, r, mode, ld, t)
					if err != nil {
						return rows, err
					}
					printRow(e.w, row)
					rows = append(rows, row)
				}
			}
		}
	}
	return rows, nil
}

// measure runs pgbench once against t and samples every counter around it.
func (e *env) measure(ctx context.Context, round int, mode string, ld load, t *target) (runRow, error) {
	row := runRow{round: round, mode: mode, clients: ld.clients, rate: ld.rate, target: t.name,
		poolerUs: math.NaN(), rwSys: math.NaN(), sys: math.NaN(), ctxsw: math.NaN()}
	if t.proc != nil && t.proc.exited() {
		return row, fmt.Errorf("%s exited during the benchmark: %v (log in %s)", t.name, t.proc.err, e.workDir)
	}
	_, baseBackends, err := e.mon.counts(ctx)
	if err != nil {
		return row, err
	}
	var perf *perfCounter
	if t.pid != nil && e.perfBin != "" {
		if perf, err = e.startPerf(ctx, t.pid(), t.name); err != nil {
			return row, err
		}
		defer func() {
			if perf != nil {
				_, _ = perf.stop()
			}
		}()
	}
	smp := e.mon.startSampling(ctx)
	var c0, c1 counters
	if t.pid != nil {
		if c0, err = readCounters(t.pid()); err != nil {
			_, _ = smp.stop()
			return row, fmt.Errorf("%s counters: %w", t.name, err)
		}
	}
	pg0, err := clusterCPU(e.postmaster, e.mon.pid)
	if err != nil {
		_, _ = smp.stop()
		return row, err
	}
	seconds := e.cfg.Seconds
	if t.backendPerClient() {
		seconds += e.connectAllowance(ld.clients)
	}
	start := time.Now()
	run, err := e.startPgbench(pgbenchArgs(mode, ld.clients, e.cfg.Jobs, ld.rate, seconds, t.port, benchDB))
	if err != nil {
		_, _ = smp.stop()
		return row, err
	}
	if t.backendPerClient() {
		// A direct (or relayed) run starts a backend per client, which
		// costs far more than the queries; the poolers' server
		// connections are already there. Start PostgreSQL's window, and
		// the relay's, once every client is connected.
		e.mon.waitBackendsAtLeast(ctx, baseBackends+ld.clients, time.Duration(seconds)*time.Second, run.c.done)
		if pg0, err = clusterCPU(e.postmaster, e.mon.pid); err == nil && t.pid != nil {
			c0, err = readCounters(t.pid())
		}
		if err != nil {
			_ = run.c.cmd.Process.Kill()
			_, _ = run.wait(ctx)
			_, _ = smp.stop()
			return row, err
		}
	}
	res, berr := run.wait(ctx)
	row.seconds = time.Since(start).Seconds()
	busy, serr := smp.stop()
	if berr != nil || ctx.Err() != nil {
		return row, errors.Join(berr, ctx.Err())
	}
	if serr != nil {
		return row, serr
	}
	if t.backendPerClient() {
		// pgbench's backends exit after it does; let them go so their
		// CPU is in the postmaster's cutime when it is read.
		e.mon.waitBackendsAtMost(ctx, baseBackends, 5*time.Second)
	}
	pg1, err := clusterCPU(e.postmaster, e.mon.pid)
	if err != nil {
		return row, err
	}
	if t.pid != nil {
		if c1, err = readCounters(t.pid()); err != nil {
			return row, fmt.Errorf("%s counters: %w", t.name, err)
		}
	}
	if perf != nil {
		n, err := perf.stop()
		perf = nil
		if err != nil {
			return row, err
		}
		row.sys = perQuery(float64(n), res.txns)
	}

	if t.name == targetDirect {
		if res.connectMs > 0 {
			e.connectPerClient = time.Duration(res.connectMs*float64(time.Millisecond)) * time.Duration(min(e.cfg.Jobs, ld.clients)) / time.Duration(ld.clients)
		} else if res.txns == 0 {
			e.connectPerClient = max(2*e.connectPerClient, 10*time.Millisecond)
		}
	}
	row.status = "ok"
	if res.txns == 0 {
		row.status = "no-transactions"
		fmt.Fprintf(e.w, "no transaction completed through %s in %d s (connecting took the whole run?): lengthen --duration\n", t.name, e.cfg.Seconds)
	}
	if res.aborted {
		row.status = "aborted"
		fmt.Fprintf(e.w, "pgbench through %s exited with an error:\n%s\n", t.name, tail(res.output, 4))
	}
	row.tps, row.txns, row.failed, row.latencyMs, row.connectMs = res.tps, res.txns, res.failed, res.latencyMs, res.connectMs
	if res.txns == 0 {
		row.tps, row.latencyMs = math.NaN(), math.NaN()
	}
	row.pgUs = perQuery(float64((pg1 - pg0).Microseconds()), res.txns)
	row.pgbenchUs = perQuery(float64(res.cpu.Microseconds()), res.txns)
	if t.pid != nil {
		row.poolerUs = perQuery(float64((c1.cpu - c0.cpu).Microseconds()), res.txns)
		row.rwSys = perQuery(float64(c1.rwCalls-c0.rwCalls), res.txns)
		row.ctxsw = perQuery(float64(c1.switches-c0.switches), res.txns)
	}
	row.busyMean, row.busyMax = busy.mean, busy.max
	return row, nil
}

// connectAllowance is how many seconds a direct run gets on top of
// --duration for pgbench to connect its clients, which it does one after
// another in each thread, each starting a backend: pgbench's -T counts from
// before the connections, and 200 of them can take longer than the run on a
// busy machine. It is estimated from the last direct run's connection time.
func (e *env) connectAllowance(clients int) int {
	perThread := (clients + e.cfg.Jobs - 1) / e.cfg.Jobs
	est := time.Duration(perThread) * e.connectPerClient
	return int(math.Ceil(est.Seconds() * 1.5))
}

// perQuery divides a counter by the transactions pgbench completed (one
// query each with -S); NaN when none completed.
func perQuery(v float64, txns int64) float64 {
	if txns <= 0 {
		return math.NaN()
	}
	return v / float64(txns)
}

// cleanup stops the poolers, the monitor and the cluster, and removes the
// work directory.
func (e *env) cleanup() {
	for _, c := range e.children {
		c.stop(syscall.SIGTERM)
	}
	if e.mon != nil {
		e.mon.close()
	}
	if e.cluster != nil {
		if err := e.cluster.Stop(); err != nil {
			fmt.Fprintf(e.w, "stopping PostgreSQL: %v\n", err)
		}
	}
	e.spawn.close()
	if e.workDir != "" {
		_ = os.RemoveAll(e.workDir)
	}
}

// kernelRelease is `uname -r`.
func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// loadAvg is the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// printHeader says what will run and roughly how long it takes.
func (e *env) printHeader() {
	i := e.info
	fmt.Fprintf(e.w, "\n%s; Linux %s, %d CPUs, %s, %s, %s, %s; load average %s\n", i.date, i.kernel, i.cpus,
		i.goVersion, i.pgVersion, i.pgbench, orDash(i.bouncer), i.loadStart)
	for _, n := range e.notes {
		fmt.Fprintf(e.w, "  note: %s\n", n)
	}
	if e.perfBin == "" {
		fmt.Fprintf(e.w, "  note: perf unusable or off: no count of all system calls (sys column)\n")
	}
	n := e.plannedRuns()
	fmt.Fprintf(e.w, "%d runs of %d s in %d round(s), about %.0f min\n", n, e.cfg.Seconds, e.cfg.Rounds,
		math.Ceil(float64(n)*(float64(e.cfg.Seconds)+1.5)/60))
}
