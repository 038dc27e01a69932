package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/edge"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/loadgen/wan"
	"github.com/pgquic/pgquic/quicclient"
	"github.com/pgquic/pgquic/quicfront"
)

const connectBenchUsage = `Usage: pgquic connect-bench [--rtt 150ms] [--n 20] [--paths tcp,...] [--wan relay|packet]
                            [--client CMD [--client-n 7]] [--json FILE] [--html FILE]

Measures a new session's time to first row (connect, then SELECT 1 and its
result) on each path across the WAN emulator, beside the model's round trips:
  tcp            TCP, trust                       3 RTT (TCP handshake, startup, query)
  tcp+tls        TCP, TLS 1.3, trust              5 RTT (+ SSLRequest, TLS handshake)
  tcp+tls+scram  TCP, TLS 1.3, SCRAM-SHA-256      7 RTT (+ two SASL round trips)
  quic           a fresh QUIC connection each     3 RTT (QUIC handshake, startup, query)
  edge           pgquic edge, warm connection     2 RTT (startup, query)
  edge-local     edge with --local-startup        1 RTT (startup and query in one flight)
  quic-resumed   a new process with --session-cache and local startup:
                                                  2 RTT (resumed handshake, startup and query)
  quic-0rtt      quic-resumed with 0-RTT (zero_rtt: read-only on the pooler):
                                                  1 RTT (startup and query in the first flight,
                                                  answered read-only before the handshake ends)
  quic-0rtt-write  the same with an INSERT as the first query:
                                                  2 RTT (held until the handshake is confirmed)
It starts a throwaway PostgreSQL, two in-process poolers (trust with
--edge-trust, and SCRAM) and the emulated paths, and prints median and p99.
With --client, it also runs the shell command CMD (e.g. "psql -Atc 'select
1'", its PGHOST/PGPORT/PGUSER/PGDATABASE set) --client-n times per path
among tcp, edge and edge-local, through a proxy that times its first byte
to the first DataRow sent back, across the WAN and, for comparison, without
it; it prints those medians and the command's wall times.

Flags:
`

// connectPath is one way to open a session, with its model round trips.
type connectPath struct {
	name string
	rtts int
}

var connectPaths = []connectPath{
	{"tcp", 3}, {"tcp+tls", 5}, {"tcp+tls+scram", 7}, {"quic", 3}, {"edge", 2}, {"edge-local", 1},
	{"quic-resumed", 2}, {"quic-0rtt", 1}, {"quic-0rtt-write", 2},
}

// connectResult is one path's measurement, as --json writes it.
type connectResult struct {
	Path            string    `json:"path"`
	ModelRoundTrips int       `json:"model_round_trips"`
	ModelMS         float64   `json:"model_ms"`
	MedianMS        float64   `json:"median_ms"`
	P99MS           float64   `json:"p99_ms"`
	SamplesMS       []float64 `json:"samples_ms"`
	// Client is the --client measurement on this path, when it ran.
	Client *clientResult `json:"client,omitempty"`
}

// clientResult is an external client's runs on one path: wire is the
// time from its first byte to the first DataRow sent back (the proxy's
// view), wall its process's whole run; NoWAN the same path without the
// WAN emulator.
type clientResult struct {
	Command           string    `json:"command"`
	WireMS            []float64 `json:"wire_ms"`
	WallMS            []float64 `json:"wall_ms"`
	WireMedianMS      float64   `json:"wire_median_ms"`
	WallMedianMS      float64   `json:"wall_median_ms"`
	NoWANWireMS       []float64 `json:"nowan_wire_ms"`
	NoWANWallMS       []float64 `json:"nowan_wall_ms"`
	NoWANWireMedianMS float64   `json:"nowan_wire_median_ms"`
	NoWANWallMedianMS float64   `json:"nowan_wall_median_ms"`
}

// clientPaths are the paths an external client can run through the
// timing proxy: plaintext TCP to something that answers PostgreSQL.
var clientPaths = []string{"tcp", "edge", "edge-local"}

// connectOpts is what one connect-bench run measures.
type connectOpts struct {
	rtt     time.Duration
	n       int
	paths   []connectPath
	packet  bool   // packet-mode WAN emulator instead of the relay
	client  string // external client command, "" for none
	clientN int
}

// connectReport is the --json document.
type connectReport struct {
	RTTMS float64         `json:"rtt_ms"`
	N     int             `json:"n"`
	WAN   string          `json:"wan"`
	Date  string          `json:"date"`
	Paths []connectResult `json:"paths"`
}

func runConnectBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("connect-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rtt := fs.Duration("rtt", 150*time.Millisecond, "round trip the WAN emulator adds")
	n := fs.Int("n", 20, "new sessions per path")
	pathsFlag := fs.String("paths", "", "comma-separated `paths` to run (default: all)")
	jsonFile := fs.String("json", "", "write the results as JSON to `FILE`")
	htmlFile := fs.String("html", "", "write a self-contained page with a chart of the results to `FILE`")
	wanMode := fs.String("wan", wan.ModeRelay, "WAN emulation `mode`: relay (user-space relay, any user) or packet (IP packets between network namespaces; root or CAP_NET_ADMIN+CAP_SYS_ADMIN)")
	client := fs.String("client", "", "also run the shell `command` (e.g. \"psql -Atc 'select 1'\") through a timing proxy on the tcp, edge and edge-local paths")
	clientN := fs.Int("client-n", 7, "runs of --client per path, with and without the WAN")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), connectBenchUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	paths := connectPaths
	if *pathsFlag != "" {
		paths = nil
		for _, name := range strings.Split(*pathsFlag, ",") {
			i := slices.IndexFunc(connectPaths, func(p connectPath) bool { return p.name == name })
			if i < 0 {
				fmt.Fprintf(stderr, "pgquic connect-bench: --paths: unknown path %q\n", name)
				return 2
			}
			paths = append(paths, connectPaths[i])
		}
	}
	if *rtt <= 0 || *n < 1 {
		fmt.Fprintln(stderr, "pgquic connect-bench: --rtt must be positive and --n at least 1")
		return 2
	}
	if *clientN < 1 {
		fmt.Fprintln(stderr, "pgquic connect-bench: --client-n must be at least 1")
		return 2
	}
	if *wanMode != wan.ModeRelay && *wanMode != wan.ModePacket {
		fmt.Fprintf(stderr, "pgquic connect-bench: --wan %q: want relay or packet\n", *wanMode)
		return 2
	}
	if *wanMode == wan.ModePacket {
		if err := wan.PacketPermitted(); err != nil {
			fmt.Fprintf(stderr, "pgquic connect-bench: --wan packet: %v\n", err)
			return 2
		}
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rep, err := connectBench(ctx, connectOpts{rtt: *rtt, n: *n, paths: paths, packet: *wanMode == wan.ModePacket,
		client: *client, clientN: *clientN}, logger)
	if err != nil {
		fmt.Fprintf(stderr, "pgquic connect-bench: %v\n", err)
		return 1
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "time to first row of a new session, RTT %v (WAN emulator: %s mode), %d sessions per path\n", *rtt, rep.WAN, *n)
	fmt.Fprintln(tw, "path\tmodel\tmodel ms\tmedian ms\tp99 ms\tmedian/model")
	for _, r := range rep.Paths {
		fmt.Fprintf(tw, "%s\t%d RTT\t%.0f\t%.1f\t%.1f\t%.2f\n", r.Path, r.ModelRoundTrips, r.ModelMS, r.MedianMS, r.P99MS, r.MedianMS/r.ModelMS)
	}
	_ = tw.Flush()
	printClientResults(stdout, rep)
	if *jsonFile != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*jsonFile, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintf(stderr, "pgquic connect-bench: %v\n", err)
			return 1
		}
	}
	if *htmlFile != "" {
		if err := os.WriteFile(*htmlFile, connectBenchHTML(rep), 0o644); err != nil {
			fmt.Fprintf(stderr, "pgquic connect-bench: %v\n", err)
			return 1
		}
	}
	return 0
}

// connectBenchHTML renders the report as one page with no network
// fetches: a bar chart of each path's median and p99 beside its model.
func connectBenchHTML(rep *connectReport) []byte {
	var b strings.Builder
	top := 1.0
	for _, r := range rep.Paths {
		top = max(top, r.P99MS, r.ModelMS)
	}
	const rowH, left, width = 34, 120, 600
	h := rowH*len(rep.Paths) + 40
	fmt.Fprintf(&b, "<!doctype html><meta charset=utf-8><title>pgquic connect-bench</title>\n")
	fmt.Fprintf(&b, "<h1>Time to first row of a new session</h1><p>RTT %.0f ms (WAN emulator: %s mode), %d sessions per path, %s.</p>\n",
		rep.RTTMS, html.EscapeString(rep.WAN), rep.N, html.EscapeString(rep.Date))
	fmt.Fprintf(&b, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif' font-size='12'>\n", left+width+80, h)
	scale := func(v float64) float64 { return v / top * width }
	for i, r := range rep.Paths {
		y := 10 + i*rowH
		fmt.Fprintf(&b, "<text x='0' y='%d'>%s</text>\n", y+14, html.EscapeString(r.Path))
		fmt.Fprintf(&b, "<rect x='%d' y='%d' width='%.1f' height='10' fill='#bbb'><title>p99 %.1f ms</title></rect>\n", left, y, scale(r.P99MS), r.P99MS)
		fmt.Fprintf(&b, "<rect x='%d' y='%d' width='%.1f' height='10' fill='#36c'><title>median %.1f ms</title></rect>\n", left, y, scale(r.MedianMS), r.MedianMS)
		fmt.Fprintf(&b, "<line x1='%.1f' x2='%.1f' y1='%d' y2='%d' stroke='#c33' stroke-width='2'><title>model %d RTT = %.0f ms</title></line>\n",
			float64(left)+scale(r.ModelMS), float64(left)+scale(r.ModelMS), y-3, y+13, r.ModelRoundTrips, r.ModelMS)
		fmt.Fprintf(&b, "<text x='%.1f' y='%d'>%.0f ms</text>\n", float64(left)+scale(r.P99MS)+6, y+10, r.MedianMS)
	}
	fmt.Fprintf(&b, "<text x='%d' y='%d'>blue: median, grey: p99, red: the model's round trips</text></svg>\n", left, h-8)
	b.WriteString("<table border=1 cellpadding=4><tr><th>path<th>model<th>model ms<th>median ms<th>p99 ms</tr>\n")
	for _, r := range rep.Paths {
		fmt.Fprintf(&b, "<tr><td>%s<td>%d RTT<td>%.0f<td>%.1f<td>%.1f</tr>\n", html.EscapeString(r.Path), r.ModelRoundTrips, r.ModelMS, r.MedianMS, r.P99MS)
	}
	b.WriteString("</table>\n")
	return []byte(b.String())
}

// benchTarget is where a client reaches one upstream: an address and the
// network namespace its sockets must be made in ("" for this one).
type benchTarget struct{ addr, netns string }

// dial opens a TCP connection to the target from its namespace.
func (t benchTarget) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	var d net.Dialer
	return wan.DialInNetns(t.netns, func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", t.addr)
	})(ctx, "tcp", t.addr)
}

// connectBench sets up the poolers, emulated paths and edges and measures
// the paths.
func connectBench(ctx context.Context, o connectOpts, logger *slog.Logger) (*connectReport, error) {
	dir, err := os.MkdirTemp("", "pgquic-connect-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	serverCert, serverKey, err := writeBenchCert(dir, "server")
	if err != nil {
		return nil, err
	}
	edgeCert, edgeKey, trustFile, err := writeTrustedEdge(dir)
	if err != nil {
		return nil, err
	}

	// Pooler A: trust, TLS, edge trust; it starts the throwaway PostgreSQL.
	cfgA := config.Default()
	cfgA.TCPListen, cfgA.QUICListen, cfgA.MetricsListen = "127.0.0.1:0", "127.0.0.1:0", ""
	cfgA.TLSCert, cfgA.TLSKey, cfgA.EdgeTrust = serverCert, serverKey, trustFile
	cfgA.Explicit.AuthMethod = true
	cfgA.ZeroRTT = config.ZeroRTTReadOnly // only the quic-0rtt paths send 0-RTT
	if err := cfgA.Validate(); err != nil {
		return nil, err
	}
	srvA, stopA, err := runBenchServer(ctx, cfgA, logger)
	if err != nil {
		return nil, err
	}
	defer stopA()
	cluster := srvA.cluster
	users := filepath.Join(dir, "users.txt")
	if err := os.WriteFile(users, fmt.Appendf(nil, "%q %q\n", cluster.SuperUser, cluster.SuperPassword), 0o600); err != nil {
		return nil, err
	}
	// Pooler B: SCRAM over TLS, on A's PostgreSQL.
	cfgB := *cfgA
	cfgB.QUICListen, cfgB.EdgeTrust = "", ""
	cfgB.Backend = cluster.SuperURL("postgres")
	cfgB.Auth = config.Auth{Method: "scram-sha-256", File: users}
	if err := cfgB.Validate(); err != nil {
		return nil, err
	}
	srvB, stopB, err := runBenchServer(ctx, &cfgB, logger)
	if err != nil {
		return nil, err
	}
	defer stopB()

	// What is started below is stopped at the end, the last first.
	var closers []func() error
	defer func() {
		for _, c := range slices.Backward(closers) {
			_ = c()
		}
	}()
	mode := wan.ModeRelay
	if o.packet {
		mode = wan.ModePacket
	}
	emulate := func(upstream string) (benchTarget, error) {
		cfg := wan.Config{Listen: "127.0.0.1:0", Upstream: upstream, RTT: o.rtt}
		if o.packet {
			cfg.Listen, cfg.Packet = "", true
			p, err := wan.StartPacket(cfg, logger)
			if err != nil {
				return benchTarget{}, err
			}
			closers = append(closers, p.Close)
			return benchTarget{p.Addr(), p.ClientNetns()}, nil
		}
		r, err := wan.New(cfg, logger)
		if err != nil {
			return benchTarget{}, err
		}
		if err := r.Start(ctx); err != nil {
			return benchTarget{}, err
		}
		closers = append(closers, r.Close)
		return benchTarget{addr: r.Addr()}, nil
	}
	tcpA, err := emulate(srvA.tcp.Addr().String())
	if err != nil {
		return nil, err
	}
	quicA, err := emulate(srvA.quic.Addr().String())
	if err != nil {
		return nil, err
	}
	tcpB, err := emulate(srvB.tcp.Addr().String())
	if err != nil {
		return nil, err
	}
	pin := srvA.quic.Fingerprint()
	user := cluster.SuperUser

	// startEdge runs an in-process edge whose QUIC connection goes to
	// pooler; its local listener stays on this namespace's loopback.
	startEdge := func(local bool, pooler benchTarget) (string, error) {
		dc := quicclient.DialerConfig{Addr: pooler.addr, Conns: 1, PinSHA256: pin}
		ec := edge.Config{Listen: "127.0.0.1:0"}
		if local {
			dc.CertFile, dc.KeyFile = edgeCert, edgeKey
			a, err := pgauth.New(pgauth.Config{Method: pgauth.MethodTrust, TrustLoopbackOnly: true})
			if err != nil {
				return "", err
			}
			ec.LocalAuth, ec.LocalStartup = a, true
		}
		d, err := quicclient.NewDialer(dc, logger)
		if err != nil {
			return "", err
		}
		closers = append(closers, d.Close)
		if pooler.netns != "" {
			// The Dialer binds its one UDP socket at its first dial: make
			// that happen in the path's namespace (an empty stream costs
			// the pooler nothing).
			c, err := wan.DialInNetns(pooler.netns, d.DialFunc())(ctx, "tcp", "quic")
			if err != nil {
				return "", err
			}
			_ = c.Close()
		}
		ec.Dialer = d
		e, err := edge.New(ec, logger, nil)
		if err != nil {
			return "", err
		}
		if err := e.Listen(); err != nil {
			return "", err
		}
		ectx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = e.Serve(ectx); close(done) }()
		closers = append(closers, func() error { cancel(); <-done; return nil })
		return e.Addr().String(), nil
	}

	rep := &connectReport{RTTMS: ms(o.rtt), N: o.n, WAN: mode, Date: time.Now().UTC().Format(time.RFC3339)}
	for _, p := range o.paths {
		var session func(context.Context) error
		url := func(addr, extra string) string {
			return fmt.Sprintf("postgres://%s@%s/postgres?%s", user, addr, extra)
		}
		pgSession := func(to benchTarget, extra, password string) func(context.Context) error {
			return func(ctx context.Context) error {
				cfg, err := pgconn.ParseConfig(url(to.addr, extra))
				if err != nil {
					return err
				}
				cfg.Password = password
				if to.netns != "" {
					cfg.DialFunc = to.dial
				}
				return firstRow(ctx, cfg)
			}
		}
		warm := 0
		// target and direct are where --client runs: across the WAN and
		// without it.
		var target, direct benchTarget
		switch p.name {
		case "tcp":
			session = pgSession(tcpA, "sslmode=disable", "")
			target, direct = tcpA, benchTarget{addr: srvA.tcp.Addr().String()}
		case "tcp+tls":
			session = pgSession(tcpA, "sslmode=require", "")
		case "tcp+tls+scram":
			session = pgSession(tcpB, "sslmode=require", cluster.SuperPassword)
		case "quic":
			session = func(ctx context.Context) error {
				d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: quicA.addr, Conns: 1, PinSHA256: pin}, logger)
				if err != nil {
					return err
				}
				defer d.Close()
				cfg, err := pgconn.ParseConfig(url("quic", "sslmode=disable"))
				if err != nil {
					return err
				}
				cfg.DialFunc, cfg.LookupFunc = wan.DialInNetns(quicA.netns, d.DialFunc()), d.LookupFunc()
				return firstRow(ctx, cfg)
			}
		case "quic-resumed":
			session = resumedSession(quicA, pin, edgeCert, edgeKey, filepath.Join(dir, "session-cache"), url("quic", "sslmode=disable"), logger, "")
		case "quic-0rtt":
			session = resumedSession(quicA, pin, edgeCert, edgeKey, filepath.Join(dir, "session-cache-0rtt"), url("quic", "sslmode=disable"), logger, "SELECT 1")
		case "quic-0rtt-write":
			if err := cluster.Exec(ctx, "CREATE TABLE IF NOT EXISTS connect_bench_0rtt (v int)"); err != nil {
				return nil, err
			}
			session = resumedSession(quicA, pin, edgeCert, edgeKey, filepath.Join(dir, "session-cache-0rtt-write"), url("quic", "sslmode=disable"), logger,
				"INSERT INTO connect_bench_0rtt VALUES (1)")
		case "edge", "edge-local":
			addr, err := startEdge(p.name == "edge-local", quicA)
			if err != nil {
				return nil, err
			}
			target = benchTarget{addr: addr}
			session = pgSession(target, "sslmode=disable", "")
			warm = 2 // the QUIC connection, and the greeting cache
			if o.client != "" {
				if addr, err = startEdge(p.name == "edge-local", benchTarget{addr: srvA.quic.Addr().String()}); err != nil {
					return nil, err
				}
				direct = benchTarget{addr: addr}
			}
		}
		// One warm-up session per path (pools, parameter spellings), more
		// for the edges.
		for range 1 + warm {
			if err := session(ctx); err != nil {
				return nil, fmt.Errorf("%s: warm-up session: %w", p.name, err)
			}
		}
		res := connectResult{Path: p.name, ModelRoundTrips: p.rtts, ModelMS: ms(o.rtt) * float64(p.rtts)}
		for range o.n {
			start := time.Now()
			if err := session(ctx); err != nil {
				return nil, fmt.Errorf("%s: %w", p.name, err)
			}
			res.SamplesMS = append(res.SamplesMS, ms(time.Since(start)))
		}
		res.MedianMS, res.P99MS = median(res.SamplesMS), p99(res.SamplesMS)
		if o.client != "" && target.addr != "" {
			if res.Client, err = measureClient(ctx, o, target, direct, user); err != nil {
				return nil, fmt.Errorf("%s: %w", p.name, err)
			}
		}
		rep.Paths = append(rep.Paths, res)
	}
	return rep, nil
}

// measureClient runs o.client through a timing proxy in front of target
// (across the WAN) and of direct (without it), two warm-up runs each (a
// client's startup parameters are its own greeting-cache entry on an
// edge), then o.clientN runs each, alternating.
func measureClient(ctx context.Context, o connectOpts, target, direct benchTarget, user string) (*clientResult, error) {
	res := &clientResult{Command: o.client}
	proxies := make([]*firstRowProxy, 2)
	for i, to := range []benchTarget{target, direct} {
		p, err := newFirstRowProxy(func(ctx context.Context) (net.Conn, error) { return to.dial(ctx, "tcp", to.addr) })
		if err != nil {
			return nil, err
		}
		defer p.Close()
		proxies[i] = p
		for range 2 {
			if _, err := runClient(ctx, o.client, p, user); err != nil {
				return nil, fmt.Errorf("--client warm-up: %w", err)
			}
		}
	}
	for range o.clientN {
		for i, p := range proxies {
			r, err := runClient(ctx, o.client, p, user)
			if err != nil {
				return nil, err
			}
			if i == 0 {
				res.WireMS, res.WallMS = append(res.WireMS, ms(r.wire)), append(res.WallMS, ms(r.wall))
			} else {
				res.NoWANWireMS, res.NoWANWallMS = append(res.NoWANWireMS, ms(r.wire)), append(res.NoWANWallMS, ms(r.wall))
			}
		}
	}
	res.WireMedianMS, res.WallMedianMS = median(res.WireMS), median(res.WallMS)
	res.NoWANWireMedianMS, res.NoWANWallMedianMS = median(res.NoWANWireMS), median(res.NoWANWallMS)
	return res, nil
}

// printClientResults prints the --client table, nothing when none ran.
func printClientResults(w io.Writer, rep *connectReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := false
	for _, r := range rep.Paths {
		c := r.Client
		if c == nil {
			continue
		}
		if !header {
			fmt.Fprintf(tw, "\nclient %q, %d runs per path: first byte to first DataRow at the wire, and the command's wall time (median ms)\n", c.Command, len(c.WireMS))
			fmt.Fprintln(tw, "path\tmodel ms\twire\twire - model\twall\tno WAN: wire\tno WAN: wall")
			header = true
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.1f\t%+.1f\t%.1f\t%.1f\t%.1f\n", r.Path, r.ModelMS, c.WireMedianMS, c.WireMedianMS-r.ModelMS,
			c.WallMedianMS, c.NoWANWireMedianMS, c.NoWANWallMedianMS)
	}
	_ = tw.Flush()
}

// median returns the middle sample (the upper one of an even count).
func median(samples []float64) float64 {
	sorted := slices.Sorted(slices.Values(samples))
	return sorted[len(sorted)/2]
}

// p99 returns the 99th percentile sample, nearest rank.
func p99(samples []float64) float64 {
	sorted := slices.Sorted(slices.Values(samples))
	return sorted[min(len(sorted)-1, (len(sorted)*99+99)/100-1)]
}

// firstRow opens a session with cfg, runs SELECT 1 and reads its result:
// a new session's time to first row.
func firstRow(ctx context.Context, cfg *pgconn.Config) error {
	return firstResult(ctx, cfg, "SELECT 1")
}

// firstResult opens a session with cfg and runs sql, checking that a
// SELECT 1 returned its row.
func firstResult(ctx context.Context, cfg *pgconn.Config, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	res, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		return err
	}
	if sql != "SELECT 1" {
		return nil
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "1" {
		return fmt.Errorf("SELECT 1 returned %v", res)
	}
	return nil
}

// runBenchServer starts serve's wiring in-process and returns a function
// that stops it.
func runBenchServer(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*server, func(), error) {
	srv, err := startServer(ctx, cfg, logger)
	if err != nil {
		return nil, nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	return srv, func() { cancel(); <-done }, nil
}

// writeBenchCert writes a self-signed certificate and key into dir.
func writeBenchCert(dir, name string) (certFile, keyFile string, err error) {
	cert, err := quicfront.GenerateSelfSigned("127.0.0.1")
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// writeTrustedEdge writes an edge's self-signed certificate and key into
// dir, and an edge_trust file (serve --edge-trust) that trusts it for every
// user and database.
func writeTrustedEdge(dir string) (certFile, keyFile, trustFile string, err error) {
	certFile, keyFile, err = writeBenchCert(dir, "edge")
	if err != nil {
		return "", "", "", err
	}
	fp, err := certFileFingerprint(certFile)
	if err != nil {
		return "", "", "", err
	}
	trustFile = filepath.Join(dir, "edges.txt")
	if err := os.WriteFile(trustFile, []byte(fp+" * *\n"), 0o600); err != nil {
		return "", "", "", err
	}
	return certFile, keyFile, trustFile, nil
}

// certFileFingerprint returns the fingerprint of a PEM certificate file.
func certFileFingerprint(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "", fmt.Errorf("%s: no PEM block", path)
	}
	return quicclient.Fingerprint(blk.Bytes), nil
}

// ms converts a duration to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// resumedSession returns the quic-resumed path's session: what a new
// process does, a fresh Dialer (new UDP socket, new QUIC connection) with
// the ticket and the greeting an earlier one left in the session cache
// file, and local startup. It fails when the handshake did not resume.
// With zeroRTTSQL, the dialer sends the startup and that first query in
// 0-RTT, and the session fails when the pooler did not accept it.
func resumedSession(t benchTarget, pin, cert, key, cacheFile, connString string, logger *slog.Logger, zeroRTTSQL string) func(context.Context) error {
	return func(ctx context.Context) error {
		d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: t.addr, Conns: 1, PinSHA256: pin,
			CertFile: cert, KeyFile: key, LocalStartup: true, SessionCacheFile: cacheFile, ZeroRTT: zeroRTTSQL != ""}, logger)
		if err != nil {
			return err
		}
		defer d.Close()
		cfg, err := pgconn.ParseConfig(connString)
		if err != nil {
			return err
		}
		cfg.DialFunc, cfg.LookupFunc = d.DialFunc(), d.LookupFunc()
		if t.netns != "" {
			// The dialer binds its UDP socket at its first dial, and with
			// local startup the session's stream is dialed from the
			// dialer's own goroutine: in packet mode the first dial (the
			// resumed handshake, one round trip, part of the timed
			// session as in a new process) runs here, inside the client
			// namespace, and the session's flight follows on that
			// connection.
			if err := wan.InNetns(t.netns, func() error {
				c, err := d.Dial(ctx)
				if err != nil {
					return err
				}
				return c.Close()
			}); err != nil {
				return err
			}
		}
		earlier := d.GreetingStore() != nil && len(d.GreetingStore().LoadGreetings()) > 0
		if zeroRTTSQL != "" {
			if err := firstResult(ctx, cfg, zeroRTTSQL); err != nil {
				return err
			}
			if earlier && !zeroRTTAccepted(d) {
				return errors.New("the pooler did not accept the 0-RTT data")
			}
			return nil
		}
		if err := firstRow(ctx, cfg); err != nil {
			return err
		}
		if earlier && d.Stats().Resumed == 0 {
			return errors.New("the TLS session was not resumed")
		}
		return nil
	}
}

// zeroRTTAccepted waits, briefly, for d's connection to report its
// handshake's outcome (recorded just after the handshake, which ends
// about when a 0-RTT request's answer arrives) and reports whether the
// pooler accepted its 0-RTT data.
func zeroRTTAccepted(d *quicclient.Dialer) bool {
	// The outcome is known within a round trip of the answer; the
	// deadline only bounds a connection that died without one.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st := d.Stats()
		if st.ZeroRTT > 0 {
			return true
		}
		if st.ZeroRTTRejected > 0 {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return false
}
