package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/loadgen"
	"github.com/pgquic/pgquic/loadgen/model"
	"github.com/pgquic/pgquic/loadgen/wan"
)

const rampUsage = `Usage: pgquic ramp [flags]

Measures how many queries per second a client reaches over TCP and over QUIC
across an emulated WAN, and where each saturates, beside the ceiling model's
prediction (sessions / (RTT + execution + pooler overhead)).

With no flags it starts a throwaway PostgreSQL and an in-process pooler
(pool size 20, TCP front with TLS from a generated certificate, QUIC front),
puts the WAN emulator (pgquic wan, a child process, RTT 150ms) in front of
each, in packet mode where permitted (root or CAP_NET_ADMIN+CAP_SYS_ADMIN:
the clients' sockets live in the emulator's network namespace and TCP and
QUIC cross the same IP path), else in relay mode, saying so, and offers a linear ramp of 100 -> 5,000 q/s over 30s, first to 500
TCP connections, then to 50 QUIC connections x 40 streams. It prints a
progress line each second, then a summary table, and writes ramp.json and
report.html into --out.

--session-per-query measures session churn instead: every scheduled query
opens a new session of its own and closes it (Terminate) after its result,
as short-lived serverless workers do, over three paths in turn: plain TCP,
TCP+TLS, and QUIC through an edge with local startup over a warm QUIC
connection (startup and query in one flight). Its defaults suit a 2-core
machine: 10 -> 200 q/s over 20s, at most 100 sessions open at once per path
(--tcp-conns 100; --quic-conns 1 x --streams 100 for the edge). The model
counts the round trips each new session costs (tcp 3, tcp+tls 5,
edge-local 1 with trust) and its ceiling is those sessions / (k x RTT +
execution + overhead).

--dsn uses an existing PostgreSQL behind the in-process pooler.
--tcp-target and --quic-target measure an existing pooler or server instead
(PgBouncer, PostgreSQL, a remote pgquic serve); only the targeted transports
run, across the same emulator. The password, if the target asks for one,
comes from PGPASSWORD.

Exit codes: 0 done, 1 failure, 2 bad flags, 130 interrupted (Ctrl-C; what
was measured is still written).

Flags:
`

// Defaults of the ramp's flags: the default comparison.
const (
	defaultRampRTT       = 150 * time.Millisecond
	defaultRampFrom      = 100
	defaultRampTo        = 5000
	defaultRampDuration  = 30 * time.Second
	defaultRampTCPConns  = 500
	defaultRampQUICConns = 50
	defaultRampStreams   = 40
	defaultCalibrate     = 200
	// The --session-per-query defaults: TCP+TLS session churn a 2-core
	// machine sustains (a TLS handshake and a startup per query on the
	// client, the pooler and the emulator alike), with the knee of
	// TCP+TLS (100 / 5 RTT = 133 q/s at 150 ms) inside the ramp.
	defaultChurnFrom     = 10
	defaultChurnTo       = 200
	defaultChurnDuration = 20 * time.Second
	defaultChurnConns    = 100
	defaultChurnQUIC     = 1
	defaultChurnStreams  = 100
	// rampOutPrefix names the default output directory,
	// ramp-YYYYMMDD-HHMMSS in the current directory.
	rampOutPrefix = "ramp-"
	// rampInterrupted is the exit code of a ramp stopped by Ctrl-C, as a
	// shell reports a command killed by SIGINT.
	rampInterrupted = 130
)

// rampConfig is what the ramp subcommand's flags describe.
type rampConfig struct {
	dsn        string
	tcpTarget  string
	quicTarget string
	pin, ca    string
	insecure   bool
	tcpTLS     bool

	rtt, jitter time.Duration
	loss        float64
	// wanMode is "packet" or "relay" as the flag gave it; "" picks packet
	// mode where permitted (resolveWAN).
	wanMode             string
	burstLoss, burstLen float64
	reorder             float64
	bandwidth           int64
	queue               int
	// wanNote says why relay mode runs although packet mode is the default.
	wanNote  string
	from, to float64
	duration time.Duration
	poisson  bool
	// migrateAt are the times into each QUIC run at which its connections
	// move to a new local address (--migrate-at).
	migrateAt migrateList

	tcpConns, quicConns, streams int
	// churn is --session-per-query: a new session for every query.
	churn          bool
	query          string
	poolSize       int
	pipelineDepth  int
	user, database string
	calibrate      int

	out      string
	jsonFile string

	cpuProfile          string
	logLevel, logFormat string
	realtime            bool

	// set holds the names of the flags given explicitly.
	set map[string]bool
}

// targetMode reports whether an existing endpoint is measured instead of
// the in-process pooler.
func (rc *rampConfig) targetMode() bool { return rc.tcpTarget != "" || rc.quicTarget != "" }

// transports lists the transports the ramp runs, in order: both for the
// in-process pooler, only the targeted ones in target mode.
func (rc *rampConfig) transports() []loadgen.Transport {
	if !rc.targetMode() {
		return []loadgen.Transport{loadgen.TCP, loadgen.QUIC}
	}
	var ts []loadgen.Transport
	if rc.tcpTarget != "" {
		ts = append(ts, loadgen.TCP)
	}
	if rc.quicTarget != "" {
		ts = append(ts, loadgen.QUIC)
	}
	return ts
}

// rampRun is one run of the ramp: a transport and, with
// --session-per-query, the session path it measures.
type rampRun struct {
	tr    loadgen.Transport
	churn model.Transport // "" unless --session-per-query
}

// runs lists the ramp's runs in order: one per transport, or with
// --session-per-query the three session paths (tcp, tcp+tls, edge-local).
func (rc *rampConfig) runs() []rampRun {
	if rc.churn {
		return []rampRun{{loadgen.TCP, model.TCP}, {loadgen.TCP, model.TCPTLS}, {loadgen.QUIC, model.EdgeLocal}}
	}
	var runs []rampRun
	for _, tr := range rc.transports() {
		runs = append(runs, rampRun{tr: tr})
	}
	return runs
}

// schedule is the arrival plan every transport gets.
func (rc *rampConfig) schedule() loadgen.Schedule {
	return loadgen.Schedule{From: rc.from, To: rc.to, Duration: rc.duration, Poisson: rc.poisson, Seed: 1}
}

// wanConfig is the emulator in front of upstream.
func (rc *rampConfig) wanConfig(upstream string) wan.Config {
	return wan.Config{Upstream: upstream, RTT: rc.rtt, Jitter: rc.jitter, Loss: rc.loss,
		Packet: rc.wanMode == wan.ModePacket, BurstLoss: rc.burstLoss, BurstLen: rc.burstLen,
		Reorder: rc.reorder, Bandwidth: rc.bandwidth, Queue: rc.queue}
}

// resolveWAN settles the emulation mode before anything starts: packet mode
// where permitted, relay mode (with the reason in wanNote) where not, and an
// error when packet mode was asked for, or is needed by a packet-only flag,
// but cannot run.
func (rc *rampConfig) resolveWAN(permitted func() error) error {
	err := permitted()
	switch {
	case rc.wanMode == wan.ModeRelay:
		return nil
	case err == nil:
		rc.wanMode = wan.ModePacket
		return nil
	case rc.wanMode == wan.ModePacket:
		return fmt.Errorf("--wan packet: %w", err)
	case rc.burstLoss > 0 || rc.reorder > 0 || rc.bandwidth > 0:
		return fmt.Errorf("--burst-loss, --reorder and --bandwidth need packet mode: %w", err)
	}
	rc.wanMode = wan.ModeRelay
	rc.wanNote = "relay mode: " + err.Error() + "; TCP is never dropped or queued"
	if rc.loss > 0 {
		rc.wanNote += ", so --loss handicaps QUIC alone"
	}
	return nil
}

// rampEnv is what the ramp needs from its surroundings, so tests can run it
// from the test binary.
type rampEnv struct {
	// wan runs the WAN emulator as a child process: `pgquic wan` from this
	// executable, or a test binary whose TestMain calls wan.MainIfChild.
	wan wan.ProcessConfig
	// now gives the time that names the default output directory.
	now func() time.Time
	// realtime moves this process to real-time scheduling (enterRealtime);
	// nil where it must not, as in tests sharing the machine with others.
	realtime func() error
	// packetPermitted says why packet mode cannot run here (nil: it can);
	// wan.PacketPermitted, or a stand-in for tests of the fallback. nil
	// means not permitted.
	packetPermitted func() error
}

// runRamp is the ramp subcommand.
func runRamp(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	rc, err := parseRampFlags(args, stdout, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if !errors.Is(err, errUsage) {
			fmt.Fprintf(stderr, "pgquic ramp: %v\nRun 'pgquic ramp --help' for the flags.\n", err)
		}
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "pgquic ramp: cannot find this executable to run the WAN emulator: %v\n", err)
		return 1
	}
	return rampMain(ctx, rc, rampEnv{wan: wan.ProcessConfig{Path: exe, Args: []string{"wan"}}, now: time.Now,
		realtime: enterRealtime, packetPermitted: wan.PacketPermitted}, stdout, stderr)
}

// parseRampFlags parses and validates the ramp's flags; every problem is
// reported at once.
func parseRampFlags(args []string, stdout, stderr io.Writer) (*rampConfig, error) {
	fs := flag.NewFlagSet("ramp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rc := &rampConfig{}
	fs.StringVar(&rc.dsn, "dsn", "", "PostgreSQL `URL` to use instead of a throwaway PostgreSQL (in target mode: only to measure the execution time)")
	fs.StringVar(&rc.tcpTarget, "tcp-target", "", "measure this existing `host:port` over TCP (PgBouncer, PostgreSQL, pgquic serve) instead of the in-process pooler")
	fs.StringVar(&rc.quicTarget, "quic-target", "", "measure this existing pgquic QUIC front `host:port` instead of the in-process pooler")
	fs.StringVar(&rc.pin, "pin", "", "target mode: trust the server certificate with this SHA-256 `fingerprint`")
	fs.StringVar(&rc.ca, "ca", "", "target mode: verify the server certificate against this PEM CA `file`")
	fs.BoolVar(&rc.insecure, "insecure", false, "target mode: do not verify the server certificate")
	fs.BoolVar(&rc.tcpTLS, "tcp-tls", true, "TCP sessions use TLS (SSLRequest); --tcp-tls=false for plain TCP")
	fs.Var(durationFlag{&rc.rtt}, "rtt", "emulated round-trip `time`")
	fs.Var(durationFlag{&rc.jitter}, "jitter", "emulated jitter: each one-way delay is RTT/2 ± this `time` (at most RTT/2)")
	fs.StringVar(&rc.wanMode, "wan", "", "WAN emulation `mode`: packet (IP packets between network namespaces, so TCP and QUIC meet the same loss and queues; root or CAP_NET_ADMIN+CAP_SYS_ADMIN) or relay (user-space relay, any user; TCP is never dropped) (default packet where permitted, else relay)")
	fs.Var(qpsFlag{&rc.loss}, "loss", "emulated loss `probability` in [0, 1) per packet and direction: every packet in packet mode, UDP (QUIC) only in relay mode")
	fs.Func("burst-loss", "packet mode: Gilbert-Elliott burst loss `P,LEN`: long-run fraction P of packets lost in bursts of LEN packets on average", func(v string) error {
		var err error
		rc.burstLoss, rc.burstLen, err = wan.ParseBurst(v)
		return err
	})
	fs.Var(qpsFlag{&rc.reorder}, "reorder", "packet mode: `probability` that a packet is held back 10ms so later packets overtake it")
	fs.Var(wan.RateFlag{P: &rc.bandwidth}, "bandwidth", "packet mode: bottleneck rate per direction, `RATE` such as 20mbit")
	fs.Var(wan.BytesFlag{P: &rc.queue}, "queue", "packet mode with --bandwidth: drop-tail queue per direction in `BYTES`, such as 64KB (default one bandwidth-delay product, at least 16KB)")
	fs.Var(qpsFlag{&rc.from}, "from", "offered `rate` at the start of the ramp, q/s")
	fs.Var(qpsFlag{&rc.to}, "to", "offered `rate` at the end of the ramp, q/s")
	fs.Var(durationFlag{&rc.duration}, "duration", "length of the ramp")
	fs.Var(&rc.migrateAt, "migrate-at", "comma-separated `times` into each QUIC run (e.g. 10s,20s:rebind) at which the clients' addresses change: T or T:move moves their QUIC connections to a new local UDP port (probed, then switched), T:rebind has a NAT in front of the pooler give every flow a new port; the sessions go on, and the report lists each change and the latency around it")
	fs.BoolVar(&rc.poisson, "poisson", false, "Poisson arrivals along the ramp instead of evenly spaced ones")
	fs.IntVar(&rc.tcpConns, "tcp-conns", defaultRampTCPConns, "TCP connections (one session each)")
	fs.IntVar(&rc.quicConns, "quic-conns", defaultRampQUICConns, "QUIC connections")
	fs.IntVar(&rc.streams, "streams", defaultRampStreams, "sessions (streams) per QUIC connection")
	fs.BoolVar(&rc.churn, "session-per-query", false, fmt.Sprintf("every query opens its own new session and closes it (session churn, as serverless workers): runs plain TCP, TCP+TLS and an edge with local startup over a warm QUIC connection; defaults then --from %d --to %d --duration %v --tcp-conns %d --quic-conns %d --streams %d (the most sessions open at once)",
		defaultChurnFrom, defaultChurnTo, defaultChurnDuration, defaultChurnConns, defaultChurnQUIC, defaultChurnStreams))
	fs.StringVar(&rc.query, "query", loadgen.DefaultQuery, "the `SQL` every query runs (simple query protocol)")
	fs.IntVar(&rc.pipelineDepth, "pipeline-depth", config.DefaultPipelineDepth, "the in-process pooler's cross-client pipelining depth (as pgquic serve --pipeline-depth; 1 or 0 turns it off), to compare the two")
	fs.IntVar(&rc.poolSize, "pool-size", config.DefaultPoolSize, "server connections of the in-process pooler (target mode: the target's, for the model's pool ceiling; 0 leaves it out)")
	fs.StringVar(&rc.user, "user", "", "user the sessions log in as (default: the --dsn URL's user, else postgres)")
	fs.StringVar(&rc.database, "database", "", "database the sessions use (default: the --dsn URL's database, else postgres)")
	fs.IntVar(&rc.calibrate, "calibrate", defaultCalibrate, "sequential queries, without the WAN, whose median latency gives the model's execution time and pooler overhead; 0 skips")
	fs.StringVar(&rc.out, "out", "", "`directory` for ramp.json and report.html (default ramp-YYYYMMDD-HHMMSS in the current directory; '' with --json writes no directory)")
	fs.StringVar(&rc.jsonFile, "json", "", "also write the report to this `file`")
	fs.BoolVar(&rc.realtime, "realtime", true, "run this process and its children (emulators, throwaway PostgreSQL) under real-time round-robin scheduling when permitted (root or CAP_SYS_NICE), so the roles sharing this host do not wait on each other's time slices; --realtime=false for the default scheduler")
	fs.StringVar(&rc.cpuProfile, "cpuprofile", "", "write a Go CPU profile of this process (client and in-process pooler) for each run, to `file` with the run's name before the extension (ramp.pprof: ramp.tcp+tls.pprof, ramp.quic.pprof)")
	fs.StringVar(&rc.logLevel, "log-level", "warn", "log `level` of the pooler, emulator and PostgreSQL messages on stderr: debug, info, warn or error")
	fs.StringVar(&rc.logFormat, "log-format", config.DefaultLogFormat, "log `format`: text or json")
	rc.rtt, rc.from, rc.to, rc.duration = defaultRampRTT, defaultRampFrom, defaultRampTo, defaultRampDuration
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), rampUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return nil, err
	}
	rc.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { rc.set[f.Name] = true })
	if rc.churn {
		rc.churnDefaults()
	}
	if err := rc.validate(); err != nil {
		return nil, err
	}
	rc.fillDefaults()
	return rc, nil
}

// churnDefaults applies the --session-per-query defaults to the flags not
// given explicitly.
func (rc *rampConfig) churnDefaults() {
	for _, d := range []struct {
		flag string
		set  func()
	}{
		{"from", func() { rc.from = defaultChurnFrom }},
		{"to", func() { rc.to = defaultChurnTo }},
		{"duration", func() { rc.duration = defaultChurnDuration }},
		{"tcp-conns", func() { rc.tcpConns = defaultChurnConns }},
		{"quic-conns", func() { rc.quicConns = defaultChurnQUIC }},
		{"streams", func() { rc.streams = defaultChurnStreams }},
	} {
		if !rc.set[d.flag] {
			d.set()
		}
	}
}

// validate reports every problem with the flags, each naming its flag.
func (rc *rampConfig) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, t := range []struct{ flag, addr string }{{"tcp-target", rc.tcpTarget}, {"quic-target", rc.quicTarget}} {
		if t.addr == "" && !rc.set[t.flag] {
			continue
		}
		if host, port, err := net.SplitHostPort(t.addr); err != nil || host == "" || port == "" {
			bad("--%s %q: want HOST:PORT, such as 127.0.0.1:6432", t.flag, t.addr)
		}
	}
	if rc.dsn != "" {
		if _, err := pgconn.ParseConfig(rc.dsn); err != nil {
			bad("--dsn: %v", err)
		}
	}
	modes := 0
	for _, set := range []bool{rc.pin != "", rc.ca != "", rc.insecure} {
		if set {
			modes++
		}
	}
	needVerify := rc.quicTarget != "" || (rc.tcpTarget != "" && rc.tcpTLS)
	switch {
	case modes > 1:
		bad("give at most one of --pin, --ca and --insecure")
	case !rc.targetMode() && modes > 0:
		bad("--pin, --ca and --insecure apply to --tcp-target and --quic-target; the in-process pooler's generated certificate is pinned automatically")
	case needVerify && modes == 0:
		hint := ""
		if rc.quicTarget == "" {
			hint = " (or --tcp-tls=false for plain TCP)"
		}
		bad("%s uses TLS: verify the server's certificate with --pin SHA256, --ca FILE or --insecure%s", targetNames(rc), hint)
	}
	if rc.ca != "" {
		if _, err := os.Stat(rc.ca); err != nil {
			bad("--ca: %v", err)
		}
	}
	if rc.rtt < 0 {
		bad("--rtt must not be negative (got %v)", rc.rtt)
	}
	if rc.jitter < 0 {
		bad("--jitter must not be negative (got %v)", rc.jitter)
	} else if rc.rtt >= 0 && rc.jitter > rc.rtt/2 {
		bad("--jitter %v must not exceed half the --rtt (%v): a one-way delay of RTT/2 ± jitter cannot be negative", rc.jitter, rc.rtt/2)
	}
	if rc.loss < 0 || rc.loss >= 1 {
		bad("--loss must be a probability in [0, 1), such as 0.01 for 1%% (got %v)", rc.loss)
	}
	if rc.reorder < 0 || rc.reorder >= 1 {
		bad("--reorder must be a probability in [0, 1) (got %v)", rc.reorder)
	}
	switch rc.wanMode {
	case "", wan.ModePacket, wan.ModeRelay:
	default:
		bad("--wan %q: want packet or relay", rc.wanMode)
	}
	packetOnly := []string{}
	for _, f := range []string{"burst-loss", "reorder", "bandwidth", "queue"} {
		if rc.set[f] {
			packetOnly = append(packetOnly, "--"+f)
		}
	}
	if rc.wanMode == wan.ModeRelay && len(packetOnly) > 0 {
		bad("%s need --wan packet: the relay carries TCP as a byte stream and cannot drop, reorder or queue its segments", strings.Join(packetOnly, ", "))
	}
	if rc.set["queue"] && rc.bandwidth == 0 {
		bad("--queue needs --bandwidth: without a rate limit no queue forms")
	}
	if rc.from < 0 || rc.to < 0 {
		bad("--from and --to must not be negative (got %v and %v)", rc.from, rc.to)
	} else if rc.from == 0 && rc.to == 0 {
		bad("--from and --to are both 0: nothing would be offered")
	}
	if rc.duration <= 0 {
		bad("--duration must be positive (got %v)", rc.duration)
	}
	rc.validateMigrateAt(bad)
	runs := rc.transports()
	for _, tr := range runs {
		switch tr {
		case loadgen.TCP:
			if rc.tcpConns < 1 {
				bad("--tcp-conns must be at least 1 (got %d)", rc.tcpConns)
			}
		case loadgen.QUIC:
			if rc.quicConns < 1 {
				bad("--quic-conns must be at least 1 (got %d)", rc.quicConns)
			}
			if rc.streams < 1 {
				bad("--streams must be at least 1 (got %d)", rc.streams)
			}
		}
	}
	if strings.TrimSpace(rc.query) == "" {
		bad("--query must not be empty")
	}
	switch {
	case rc.pipelineDepth < 0:
		bad("--pipeline-depth must not be negative (got %d)", rc.pipelineDepth)
	case rc.targetMode() && rc.set["pipeline-depth"]:
		bad("--pipeline-depth sets the in-process pooler's; a target runs its own settings")
	}
	switch {
	case !rc.targetMode() && rc.poolSize < 1:
		bad("--pool-size must be at least 1 (got %d)", rc.poolSize)
	case rc.poolSize < 0:
		bad("--pool-size must not be negative (got %d)", rc.poolSize)
	}
	if rc.calibrate < 0 {
		bad("--calibrate must not be negative (got %d)", rc.calibrate)
	}
	if rc.churn && rc.targetMode() {
		bad("--session-per-query runs against the in-process pooler (its edge path needs the pooler to trust the edge's certificate): drop --tcp-target and --quic-target")
	}
	if rc.churn && rc.set["tcp-tls"] {
		bad("--session-per-query runs plain TCP and TCP+TLS both: drop --tcp-tls")
	}
	if rc.set["out"] && rc.out == "" && rc.jsonFile == "" {
		bad("--out '' writes no directory: give --json FILE, or the results would be lost")
	}
	if _, err := newLogger(io.Discard, rc.logLevel, rc.logFormat); err != nil {
		bad("%v", err)
	}
	return errors.Join(errs...)
}

// targetNames names the targets that use TLS, for messages.
func targetNames(rc *rampConfig) string {
	var names []string
	if rc.tcpTarget != "" && rc.tcpTLS {
		names = append(names, "--tcp-target")
	}
	if rc.quicTarget != "" {
		names = append(names, "--quic-target")
	}
	return strings.Join(names, " and ")
}

// fillDefaults sets the user and database from the DSN, else postgres. In
// target mode without --pool-size, the target's pool size is unknown.
func (rc *rampConfig) fillDefaults() {
	if rc.dsn != "" {
		if pc, err := pgconn.ParseConfig(rc.dsn); err == nil {
			if rc.user == "" {
				rc.user = pc.User
			}
			if rc.database == "" {
				rc.database = pc.Database
			}
		}
	}
	if rc.user == "" {
		rc.user = "postgres"
	}
	if rc.database == "" {
		rc.database = "postgres"
	}
	if rc.targetMode() && !rc.set["pool-size"] {
		rc.poolSize = 0
	}
	if rc.bandwidth > 0 && rc.queue == 0 {
		rc.queue = wan.DefaultQueue(rc.bandwidth, rc.rtt)
	}
}

// outDir is the directory the results go to: --out, or
// ramp-YYYYMMDD-HHMMSS in the current directory; "" for none.
func (rc *rampConfig) outDir(now time.Time) string {
	if rc.set["out"] {
		return rc.out
	}
	return rampOutPrefix + now.Format("20060102-150405")
}
