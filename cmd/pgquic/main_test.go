package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/loadgen/wan"
	"github.com/pgquic/pgquic/quicclient"
	"github.com/pgquic/pgquic/quicfront"
)

func TestMain(m *testing.M) {
	// The ramp tests run the WAN emulator as a child: this test binary.
	wan.MainIfChild()
	// The signal tests run the whole program as a child: this test binary
	// with the environment variable below, entering main as pgquic does.
	if os.Getenv(runMainEnv) == "1" {
		os.Args = append([]string{"pgquic"}, os.Args[1:]...)
		main()
		return
	}
	goleak.VerifyTestMain(m)
}

// runMainEnv makes the test binary run pgquic's main instead of the tests.
const runMainEnv = "PGQUIC_TEST_RUN_MAIN"

// testTimeout is generous: the machine is small and noisy.
const testTimeout = 2 * time.Minute

func TestUsage(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		stdout   string // substring expected on stdout
		stderr   string // substring expected on stderr
		noStdout bool
	}{
		{args: nil, code: 2, stderr: "Commands:"},
		{args: []string{"--help"}, code: 0, stdout: "serve"},
		{args: []string{"help"}, code: 0, stdout: "edge"},
		{args: []string{"help"}, code: 0, stdout: "ceiling"},
		{args: []string{"help"}, code: 0, stdout: "ramp"},
		{args: []string{"bogus"}, code: 2, stderr: `unknown command "bogus"`},
		{args: []string{"serve", "--help"}, code: 0, stdout: "-tcp-listen"},
		{args: []string{"serve", "-h"}, code: 0, stdout: "Runs the pooler"},
		{args: []string{"edge", "--help"}, code: 0, stdout: "-pooler"},
		{args: []string{"serve", "--nope"}, code: 2, stderr: "flag provided but not defined: -nope", noStdout: true},
		{args: []string{"serve", "extra"}, code: 2, stderr: `unexpected argument "extra"`},
		{args: []string{"serve", "--mode", "statement"}, code: 2, stderr: `mode: "statement"`},
		{args: []string{"serve", "--tls-cert", "x.pem"}, code: 2, stderr: "tls_cert and tls_key"},
		{args: []string{"serve", "--tcp-listen", "0.0.0.0:6432"}, code: 2, stderr: `auth.method: the default, trust, would let anyone who reaches tcp_listen "0.0.0.0:6432" log in as any user`},
		{args: []string{"serve", "--pool-size", "1", "--min-pool", "2"}, code: 2, stderr: "min_pool: 2 exceeds pool_size 1: lower min_pool (--min-pool) or raise pool_size (--pool-size)"},
		{args: []string{"edge"}, code: 2, stderr: "--pooler is required"},
		{args: []string{"edge", "--pooler", "127.0.0.1:1", "--pin", "ab", "--insecure"}, code: 2, stderr: "exactly one of --ca, --pin or --insecure"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tt.args, &stdout, &stderr)
			if code != tt.code {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.stdout) {
				t.Errorf("stdout lacks %q:\n%s", tt.stdout, stdout.String())
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.stderr, stderr.String())
			}
			if tt.noStdout && stdout.Len() > 0 {
				t.Errorf("unexpected stdout:\n%s", stdout.String())
			}
		})
	}
}

// TestUsageListsOnlyBuiltCommands guards against advertising subcommands
// that do not exist yet.
func TestUsageListsOnlyBuiltCommands(t *testing.T) {
	var out bytes.Buffer
	usage(&out)
	for _, name := range []string{} {
		if strings.Contains(out.String(), name) {
			t.Errorf("usage mentions unbuilt command %q", name)
		}
	}
}

func TestFlagsOverrideConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pgquic.yml")
	yml := `
tcp_listen: "127.0.0.1:7000"
quic_listen: "127.0.0.1:7001"
pool_size: 7
min_pool: 1
mode: session
backend: postgres://file@127.0.0.1:5432/postgres
log_level: debug
`
	if err := os.WriteFile(file, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseServeFlags([]string{
		"--config", file,
		"--pool-size", "9",
		"--server-idle-timeout", "3s",
		"--quic-listen", "",
		"--backend", "postgres://flag@127.0.0.1:5432/postgres",
	}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Set by flags.
	if cfg.PoolSize != 9 || cfg.ServerIdleTimeout != 3*time.Second || cfg.QUICListen != "" || cfg.Backend != "postgres://flag@127.0.0.1:5432/postgres" {
		t.Errorf("flags did not override: %+v", cfg)
	}
	// From the file: the flags' own defaults must not clobber them.
	if cfg.TCPListen != "127.0.0.1:7000" || cfg.MinPool != 1 || cfg.Mode != "session" || cfg.LogLevel != "debug" {
		t.Errorf("file values lost: %+v", cfg)
	}
	// Neither: the config defaults.
	if cfg.MetricsListen != config.DefaultMetricsListen || cfg.AcquireTimeout != config.DefaultAcquireTimeout {
		t.Errorf("defaults missing: %+v", cfg)
	}

	if _, err := parseServeFlags([]string{"--config", filepath.Join(dir, "missing.yml")}, io.Discard, io.Discard); err == nil {
		t.Error("missing config file accepted")
	}
}

// lockedBuffer collects log output written from many goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testConfig listens on free loopback ports.
func testConfig(backendURL string) *config.Config {
	cfg := config.Default()
	cfg.TCPListen = "127.0.0.1:0"
	cfg.QUICListen = "127.0.0.1:0"
	cfg.MetricsListen = "127.0.0.1:0"
	cfg.Backend = backendURL
	cfg.PoolSize = 4
	cfg.MinPool = 1
	cfg.ShutdownGrace = 20 * time.Second
	return cfg
}

// startTestServer runs the serve wiring in-process and returns it with a
// stop function that shuts it down and reports Run's result.
func startTestServer(t *testing.T, cfg *config.Config) (*server, *lockedBuffer, func() error) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	srv, err := startServer(ctx, cfg, logger)
	if err != nil {
		t.Fatalf("startServer: %v\nlogs:\n%s", err, logs.String())
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	var once sync.Once
	var result error
	stopFn := func() error {
		once.Do(func() {
			stop()
			result = <-done
		})
		return result
	}
	t.Cleanup(func() { _ = stopFn() })
	return srv, logs, stopFn
}

func TestServeTCPAndQUIC(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	srv, logs, stop := startTestServer(t, testConfig(cluster.SuperURL("postgres")))

	readyLines := 0
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "ready") {
			readyLines++
			for _, want := range []string{"tcp=" + srv.tcp.Addr().String(), "quic=" + srv.quic.Addr().String(), "quic_fingerprint=" + srv.quic.Fingerprint()} {
				if !strings.Contains(l, want) {
					t.Errorf("ready line lacks %q: %s", want, l)
				}
			}
		}
	}
	if readyLines != 1 {
		t.Errorf("%d lines mention ready, want 1:\n%s", readyLines, logs.String())
	}

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	// TCP.
	tcpURL := fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, srv.tcp.Addr())
	conn, err := pgconn.Connect(ctx, tcpURL)
	if err != nil {
		t.Fatalf("connect over TCP: %v", err)
	}
	res, err := conn.Exec(ctx, "SELECT 40 + 2").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res[0].Rows[0][0]); got != "42" {
		t.Errorf("TCP query returned %q, want 42", got)
	}
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// QUIC, verifying the generated certificate by the logged fingerprint.
	qconn := connectQUIC(ctx, t, cluster, srv, quicclient.DialerConfig{Conns: 1, PinSHA256: srv.quic.Fingerprint()})
	res, err = qconn.Exec(ctx, "SELECT 'over quic'").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res[0].Rows[0][0]); got != "over quic" {
		t.Errorf("QUIC query returned %q", got)
	}
	if err := qconn.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// The edge subcommand's wiring: a plain TCP client through the edge,
	// carried over QUIC to the server.
	edgeLogs := &lockedBuffer{}
	edgeCtx, stopEdge := context.WithCancel(context.Background())
	edgeDone := make(chan error, 1)
	go func() {
		edgeDone <- runEdgeWith(edgeCtx, edgeConfig{
			listen: "127.0.0.1:0", pooler: srv.quic.Addr().String(), pin: srv.quic.Fingerprint(),
			conns: 2, streams: 10, grace: 10 * time.Second,
		}, slog.New(slog.NewTextHandler(edgeLogs, nil)))
	}()
	var edgeAddr string
	waitFor(t, func() bool {
		_, after, ok := strings.Cut(edgeLogs.String(), `msg="pgquic edge ready" listen=`)
		edgeAddr, _, _ = strings.Cut(after, " ")
		return ok
	})
	econn, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=prefer", cluster.SuperUser, cluster.SuperPassword, edgeAddr))
	if err != nil {
		t.Fatalf("connect through the edge: %v\n%s", err, edgeLogs.String())
	}
	if _, err := econn.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	econn.Close(ctx)
	stopEdge()
	if err := <-edgeDone; err != nil {
		t.Fatalf("edge: %v", err)
	}

	// Metrics from every layer are exposed.
	resp, err := http.Get("http://" + srv.metrics.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"pgquic_tcp_accepted_total 1", "go_goroutines", "process_cpu_seconds_total"} {
		if !strings.Contains(string(body), name) {
			t.Errorf("metrics lack %q", name)
		}
	}

	// A session inside a transaction survives the start of shutdown and
	// finishes its transaction; then everything stops and Run returns nil.
	conn, err = pgconn.Connect(ctx, tcpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "BEGIN; SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	waitFor(t, func() bool { return strings.Contains(logs.String(), "shutting down") })
	if _, err := conn.Exec(ctx, "SELECT 2; COMMIT").ReadAll(); err != nil {
		t.Errorf("transaction open at shutdown could not finish: %v", err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := pgconn.Connect(ctx, tcpURL); err == nil {
		t.Error("connect after shutdown succeeded")
	}
}

// needPostgres skips a test that starts its own PostgreSQL when the server
// binaries are not installed, except under CI=true, where it fails.
func needPostgres(t *testing.T) {
	t.Helper()
	if _, err := pgtest.Binaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI: %v", err)
		}
		t.Skipf("PostgreSQL not installed: %v", err)
	}
}

// TestServeEmbeddedPostgres is the zero-flag run: no backend configured, so
// the server starts (and at shutdown removes) its own PostgreSQL.
func TestServeEmbeddedPostgres(t *testing.T) {
	needPostgres(t)
	cfg := testConfig("")
	cfg.QUICListen = ""
	cfg.MetricsListen = ""
	srv, logs, stop := startTestServer(t, cfg)
	if srv.cluster == nil {
		t.Fatal("no throwaway cluster started")
	}
	dataDir := srv.cluster.DataDir
	if !strings.Contains(logs.String(), "throwaway PostgreSQL running") || !strings.Contains(logs.String(), `url="postgres://`) {
		t.Errorf("cluster URL not logged:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "quic=disabled") {
		t.Errorf("ready line does not say QUIC is disabled:\n%s", logs.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	conn, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable",
		srv.cluster.SuperUser, srv.cluster.SuperPassword, srv.tcp.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("throwaway data directory %s still there after shutdown (%v)", dataDir, err)
	}
}

// TestServeWithCertificate checks that --tls-cert/--tls-key feed both
// fronts: TCP upgrades after SSLRequest and QUIC presents the same
// certificate, verified through a CA file.
func TestServeWithCertificate(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	dir := t.TempDir()
	cert, err := quicfront.GenerateSelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(cluster.SuperURL("postgres"))
	cfg.TLSCert, cfg.TLSKey, cfg.RequireTLS = certFile, keyFile, true
	cfg.MetricsListen = ""
	srv, _, stop := startTestServer(t, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	base := fmt.Sprintf("postgres://%s:%s@%s/postgres", cluster.SuperUser, cluster.SuperPassword, srv.tcp.Addr())
	conn, err := pgconn.Connect(ctx, base+"?sslmode=verify-ca&sslrootcert="+certFile)
	if err != nil {
		t.Fatalf("TLS over TCP: %v", err)
	}
	if _, ok := conn.Conn().(*tls.Conn); !ok {
		t.Errorf("TCP session is not TLS: %T", conn.Conn())
	}
	if _, err := conn.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	// libpq's psql with sslmode=require, as users run it.
	psqlPath, err := exec.LookPath("psql")
	if err != nil && os.Getenv("CI") == "true" {
		t.Fatalf("psql not found: %v", err)
	}
	if err == nil {
		out, err := exec.CommandContext(ctx, psqlPath, base+"?sslmode=require", "-Atc", "select 'via psql'").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "via psql" {
			t.Errorf("psql sslmode=require: %v: %s", err, out)
		}
	}
	// require_tls: a plain client is refused.
	if _, err := pgconn.Connect(ctx, base+"?sslmode=disable"); err == nil {
		t.Error("plain TCP client accepted with require_tls")
	}

	qconn := connectQUIC(ctx, t, cluster, srv, quicclient.DialerConfig{CAFile: certFile})
	if _, err := qconn.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	qconn.Close(ctx)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestStartFailsCleanly(t *testing.T) {
	cfg := testConfig("postgres://nobody@127.0.0.1:1/postgres?sslmode=disable")
	cfg.TLSCert = filepath.Join(t.TempDir(), "missing.crt")
	cfg.TLSKey = filepath.Join(t.TempDir(), "missing.key")
	_, err := startServer(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "load TLS certificate") {
		t.Fatalf("startServer = %v, want a TLS load error", err)
	}
}

func TestServeSubcommandHelpDoesNotStart(t *testing.T) {
	_, err := parseServeFlags([]string{"--help"}, io.Discard, io.Discard)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// connectQUIC opens a pgconn session over a QUIC stream of srv, with the
// Dialer configured by dc (its Addr is filled in).
func connectQUIC(ctx context.Context, t *testing.T, cluster *pgtest.Cluster, srv *server, dc quicclient.DialerConfig) *pgconn.PgConn {
	t.Helper()
	dc.Addr = srv.quic.Addr().String()
	dialer, err := quicclient.NewDialer(dc, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dialer.Close() })
	pcfg, err := pgconn.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, srv.quic.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.DialFunc = dialer.DialFunc()
	qconn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		t.Fatalf("connect over QUIC: %v", err)
	}
	return qconn
}

// TestServeFlagsChosenOrDefault covers settings whose default is treated
// differently from the same value chosen on purpose.
func TestServeFlagsChosenOrDefault(t *testing.T) {
	dir := t.TempDir()
	file := func(name, yml string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	trustFile := file("trust.yml", "auth:\n  method: trust\n")
	minPoolFile := file("minpool.yml", "min_pool: 3\n")
	smallPoolFile := file("smallpool.yml", "pool_size: 1\n")
	tests := []struct {
		args    []string
		err     string                    // substring of the expected error; "" for success
		check   func(*config.Config) bool // for success
		explain string
	}{
		{args: []string{"--pool-size", "1"}, check: func(c *config.Config) bool { return c.PoolSize == 1 && c.MinPool == 1 }, explain: "default min_pool lowered to pool_size"},
		{args: []string{"--config", smallPoolFile}, check: func(c *config.Config) bool { return c.PoolSize == 1 && c.MinPool == 1 }, explain: "pool_size 1 in the file"},
		{args: []string{"--pool-size", "1", "--min-pool", "0"}, check: func(c *config.Config) bool { return c.MinPool == 0 }, explain: "explicit min_pool 0 kept"},
		{args: []string{"--config", minPoolFile, "--pool-size", "2"}, err: "min_pool: 3 exceeds pool_size 2"},
		{args: []string{"--min-pool", "25"}, err: "min_pool: 25 exceeds pool_size 20"},
		{args: []string{"--quic-listen", "0.0.0.0:6432", "--tcp-listen", ""}, err: `quic_listen "0.0.0.0:6432"`},
		{args: []string{"--tcp-listen", "[::]:6432", "--auth-method", "trust"}, check: func(c *config.Config) bool { return c.Auth.Method == "trust" }, explain: "trust chosen by flag"},
		{args: []string{"--tcp-listen", "0.0.0.0:6432", "--config", trustFile}, check: func(c *config.Config) bool { return c.Auth.Method == "trust" }, explain: "trust chosen in the file"},
		{args: []string{"--tcp-listen", "localhost:6432"}, check: func(c *config.Config) bool { return c.Auth.Method == "trust" }, explain: "loopback by name"},
		{args: []string{"--max-pools", "7", "--pool-idle-timeout", "90s"}, check: func(c *config.Config) bool {
			return c.MaxPools == 7 && c.PoolIdleTimeout == 90*time.Second
		}, explain: "pool bounds from flags"},
		{args: []string{"--metrics-listen", "127.0.0.1:9999"}, check: func(c *config.Config) bool { return c.Explicit.MetricsListen }, explain: "metrics address chosen"},
		{args: nil, check: func(c *config.Config) bool {
			return !c.Explicit.MetricsListen && !c.Explicit.AuthMethod && !c.Explicit.MinPool && c.MaxPools == config.DefaultMaxPools
		}, explain: "nothing chosen"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			cfg, err := parseServeFlags(tt.args, io.Discard, io.Discard)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Errorf("%s: got %+v", tt.explain, cfg)
			}
		})
	}
}

// TestServeMetricsAddressTaken runs two servers on one host with the same
// metrics address. When the second one's address was chosen it must not
// start and must say which address is taken and how to change it; when it
// is the default it starts without metrics and says so.
func TestServeMetricsAddressTaken(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	cfg := testConfig(cluster.SuperURL("postgres"))
	first, _, _ := startTestServer(t, cfg)
	taken := first.metrics.Addr().String()

	// Chosen on the command line: exit code 1 and a clear message.
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	code := run(ctx, []string{"serve", "--backend", cluster.SuperURL("postgres"),
		"--tcp-listen", "127.0.0.1:0", "--quic-listen", "", "--metrics-listen", taken}, &stdout, &stderr)
	if code != 1 {
		t.Errorf("second serve with a taken --metrics-listen: exit code %d, want 1", code)
	}
	for _, want := range []string{"cannot listen on " + taken, "address already in use", "--metrics-listen ''"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}

	// The default address (simulated: not chosen by the user) taken: the
	// second server serves clients without metrics.
	cfg2 := testConfig(cluster.SuperURL("postgres"))
	cfg2.QUICListen = ""
	cfg2.MetricsListen = taken
	second, logs, stop := startTestServer(t, cfg2)
	if second.metrics != nil {
		t.Fatal("second server claims a metrics listener")
	}
	for _, want := range []string{"metrics disabled", "addr=" + taken, "--metrics-listen ''", "metrics=disabled"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs.String())
		}
	}
	conn, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, second.tcp.Addr()))
	if err != nil {
		t.Fatalf("second server does not serve: %v", err)
	}
	conn.Close(ctx)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestServeWildcardPoolBounds checks the wildcard route's limits through
// the whole wiring: unknown databases leave no pool behind, and a client
// whose pool would exceed max_pools gets SQLSTATE 53300.
func TestServeWildcardPoolBounds(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	cfg := testConfig(cluster.SuperURL("postgres"))
	cfg.QUICListen = ""
	cfg.MaxPools = 1
	srv, logs, _ := startTestServer(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	url := func(db string) string {
		return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, srv.tcp.Addr(), db)
	}

	for i := range 20 {
		_, err := pgconn.Connect(ctx, url(fmt.Sprintf("nope_%d", i)))
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "3D000" {
			t.Fatalf("unknown database: %v, want SQLSTATE 3D000\n%s", err, logs.String())
		}
	}
	waitFor(t, func() bool { return len(srv.live.manager.Load().Pools()) == 0 })

	conn, err := pgconn.Connect(ctx, url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	_, err = pgconn.Connect(ctx, url("template1"))
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "53300" || !strings.Contains(pe.Message, "too many pools") {
		t.Fatalf("pool beyond max_pools: %v, want SQLSTATE 53300 too many pools", err)
	}
	if n := len(srv.live.manager.Load().Pools()); n != 1 {
		t.Errorf("%d pools, want 1", n)
	}
}
