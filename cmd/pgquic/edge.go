package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/edge"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/quicclient"
)

const edgeUsage = `Usage: pgquic edge --pooler HOST:PORT [--listen 127.0.0.1:5433] [--ca F | --pin SHA256 | --insecure] [flags]

Runs a local TCP listener for any PostgreSQL client (psql, pgbench, libpq or
JDBC apps). Each accepted connection becomes one stream on a few shared QUIC
connections to the pooler. Choose exactly one way to verify the pooler:
--ca, --pin (the fingerprint 'pgquic serve' logs for its generated
certificate) or --insecure (development only).

With --cert/--key the edge presents a client certificate; a pooler whose
--edge-trust file lists its fingerprint (logged at start) trusts it for the
users and databases listed. --local-auth makes the edge authenticate its
local clients itself (trust on a loopback listener only, md5 or
scram-sha-256 against --auth-file); --local-startup then answers a
session's startup locally and sends it with the first request in one
flight, so a new session's first row is one round trip away.

Flags:
`

// edgeConfig is what the edge subcommand's flags describe.
type edgeConfig struct {
	listen, pooler, alpn string
	conns, streams       int
	ca, pin              string
	insecure             bool
	metricsListen        string
	grace                time.Duration
	logLevel, logFormat  string
	cert, key            string
	localAuth, authFile  string
	localStartup         bool
	procs                int
	sessionCache         string
	keepAlive            time.Duration
	followRoute          time.Duration
	zeroRTT              bool
}

// runEdge is the edge subcommand.
func runEdge(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	ec, err := parseEdgeFlags(args, stdout, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if !errors.Is(err, errUsage) {
			fmt.Fprintf(stderr, "pgquic edge: %v\n", err)
		}
		return 2
	}
	logger, err := newLogger(stderr, ec.logLevel, ec.logFormat)
	if err != nil {
		fmt.Fprintf(stderr, "pgquic edge: %v\n", err)
		return 2
	}
	// Fewer threads, fewer cross-thread wake-ups: every query crosses the
	// edge as a handful of goroutine hand-offs (local socket, stream, QUIC
	// connection, UDP send and receive), each of which wakes a sleeping
	// thread when another one is idle.
	setProcs(ec.procs, logger)
	if err := runEdgeWith(ctx, ec, logger); err != nil {
		logger.Error("edge failed", "err", err)
		return 1
	}
	return 0
}

func parseEdgeFlags(args []string, stdout, stderr io.Writer) (edgeConfig, error) {
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var ec edgeConfig
	fs.StringVar(&ec.listen, "listen", "127.0.0.1:5433", "local TCP `address` for clients")
	fs.StringVar(&ec.pooler, "pooler", "", "the pooler's QUIC `address` HOST:PORT (required)")
	fs.IntVar(&ec.conns, "conns", quicclient.DefaultConns, "QUIC connections to keep to the pooler")
	fs.IntVar(&ec.streams, "streams", 100, "streams (sessions) per QUIC connection before another connection is used")
	fs.StringVar(&ec.ca, "ca", "", "PEM `file` of CA certificates that sign the pooler's certificate")
	fs.StringVar(&ec.pin, "pin", "", "trust exactly the pooler certificate with this `SHA256` fingerprint (hex)")
	fs.BoolVar(&ec.insecure, "insecure", false, "do not verify the pooler's certificate (development only)")
	fs.StringVar(&ec.alpn, "alpn", config.DefaultALPN, "QUIC application protocol `name`")
	fs.StringVar(&ec.cert, "cert", "", "PEM client certificate `file` presented to the pooler (for its --edge-trust)")
	fs.StringVar(&ec.key, "key", "", "PEM private key `file` matching --cert")
	fs.StringVar(&ec.localAuth, "local-auth", "", "authenticate local clients at the edge: `method` trust (loopback listener only), md5 or scram-sha-256; default: the pooler authenticates")
	fs.StringVar(&ec.authFile, "auth-file", "", "PgBouncer-format userlist `file` for --local-auth md5 or scram-sha-256")
	fs.BoolVar(&ec.localStartup, "local-startup", false, "answer a session's startup at the edge and send it with the first request in one flight (needs --local-auth)")
	fs.BoolVar(&ec.zeroRTT, "zero-rtt", false, "with a ticket from --session-cache, send each new connection's first sessions (the startup and, with --local-startup, the first request) in 0-RTT; a pooler whose database has zero_rtt: read-only runs a plain read before the handshake completes, anything else once it has; whoever captures the first flight can replay it. Default off")
	fs.StringVar(&ec.sessionCache, "session-cache", "", "keep TLS session tickets in `FILE` (mode 0600) so a restarted edge resumes its TLS sessions; whoever reads the file can resume as this edge until the tickets expire or the pooler rotates its ticket keys; default: none")
	fs.DurationVar(&ec.keepAlive, "keep-alive", quicclient.DefaultKeepAlivePeriod, "send a keep-alive on a QUIC connection quiet for this `duration`; it also bounds how long a connection stalls after a NAT rebinding while its sessions wait for answers (the pooler learns the new address only from the edge's next packet); negative disables")
	fs.DurationVar(&ec.followRoute, "follow-route", 0, "every `period`, ask the kernel which source address reaches the pooler and, when it changed, move the QUIC connections there with a validated migration (PATH_CHALLENGE first); 0 (the default) binds any address and lets the kernel switch the source, which the pooler sees as a NAT rebinding")
	fs.StringVar(&ec.metricsListen, "metrics-listen", "", "`address` of a Prometheus /metrics endpoint; empty disables it")
	fs.DurationVar(&ec.grace, "shutdown-grace", 10*time.Second, "how long shutdown waits for local clients to disconnect")
	fs.IntVar(&ec.procs, "procs", 0, "OS threads running Go code (GOMAXPROCS); 0 means half the CPUs, at least 1")
	fs.StringVar(&ec.logLevel, "log-level", config.DefaultLogLevel, "log `level`: debug, info, warn or error")
	fs.StringVar(&ec.logFormat, "log-format", config.DefaultLogFormat, "log `format`: text or json")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), edgeUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return ec, err
	}
	var errs []error
	if ec.listen == "" {
		errs = append(errs, errors.New("--listen is required"))
	}
	if ec.pooler == "" {
		errs = append(errs, errors.New("--pooler is required"))
	}
	n := 0
	for _, set := range []bool{ec.ca != "", ec.pin != "", ec.insecure} {
		if set {
			n++
		}
	}
	if n != 1 {
		errs = append(errs, errors.New("give exactly one of --ca, --pin or --insecure"))
	}
	if ec.conns < 1 || ec.streams < 1 {
		errs = append(errs, errors.New("--conns and --streams must be at least 1"))
	}
	if ec.grace < 0 {
		errs = append(errs, errors.New("--shutdown-grace must not be negative"))
	}
	if ec.procs < 0 {
		errs = append(errs, errors.New("--procs must not be negative"))
	}
	if (ec.cert == "") != (ec.key == "") {
		errs = append(errs, errors.New("--cert and --key go together"))
	}
	if ec.cert != "" && ec.localAuth == "" {
		// A pooler that trusts the certificate asks no password: passing
		// local clients through would let anyone on this host in.
		errs = append(errs, errors.New("--cert needs --local-auth: a pooler trusting the certificate lets the edge's clients in without a password, so the edge must authenticate them"))
	}
	if ec.localStartup && ec.localAuth == "" {
		errs = append(errs, errors.New("--local-startup needs --local-auth: the edge answers only clients it authenticated"))
	}
	switch ec.localAuth {
	case "":
		if ec.authFile != "" {
			errs = append(errs, errors.New("--auth-file needs --local-auth md5 or scram-sha-256"))
		}
	case "trust":
		if !loopbackAddr(ec.listen) {
			errs = append(errs, fmt.Errorf("--local-auth trust: --listen %q is not a loopback address; anyone reaching it could log in as any user the pooler trusts this edge for", ec.listen))
		}
	case "md5", "scram-sha-256":
		if ec.authFile == "" {
			errs = append(errs, fmt.Errorf("--local-auth %s needs --auth-file", ec.localAuth))
		}
	default:
		errs = append(errs, fmt.Errorf("--local-auth %q: want trust, md5 or scram-sha-256", ec.localAuth))
	}
	return ec, errors.Join(errs...)
}

// runEdgeWith runs the edge until ctx is done, then drains local clients for
// the grace period.
func runEdgeWith(ctx context.Context, ec edgeConfig, logger *slog.Logger) error {
	var reg *prometheus.Registry
	var metrics *metricsServer
	if ec.metricsListen != "" {
		reg = prometheus.NewRegistry()
		reg.MustRegister(
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		)
		metrics = newMetricsServer(reg, nil)
	}
	var localAuth *pgauth.Authenticator
	if ec.localAuth != "" {
		ac := pgauth.Config{Method: pgauth.Method(ec.localAuth), TrustLoopbackOnly: true}
		if ec.authFile != "" {
			users, err := pgauth.LoadUserlist(ec.authFile)
			if err != nil {
				return fmt.Errorf("auth file: %w", err)
			}
			ac.Users = users
		}
		var err error
		if localAuth, err = pgauth.New(ac); err != nil {
			return err
		}
	}
	dialer, err := quicclient.NewDialer(quicclient.DialerConfig{
		CertFile:          ec.cert,
		KeyFile:           ec.key,
		Addr:              ec.pooler,
		Conns:             ec.conns,
		ALPN:              ec.alpn,
		CAFile:            ec.ca,
		PinSHA256:         ec.pin,
		Insecure:          ec.insecure,
		MaxStreamsPerConn: ec.streams,
		SessionCacheFile:  ec.sessionCache,
		KeepAlivePeriod:   ec.keepAlive,
		ZeroRTT:           ec.zeroRTT,
	}, logger.With("component", "dialer"))
	if err != nil {
		return err
	}
	defer dialer.Close()
	var promReg prometheus.Registerer
	if reg != nil {
		promReg = reg
		if ec.followRoute > 0 {
			registerMoveMetrics(reg, dialer)
		}
	}
	sidecar, err := edge.New(edge.Config{Listen: ec.listen, Dialer: dialer,
		LocalAuth: localAuth, LocalStartup: ec.localStartup}, logger.With("component", "edge"), promReg)
	if err != nil {
		return err
	}
	if err := sidecar.Listen(); err != nil {
		return err
	}
	if metrics != nil {
		if err := metrics.Listen(ec.metricsListen); err != nil {
			_ = sidecar.Shutdown(context.Background())
			return err
		}
	}
	attrs := []any{"listen", sidecar.Addr().String(), "pooler", ec.pooler, "conns", ec.conns, "streams", ec.streams}
	if fp := dialer.CertFingerprint(); fp != "" {
		attrs = append(attrs, "cert_fingerprint", fp)
		// The subject too, as an edge-trust CA line's subject= sees it.
		if pair, err := tls.LoadX509KeyPair(ec.cert, ec.key); err == nil && pair.Leaf != nil {
			attrs = append(attrs, "cert_subject", pgauth.CertSubject(pair.Leaf))
		}
	}
	if ec.localAuth != "" {
		attrs = append(attrs, "local_auth", ec.localAuth, "local_startup", ec.localStartup)
	}
	if metrics != nil {
		attrs = append(attrs, "metrics", "http://"+metrics.Addr().String()+"/metrics")
	}
	logger.Info("pgquic edge ready", attrs...)

	serveCtx, cancelServe := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelServe()
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { errc <- sidecar.Serve(serveCtx) })
	if metrics != nil {
		wg.Go(func() { errc <- metrics.Serve() })
	}
	if ec.followRoute > 0 {
		wg.Go(func() { dialer.FollowRoute(serveCtx, ec.followRoute) })
	}
	var failure error
	select {
	case <-ctx.Done():
		logger.Info("shutting down", "grace", ec.grace)
	case failure = <-errc:
		if failure == nil {
			failure = errors.New("edge stopped unexpectedly")
		}
		logger.Error("shutting down after a failure", "err", failure)
	}
	graceCtx, cancel := context.WithTimeout(context.Background(), ec.grace)
	defer cancel()
	if err := sidecar.Shutdown(graceCtx); err != nil {
		logger.Warn("local clients cut off at the end of the grace period", "err", err)
	}
	if metrics != nil {
		metrics.Shutdown(graceCtx)
	}
	cancelServe()
	wg.Wait()
	return failure
}

// loopbackAddr reports whether a listen address is on a loopback
// interface ("localhost" included), where trust is safe.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// registerMoveMetrics exposes the moves --follow-route made.
func registerMoveMetrics(reg prometheus.Registerer, d *quicclient.Dialer) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "pgquic", Subsystem: "edge", Name: "moves_total",
			Help: "Validated moves of the QUIC connections to a new source address (--follow-route)."},
			func() float64 { return float64(d.MoveStats().Moves) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "pgquic", Subsystem: "edge", Name: "move_failures_total",
			Help: "Moves (--follow-route) at least one QUIC connection could not make."},
			func() float64 { return float64(d.MoveStats().Failures) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "pgquic", Subsystem: "edge", Name: "last_move_seconds",
			Help: "How long the last move (--follow-route) took, until every connection switched or failed to."},
			func() float64 { return d.MoveStats().LastDuration.Seconds() }),
	)
}
