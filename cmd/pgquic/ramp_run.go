package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/udplb"
	"github.com/pgquic/pgquic/loadgen"
	"github.com/pgquic/pgquic/loadgen/model"
	"github.com/pgquic/pgquic/loadgen/report"
	"github.com/pgquic/pgquic/loadgen/wan"
)

// Bounds of the ramp's set-up steps, so that nothing waits forever.
const (
	// rampSetupTimeout bounds starting the in-process pooler (and a
	// throwaway PostgreSQL's initdb) and the calibration.
	rampSetupTimeout = 3 * time.Minute
	// probeTimeout bounds the first connection to each endpoint and its
	// first query: an unreachable target fails within it.
	probeTimeout = 5 * time.Second
	// calibrateBudget bounds the calibration's timed queries per endpoint;
	// a slow query gets fewer samples rather than a long wait.
	calibrateBudget = 5 * time.Second
	// calibrateWarmup queries are run and discarded before timing.
	calibrateWarmup = 10
	// rampConnectParallel is how many sessions connect at once before a
	// run: each costs several emulated round trips.
	rampConnectParallel = 100
	// rampShutdownGrace bounds the in-process pooler's drain at exit; by
	// then every client session is closed.
	rampShutdownGrace = 5 * time.Second
)

// transportLabel names a transport as the output and the report show it.
func transportLabel(tr loadgen.Transport, tls bool) string {
	if tr == loadgen.TCP && tls {
		return "tcp+tls"
	}
	return string(tr)
}

// rampSession is one run of the ramp command: everything it started, so
// that one close tears it all down whatever happened.
type rampSession struct {
	rc     *rampConfig
	env    rampEnv
	out    io.Writer
	logger *slog.Logger
	log    io.Writer // stderr, for the emulator's log at debug and info

	tmpDir     string // the generated certificate of the in-process pooler
	edgeCert   string // --session-per-query: the edge's certificate, which the pooler trusts
	edgeKey    string
	srv        *server
	stopSrv    context.CancelFunc
	srvDone    chan error
	pin        string                       // the in-process pooler's certificate fingerprint
	backendDSN string                       // PostgreSQL itself, for calibration; "" when unknown
	addrs      map[loadgen.Transport]string // what each transport measures

	exec     time.Duration                       // median execution time, direct to PostgreSQL
	through  map[loadgen.Transport]time.Duration // median through each endpoint without the WAN
	measured bool                                // exec was measured directly

	scheduling string // "realtime" or "normal", for the report
}

// rampResult is one transport's measurement with what the summary prints
// beside the report's figures.
type rampResult struct {
	label   string
	run     report.Run
	res     *loadgen.Result
	latency time.Duration // the emulator's mean lateness per hop
	lateMax time.Duration // and its largest
	latePkt uint64        // hops the lateness was averaged over
}

// rampMain runs a validated ramp and returns the exit code.
func rampMain(ctx context.Context, rc *rampConfig, env rampEnv, stdout, stderr io.Writer) int {
	logger, _ := newLogger(stderr, rc.logLevel, rc.logFormat) // validated with the flags
	rs := &rampSession{rc: rc, env: env, out: stdout, logger: logger, log: stderr,
		addrs: map[loadgen.Transport]string{}, through: map[loadgen.Transport]time.Duration{}}
	defer rs.close()

	started := env.now()
	dir := rc.outDir(started)
	createdDir, err := prepareOut(dir, rc.jsonFile)
	if err != nil {
		fmt.Fprintf(stderr, "pgquic ramp: %v\n", err)
		return 1
	}
	permitted := env.packetPermitted
	if permitted == nil {
		permitted = func() error { return errors.New("packet mode is not available to this run") }
	}
	if err := rc.resolveWAN(permitted); err != nil {
		_ = os.Remove(dir)
		fmt.Fprintf(stderr, "pgquic ramp: %v\n", err)
		return 2
	}
	fail := func(err error) int {
		if createdDir {
			_ = os.Remove(dir) // only if still empty
		}
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "pgquic ramp: interrupted before anything was measured\n")
			return rampInterrupted
		}
		fmt.Fprintf(stderr, "pgquic ramp: %v\n", err)
		return 1
	}

	// Before anything starts, so that the emulators and a throwaway
	// PostgreSQL inherit the scheduling too.
	rs.enterScheduling()
	rs.printScenario()
	setupCtx, cancel := context.WithTimeout(ctx, rampSetupTimeout)
	defer cancel()
	if !rc.targetMode() {
		if err := rs.startPooler(setupCtx); err != nil {
			return fail(err)
		}
	} else {
		rs.backendDSN = rc.dsn
		if rc.tcpTarget != "" {
			rs.addrs[loadgen.TCP] = rc.tcpTarget
		}
		if rc.quicTarget != "" {
			rs.addrs[loadgen.QUIC] = rc.quicTarget
		}
	}
	if err := rs.calibrate(setupCtx); err != nil {
		return fail(err)
	}
	cancel()
	rs.printModel()

	rep := rs.newReport(started)
	var results []rampResult
	var runErr error
	for _, run := range rc.runs() {
		stop, err := startRunProfile(rc.cpuProfile, runLabel(run, rs.runClientConfig(run)))
		if err != nil {
			return fail(err)
		}
		r, err := rs.runTransport(ctx, run)
		stop()
		if r != nil {
			results = append(results, *r)
			rep.Runs = append(rep.Runs, r.run)
		}
		if err != nil {
			runErr = err
			break
		}
		if ctx.Err() != nil {
			break
		}
	}
	interrupted := ctx.Err() != nil

	if len(results) > 0 {
		fmt.Fprintln(stdout)
		printSummary(stdout, rep, results)
	}
	if len(rep.Runs) == 0 {
		if runErr == nil {
			runErr = errors.New("no transport was measured")
		}
		return fail(runErr)
	}
	written, werr := writeOutputs(rep, dir, rc.jsonFile)
	for _, p := range written {
		fmt.Fprintf(stdout, "wrote %s\n", p)
	}
	switch {
	case werr != nil:
		fmt.Fprintf(stderr, "pgquic ramp: %v\n", werr)
		return 1
	case interrupted:
		fmt.Fprintf(stderr, "pgquic ramp: interrupted; the results above and in the files cover what was measured\n")
		return rampInterrupted
	case runErr != nil:
		fmt.Fprintf(stderr, "pgquic ramp: %v\n", runErr)
		return 1
	}
	return 0
}

// startRunProfile starts a Go CPU profile of one run into path with the
// run's label before its extension (ramp.pprof becomes ramp.quic.pprof),
// so each transport's cost can be read apart: one profile over all runs
// mixes the TCP run's work with QUIC's, and both share the pooler. It
// returns the function that stops and closes the profile; with no path it
// does nothing.
func startRunProfile(path, label string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	ext := filepath.Ext(path)
	name := strings.TrimSuffix(path, ext) + "." + label + ext
	f, err := os.Create(name)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("--cpuprofile %s: %w", name, err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// prepareOut makes sure the results can be written before anything is
// measured: it creates dir (reporting whether it did, so a run that
// measures nothing can remove it again) and checks that jsonFile's
// directory exists.
func prepareOut(dir, jsonFile string) (created bool, err error) {
	if jsonFile != "" {
		if fi, err := os.Stat(filepath.Dir(jsonFile)); err != nil || !fi.IsDir() {
			return false, fmt.Errorf("--json %s: its directory does not exist", jsonFile)
		}
	}
	if dir == "" {
		return false, nil
	}
	if _, err := os.Stat(dir); err == nil {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("--out: %w", err)
	}
	return true, nil
}

// writeOutputs writes DIR/ramp.json and DIR/report.html (when dir is set)
// and jsonFile (when set), returning the paths written.
func writeOutputs(rep *report.Report, dir, jsonFile string) ([]string, error) {
	var written []string
	if dir != "" {
		p := filepath.Join(dir, "ramp.json")
		if err := rep.WriteJSON(p); err != nil {
			return written, err
		}
		written = append(written, p)
		p = filepath.Join(dir, "report.html")
		if err := rep.WriteHTMLFile(p); err != nil {
			return written, err
		}
		written = append(written, p)
	}
	if jsonFile != "" {
		if err := rep.WriteJSON(jsonFile); err != nil {
			return written, err
		}
		written = append(written, jsonFile)
	}
	return written, nil
}

// startPooler starts the in-process pooler (and, without --dsn, a
// throwaway PostgreSQL behind it) with a TCP front whose TLS uses a
// generated certificate and a QUIC front with the same certificate.
func (rs *rampSession) startPooler(ctx context.Context) error {
	rc := rs.rc
	dir, err := os.MkdirTemp("", "pgquic-ramp-*")
	if err != nil {
		return err
	}
	rs.tmpDir = dir
	certFile, keyFile, err := writeBenchCert(dir, "server")
	if err != nil {
		return fmt.Errorf("generate a certificate: %w", err)
	}
	if rs.pin, err = certFileFingerprint(certFile); err != nil {
		return err
	}
	trustFile := ""
	if rc.churn {
		// The edge path's sessions start without a password exchange: the
		// pooler trusts the edge's certificate for every user and database.
		if rs.edgeCert, rs.edgeKey, trustFile, err = writeTrustedEdge(dir); err != nil {
			return fmt.Errorf("generate the edge's certificate: %w", err)
		}
	}

	cfg := config.Default()
	cfg.TCPListen, cfg.QUICListen, cfg.MetricsListen = "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.Backend = rc.dsn
	cfg.PoolSize = rc.poolSize
	cfg.PipelineDepth = max(rc.pipelineDepth, 1) // 0 means off, as for pgquic serve
	cfg.TLSCert, cfg.TLSKey, cfg.EdgeTrust = certFile, keyFile, trustFile
	cfg.ShutdownGrace = rampShutdownGrace
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("in-process pooler: %w", err)
	}
	if rc.dsn == "" {
		fmt.Fprintln(rs.out, "starting a throwaway PostgreSQL (pass --dsn to use your own)...")
	}
	srv, err := startServer(ctx, cfg, rs.logger)
	if err != nil {
		return fmt.Errorf("start the in-process pooler: %w", err)
	}
	rs.srv = srv
	runCtx, stop := context.WithCancel(context.Background())
	rs.stopSrv, rs.srvDone = stop, make(chan error, 1)
	go func() { rs.srvDone <- srv.Run(runCtx) }()

	rs.backendDSN = rc.dsn
	if srv.cluster != nil {
		rs.backendDSN = srv.cluster.SuperURL(rc.database)
		fmt.Fprintf(rs.out, "PostgreSQL: throwaway cluster on %s:%d (deleted at exit)\n", srv.cluster.Host, srv.cluster.Port)
	}
	rs.addrs[loadgen.TCP] = srv.tcp.Addr().String()
	rs.addrs[loadgen.QUIC] = srv.quic.Addr().String()
	fmt.Fprintf(rs.out, "pooler: in process, pool_size %d, TCP %s (TLS: generated certificate), QUIC %s\n",
		rc.poolSize, rs.addrs[loadgen.TCP], rs.addrs[loadgen.QUIC])
	return nil
}

// close stops the in-process pooler (and its throwaway PostgreSQL) and
// removes the generated certificate.
func (rs *rampSession) close() {
	if rs.srv != nil {
		rs.stopSrv()
		if err := <-rs.srvDone; err != nil {
			rs.logger.Warn("in-process pooler", "err", err)
		}
		rs.srv = nil
	}
	if rs.tmpDir != "" {
		_ = os.RemoveAll(rs.tmpDir)
		rs.tmpDir = ""
	}
}

// clientConfig is the configuration of tr's sessions, straight to the
// endpoint (the caller adds the relay).
func (rs *rampSession) clientConfig(tr loadgen.Transport) loadgen.ClientConfig {
	rc := rs.rc
	cc := loadgen.ClientConfig{
		Transport:       tr,
		Addr:            rs.addrs[tr],
		User:            rc.user,
		Database:        rc.database,
		Query:           rc.query,
		ConnectTimeout:  probeTimeout + 10*rc.rtt,
		ConnectParallel: rampConnectParallel,
	}
	if rc.targetMode() {
		cc.Password = os.Getenv("PGPASSWORD")
		cc.CAFile, cc.PinSHA256, cc.Insecure = rc.ca, rc.pin, rc.insecure
	} else {
		cc.PinSHA256 = rs.pin
	}
	switch tr {
	case loadgen.TCP:
		cc.Conns = rc.tcpConns
		cc.DisableTLS = !rc.tcpTLS
	case loadgen.QUIC:
		cc.Conns, cc.Streams = rc.quicConns, rc.streams
	}
	return cc
}

// endpointName names what tr measures, by the flag that chose it, for messages.
func (rs *rampSession) endpointName(tr loadgen.Transport) string {
	switch {
	case tr == loadgen.TCP && rs.rc.tcpTarget != "":
		return "--tcp-target " + rs.rc.tcpTarget
	case tr == loadgen.QUIC && rs.rc.quicTarget != "":
		return "--quic-target " + rs.rc.quicTarget
	}
	return fmt.Sprintf("the in-process pooler's %s front", strings.ToUpper(string(tr)))
}

// calibrate checks each endpoint and the query before any load (an
// unreachable target or a failing query ends the ramp here, within
// seconds) and measures, without the WAN, the median latency of sequential
// queries: directly on PostgreSQL (the model's execution time) and through
// each endpoint (minus the execution time: the pooler's overhead).
func (rs *rampSession) calibrate(ctx context.Context) error {
	rc := rs.rc
	if rs.backendDSN != "" {
		d, err := calibrateDirect(ctx, rs.backendDSN, rc.query, rc.calibrate)
		if err != nil {
			return fmt.Errorf("PostgreSQL: %w", err)
		}
		rs.exec, rs.measured = d, rc.calibrate > 0
	}
	for _, tr := range rc.transports() {
		cc := rs.clientConfig(tr)
		cc.Conns, cc.Streams, cc.ConnectTimeout = 1, 1, probeTimeout
		d, err := calibrateEndpoint(ctx, cc, rc.calibrate, rs.logger)
		if err != nil {
			return fmt.Errorf("%s: %w", rs.endpointName(tr), err)
		}
		rs.through[tr] = d
	}
	return nil
}

// calibrateDirect connects to PostgreSQL itself and times the query.
func calibrateDirect(ctx context.Context, dsn, query string, n int) (time.Duration, error) {
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	conn, err := pgconn.Connect(pctx, dsn)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("cannot connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	return timeQueries(ctx, n, func(ctx context.Context) error {
		_, err := conn.Exec(ctx, query).ReadAll()
		return err
	})
}

// calibrateEndpoint opens one session to the endpoint of cc and times the
// query through it.
func calibrateEndpoint(ctx context.Context, cc loadgen.ClientConfig, n int, logger *slog.Logger) (time.Duration, error) {
	c, err := loadgen.Connect(ctx, cc, logger)
	if err != nil {
		if errors.Is(err, loadgen.ErrConnect) {
			return 0, fmt.Errorf("cannot connect within %v: %w", cc.ConnectTimeout, err)
		}
		return 0, err
	}
	defer c.Close()
	w := c.Workers()[0]
	return timeQueries(ctx, n, w.Do)
}

// timeQueries runs the query once (its failure is the caller's error),
// then a few warm-up queries, then up to n timed ones within
// calibrateBudget, and returns their median latency (0 when n is 0).
func timeQueries(ctx context.Context, n int, do func(context.Context) error) (time.Duration, error) {
	qctx, cancel := context.WithTimeout(ctx, probeTimeout)
	err := do(qctx)
	timedOut := qctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		if timedOut {
			return 0, fmt.Errorf("the query did not answer within %v (check --query): %w", probeTimeout, err)
		}
		return 0, fmt.Errorf("the query failed (check --query): %w", err)
	}
	if n == 0 {
		return 0, nil
	}
	bctx, cancel := context.WithTimeout(ctx, calibrateBudget)
	defer cancel()
	var times []time.Duration
	for i := 0; i < calibrateWarmup+n; i++ {
		start := time.Now()
		if err := do(bctx); err != nil {
			if bctx.Err() != nil && ctx.Err() == nil && len(times) > 0 {
				break // out of time: the samples so far will do
			}
			return 0, fmt.Errorf("the query failed during calibration: %w", err)
		}
		if i >= calibrateWarmup {
			times = append(times, time.Since(start))
		}
	}
	if len(times) == 0 {
		return 0, fmt.Errorf("no calibration query finished within %v", calibrateBudget)
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

// modelFor returns the execution time and pooler overhead the model uses
// for tr: the direct median, and the median through the endpoint minus it.
// Without a direct measurement (target mode without --dsn) the whole
// median through the endpoint counts as execution time.
func (rs *rampSession) modelFor(tr loadgen.Transport) (exec, overhead time.Duration) {
	through := rs.through[tr]
	if !rs.measured {
		return through, 0
	}
	return rs.exec, max(through-rs.exec, 0)
}

// predictions returns the model's client-side and pool ceilings for tr.
func (rs *rampSession) predictions(tr loadgen.Transport) (ceiling, pool float64) {
	cc := rs.clientConfig(tr)
	exec, overhead := rs.modelFor(tr)
	ceiling = model.Ceiling(cc.Sessions(), rs.rc.rtt+exec+overhead)
	if rs.rc.poolSize > 0 {
		// The in-process pooler pipelines across clients (--pipeline-depth):
		// its pool carries up to depth queries per server connection. A
		// target's depth is unknown, so its bound stays unpipelined.
		depth := 1
		if !rs.rc.targetMode() {
			depth = rs.rc.pipelineDepth
		}
		pool = model.PipelinedPoolCeiling(rs.rc.poolSize, depth, exec, overhead)
	}
	return ceiling, pool
}

// newReport starts the report with the scenario and the machine.
func (rs *rampSession) newReport(started time.Time) *report.Report {
	rc := rs.rc
	arrivals := "linear"
	switch {
	case rc.poisson:
		arrivals = "poisson"
	case rc.from == rc.to:
		arrivals = "constant"
	}
	m := &report.Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH, GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return &report.Report{
		Scenario: report.Scenario{
			RTTMs: msOf(rc.rtt), JitterMs: msOf(rc.jitter), FromQPS: rc.from, ToQPS: rc.to,
			DurationS: rc.duration.Seconds(), Query: rc.query, PoolSize: rc.poolSize,
			Arrivals: arrivals, Scheduling: rs.scheduling,
			WAN: rc.wanMode, WANNote: rc.wanNote, Loss: rc.loss, BurstLoss: rc.burstLoss,
			BurstLen: rc.burstLen, Reorder: rc.reorder, BandwidthBps: rc.bandwidth, QueueBytes: rc.queue,
		},
		StartedAt: started.UTC(),
		Machine:   m,
	}
}

// runTransport measures one transport: it starts the WAN emulator in front
// of the endpoint, connects every session through it, runs the ramp and
// closes the sessions again, so the next transport starts from a quiet
// pooler. It returns nil and no error when ctx ended before the ramp began.
func (rs *rampSession) runTransport(ctx context.Context, rr rampRun) (*rampResult, error) {
	rc := rs.rc
	tr := rr.tr
	cc := rs.runClientConfig(rr)
	label := runLabel(rr, cc)
	pc := rs.env.wan
	if rc.logLevel == "debug" || rc.logLevel == "info" {
		pc.Log = rs.log
	}
	// The emulator outlives ctx: the run must stop counting before the
	// path goes away, or its in-flight queries would turn into errors.
	upstream := cc.Addr
	var nat *udplb.LB // stands for a NAT between the path and the pooler (--migrate-at T:rebind)
	if tr == loadgen.QUIC && rc.migrateAt.rebinds() {
		var err error
		if nat, err = udplb.New("127.0.0.1:0", []string{cc.Addr}, nil); err != nil {
			return nil, fmt.Errorf("%s: start the NAT for --migrate-at rebindings: %w", label, err)
		}
		defer nat.Close()
		upstream = nat.Addr().String()
	}
	emu, err := wan.StartProcess(context.WithoutCancel(ctx), pc, rc.wanConfig(upstream))
	if err != nil {
		return nil, fmt.Errorf("%s: start the WAN emulator: %w", label, err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_, _ = emu.Stop()
		}
	}()
	cc.Relay, cc.Netns = emu.Addr(), emu.Netns()
	where := ""
	if cc.Netns != "" {
		where = ", clients in network namespace " + cc.Netns
	}
	what := "connecting " + model.FormatQPS(float64(cc.Sessions())) + " sessions"
	if cc.SessionPerQuery {
		what = "a new session per query, at most " + model.FormatQPS(float64(cc.Sessions())) + " open at once; warming up"
	}
	fmt.Fprintf(rs.out, "\n%s: WAN emulator (%s mode) %s -> %s (pid %d, RTT %v%s); %s...\n",
		label, rc.wanMode, emu.Addr(), cc.Addr, emu.Pid(), rc.rtt, where, what)
	clients, err := loadgen.Connect(ctx, cc, rs.logger)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, fmt.Errorf("%s: connecting %d sessions through the WAN emulator: %w", label, cc.Sessions(), err)
	}
	st := clients.Stats
	if cc.SessionPerQuery {
		fmt.Fprintf(rs.out, "%s: %d warm-up sessions opened and closed (each: p50 %s, max %s); ramp %s -> %s q/s over %v\n",
			label, st.Sessions, roundDur(st.P50), roundDur(st.Max), model.FormatQPS(rc.from), model.FormatQPS(rc.to), rc.duration)
	} else {
		fmt.Fprintf(rs.out, "%s: %s sessions connected in %s (each: p50 %s, max %s); ramp %s -> %s q/s over %v\n",
			label, model.FormatQPS(float64(st.Sessions)), roundDur(st.Total), roundDur(st.P50), roundDur(st.Max),
			model.FormatQPS(rc.from), model.FormatQPS(rc.to), rc.duration)
	}

	emuBase, _ := emu.CPU()
	pathBase := clients.PathStats()
	// The emulator's counters at the start, so its drops and queueing are
	// the run's, not the connection set-up's.
	emuStart, snapErr := emu.Snapshot(5 * time.Second)
	sampler := startCPUSampler(emu, clients)
	moves := startMigrator(ctx, rc.migrateAt, tr, clients, nat, rs.out, label)
	res, err := loadgen.Run(ctx, loadgen.RunConfig{
		Schedule: rc.schedule(),
		Grace:    time.Second + 2*rc.rtt,
		Progress: func(p loadgen.Progress) { printProgress(rs.out, label, p) },
	}, clients.Workers())
	perSecond, perSecondPath := sampler.stop()
	emuEnd, _ := emu.CPU()
	pathEnd := clients.PathStats()
	if err != nil {
		moves.finish(nil)
		_ = clients.Close()
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	run := res.ReportRun(clients)
	run.Migrations = moves.finish(run.Seconds)
	_ = clients.Close()
	if cc.SessionPerQuery && rs.srv != nil {
		n := rs.poolerClientsDrained(ctx)
		run.PoolerClientsAfter = &n
		if n > 0 {
			fmt.Fprintf(rs.out, "%s: the pooler still holds %d client sessions after the run\n", label, n)
		}
	}
	stats, serr := emu.Stop()
	stopped = true

	run.Transport = string(tr)
	run.TLS = cc.TLS()
	if rc.targetMode() {
		run.Target = cc.Addr
	}
	exec, overhead := rs.modelFor(tr)
	run.PredictedCeilingQPS, run.PredictedPoolCeilingQPS = rs.predictions(tr)
	run.ModelExecMs, run.ModelOverheadMs = msOf(exec), msOf(overhead)
	if rr.churn != "" {
		rs.applyChurn(rr, &run)
	}
	run.Emulator = &report.Usage{CPUSeconds: (emuEnd - emuBase).Seconds()}
	if loss := rc.loss + rc.burstLoss; loss > 0 && (rc.wanMode == wan.ModePacket || tr == loadgen.QUIC) {
		run.PredictedLossInflationMs = msOf(model.LossInflation(model.Transport(transportLabel(tr, cc.TLS())), rc.rtt, loss, model.DefaultPacketsPerQuery))
	}
	prev, prevPath := emuBase, pathBase
	for k := range run.Seconds {
		if k < len(perSecond) {
			run.Seconds[k].EmulatorCPUSeconds = max(perSecond[k]-prev, 0).Seconds()
			prev = perSecond[k]
		}
		if k < len(perSecondPath) {
			run.Seconds[k].Path = pathDelta(prevPath, perSecondPath[k])
			prevPath = perSecondPath[k]
		}
	}
	// The path figures describe the emulated path only in packet mode; in
	// relay mode TCP's kernel sees the loopback hop to the relay.
	if rc.wanMode == wan.ModePacket {
		run.Path = pathDelta(pathBase, pathEnd)
	} else {
		for k := range run.Seconds {
			run.Seconds[k].Path = nil
		}
	}
	r := &rampResult{label: label, run: run, res: res}
	if serr == nil {
		var late, lateMax time.Duration
		var hops uint64
		if tr == loadgen.TCP {
			late = stats.TCP.Up.Late.Total + stats.TCP.Down.Late.Total
			lateMax = max(stats.TCP.Up.Late.Max, stats.TCP.Down.Late.Max)
			hops = stats.TCP.Up.Chunks + stats.TCP.Down.Chunks
		} else {
			late = stats.UDP.Up.Late.Total + stats.UDP.Down.Late.Total
			lateMax = max(stats.UDP.Up.Late.Max, stats.UDP.Down.Late.Max)
			hops = stats.UDP.Up.Packets + stats.UDP.Down.Packets
		}
		if hops > 0 {
			r.latency, r.lateMax, r.latePkt = late/time.Duration(hops), lateMax, hops
		}
		if p := stats.Packet; p != nil && run.Path != nil {
			if snapErr == nil && emuStart.Packet != nil {
				p = p.Since(emuStart.Packet)
			} else {
				rs.logger.Warn("WAN emulator counters at the start of the run", "err", snapErr)
			}
			run.Path.EmulatorDrops = p.Up.Lost + p.Up.BurstLost + p.Up.QueueDrops + p.Down.Lost + p.Down.BurstLost + p.Down.QueueDrops
			run.Path.QueueDrops = p.Up.QueueDrops + p.Down.QueueDrops
			if n := p.Up.Delivered + p.Down.Delivered; n > 0 {
				run.Path.QueueDelayMs = msOf((p.Up.QueueDelay.Total + p.Down.QueueDelay.Total) / time.Duration(n))
			}
			run.Path.QueueDelayMaxMs = msOf(max(p.Up.QueueDelay.Max, p.Down.QueueDelay.Max))
			if run.Completed > 0 && rc.bandwidth > 0 {
				perQuery := float64(max(p.Up.Bytes, p.Down.Bytes)) / float64(run.Completed)
				run.PredictedBandwidthCeilingQPS = model.BandwidthCeiling(rc.bandwidth, perQuery)
				run.PredictedQueueDelayMaxMs = msOf(model.QueueDelayMax(rc.bandwidth, rc.queue))
			}
			late := p.Up.Late.Total + p.Down.Late.Total
			if hops := p.Up.Delivered + p.Down.Delivered; hops > 0 {
				r.latency, r.lateMax, r.latePkt = late/time.Duration(hops), max(p.Up.Late.Max, p.Down.Late.Max), hops
			}
		}
		r.run = run
	} else {
		rs.logger.Warn("WAN emulator counters", "err", serr)
	}
	return r, nil
}

// poolerClientsDrained waits, up to rampShutdownGrace, for the in-process
// pooler to see every client session end, and returns how many it still
// holds (logged in or starting): 0 when sessions close cleanly.
func (rs *rampSession) poolerClientsDrained(ctx context.Context) int {
	count := func() int { return len(rs.srv.pooler.Clients()) + rs.srv.pooler.StartingSessions() }
	deadline := time.Now().Add(rampShutdownGrace)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		n := count()
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		select {
		case <-ctx.Done():
			return count()
		case <-tick.C:
		}
	}
}

// cpuSampler reads the emulator's CPU time at the end of every second of a
// run, from a goroutine of its own so the dispatcher never waits on /proc.
type cpuSampler struct {
	stopc   chan struct{}
	done    chan struct{}
	samples []time.Duration     // cumulative CPU at the end of second k
	paths   []loadgen.PathStats // the clients' path counters then
}

func startCPUSampler(p *wan.Process, c *loadgen.Clients) *cpuSampler {
	s := &cpuSampler{stopc: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(s.done)
		for k := 1; ; k++ {
			t := time.NewTimer(time.Until(start.Add(time.Duration(k) * time.Second)))
			select {
			case <-s.stopc:
				t.Stop()
				return
			case <-t.C:
			}
			cpu, err := p.CPU()
			if err != nil {
				return
			}
			s.samples = append(s.samples, cpu)
			s.paths = append(s.paths, c.PathStats())
		}
	}()
	return s
}

// stop ends the sampling and returns the cumulative readings.
func (s *cpuSampler) stop() ([]time.Duration, []loadgen.PathStats) {
	close(s.stopc)
	<-s.done
	return s.samples, s.paths
}

// pathDelta is the report's path figures between two readings: counters as
// increases, the smoothed RTT as read at the end.
func pathDelta(from, to loadgen.PathStats) *report.Path {
	sub := func(a, b uint64) uint64 { return a - min(a, b) }
	return &report.Path{
		Retransmits: sub(to.Retransmits, from.Retransmits),
		SentPackets: sub(to.SentPackets, from.SentPackets),
		LostPackets: sub(to.LostPackets, from.LostPackets),
		SRTTMs:      msOf(to.SRTT),
	}
}

// msOf converts a duration to milliseconds.
func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// roundDur prints a duration with a sensible precision.
func roundDur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}
