package quicfront_test

// Measurements (acceptance point 5). They log numbers and assert nothing
// about speed; they run only with PGQUIC_MEASURE=1 because they take about
// two minutes. See "Measurements" in README.md for the numbers and how to
// reproduce them.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/quicclient"
	"github.com/pgquic/pgquic/quicfront"
)

func measureOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("PGQUIC_MEASURE") != "1" {
		t.Skip("measurement: set PGQUIC_MEASURE=1")
	}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// Environment of the client subprocess of TestE2EMeasureIdleMemory.
const (
	envClientMode  = "PGQUIC_E2E_CLIENT"       // "quic" or "tcp"
	envClientAddr  = "PGQUIC_E2E_CLIENT_ADDR"  // server address
	envClientPin   = "PGQUIC_E2E_CLIENT_PIN"   // QUIC certificate pin
	envClientN     = "PGQUIC_E2E_CLIENT_N"     // sessions
	envClientConns = "PGQUIC_E2E_CLIENT_CONNS" // QUIC connections
	// With a rate, the helper runs fixed-rate queries instead of idling.
	envClientRate    = "PGQUIC_E2E_CLIENT_RATE"
	envClientSeconds = "PGQUIC_E2E_CLIENT_SECONDS"
	// With PGQUIC_E2E_CLIENT_QUERY=1 each idle session first runs one query.
	envClientQuery = "PGQUIC_E2E_CLIENT_QUERY"
)

// TestE2EMeasureClientHelper is not a test: it is the client side of
// TestE2EMeasureIdleMemory, run in a subprocess (this test binary re-executed)
// so that the server's memory is measured without any client in the same
// process. It opens N sessions, prints READY once all of them are logged in
// (ReadyForQuery received), keeps them idle until stdin closes, then closes
// them.
func TestE2EMeasureClientHelper(t *testing.T) {
	mode := os.Getenv(envClientMode)
	if mode == "" {
		t.Skip("client subprocess of TestE2EMeasureIdleMemory")
	}
	n, _ := strconv.Atoi(os.Getenv(envClientN))
	conns, _ := strconv.Atoi(os.Getenv(envClientConns))
	addr := os.Getenv(envClientAddr)
	ctx := testCtx(t, 5*time.Minute)
	var cfg *pgx.ConnConfig
	var err error
	if mode == "quic" {
		d, derr := quicclient.NewDialer(quicclient.DialerConfig{Addr: addr, Conns: conns, PinSHA256: os.Getenv(envClientPin)}, nil)
		if derr != nil {
			t.Fatal(derr)
		}
		defer d.Close()
		cfg = pgxConfig(t, d)
	} else {
		cfg, err = pgx.ParseConfig("postgres://postgres:postgres@" + addr + "/postgres?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
	}
	if rate := envInt(envClientRate, 0); rate > 0 {
		// Fixed-rate mode for TestE2EMeasureServerProfile.
		conns := make([]*pgx.Conn, n)
		for i := range conns {
			c, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			conns[i] = c
		}
		fixedRate(ctx, conns, rate, time.Second) // warm up
		fmt.Println("READY")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		done, errs := fixedRate(ctx, conns, rate, time.Duration(envInt(envClientSeconds, 10))*time.Second)
		fmt.Printf("DONE %d %d\n", done, errs)
		return
	}
	sessions := make([]*pgx.Conn, n)
	var wg sync.WaitGroup
	var failed atomic.Int64
	sem := make(chan struct{}, 200)
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			c, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				failed.Add(1)
				t.Errorf("session %d: %v", i, err)
				return
			}
			sessions[i] = c
			if os.Getenv(envClientQuery) == "1" {
				if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
					failed.Add(1)
					t.Errorf("session %d: %v", i, err)
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("READY %d %d\n", n-int(failed.Load()), failed.Load())
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range sessions {
		if c != nil {
			_ = c.Close(context.Background())
		}
	}
}

// serverMem is the server-side memory the Go runtime holds, after a GC.
type serverMem struct {
	heapStack  uint64 // HeapInuse + StackInuse
	stack      uint64 // StackInuse
	goroutines int
	rssKB      int
}

func readServerMem() serverMem {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return serverMem{heapStack: ms.HeapInuse + ms.StackInuse, stack: ms.StackInuse, goroutines: runtime.NumGoroutine(), rssKB: vmRSSKB(os.Getpid())}
}

func vmRSSKB(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				kb, _ := strconv.Atoi(f[1])
				return kb
			}
		}
	}
	return 0
}

// TestE2EMeasureIdleMemory measures the server's memory per idle session:
// 2,000 sessions (over 50 QUIC connections, then over TCP for comparison)
// logged in and idle. The server (pooler, fronts, backend pool) runs in this
// process; the clients run in a subprocess, so only server memory is
// counted. The figure is the growth of HeapInuse+StackInuse after a forced
// GC, divided by the number of sessions: everything a session costs the
// server, its goroutines' stacks included.
func TestE2EMeasureIdleMemory(t *testing.T) {
	measureOnly(t)
	const n = 2000
	if os.Getenv("PGQUIC_PROFILE_DIR") != "" {
		// Sample every 64 bytes allocated so small per-session objects
		// show up in the heap profiles.
		defer func(r int) { runtime.MemProfileRate = r }(runtime.MemProfileRate)
		runtime.MemProfileRate = 64
	}
	e := newE2E(t, e2eOpts{tcp: true})
	ctx := testCtx(t, 5*time.Minute)
	{ // Warm the pool and the pooler's learnt parameters.
		d := e.dialer(t, 1, 1000)
		c, err := pgx.ConnectConfig(ctx, pgxConfig(t, d))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close(ctx)
		_ = d.Close()
		e.waitIdle(t, 0)
	}
	t.Logf("load average at start: %s", loadavg())
	modes := []string{"quic", "tcp", "quic", "tcp"}
	if m := os.Getenv("PGQUIC_MEASURE_MODES"); m != "" {
		modes = strings.Split(m, ",")
	}
	for round, mode := range modes {
		addr := e.addr
		if mode == "tcp" {
			addr = e.tcp.Addr().String()
		}
		time.Sleep(time.Second)
		before := readServerMem()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestE2EMeasureClientHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), envClientMode+"="+mode, envClientAddr+"="+addr, envClientPin+"="+e.fingerprint(),
			envClientN+"="+strconv.Itoa(n), envClientConns+"=50")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		ready := ""
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY") {
				ready = sc.Text()
				break
			}
		}
		if ready != "READY "+strconv.Itoa(n)+" 0" {
			_ = stdin.Close()
			_ = cmd.Wait()
			t.Fatalf("client subprocess: %q", ready)
		}
		time.Sleep(2 * time.Second) // idle
		during := readServerMem()
		sessions := e.pooler.Sessions()
		if dir := os.Getenv("PGQUIC_PROFILE_DIR"); dir != "" {
			for _, prof := range []string{"heap", "goroutine"} {
				f, err := os.Create(filepath.Join(dir, fmt.Sprintf("idle-%s-%d.%s", mode, round, prof)))
				if err != nil {
					t.Fatal(err)
				}
				debug := 0
				if prof == "goroutine" {
					debug = 1
				}
				if err := pprof.Lookup(prof).WriteTo(f, debug); err != nil {
					t.Fatal(err)
				}
				_ = f.Close()
			}
		}
		_ = stdin.Close()
		go func() { _, _ = io.Copy(io.Discard, stdout) }()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("client subprocess: %v", err)
		}
		e.waitIdle(t, 0)
		perKB := float64(during.heapStack-before.heapStack) / n / 1024
		t.Logf("MEASURE idle-memory %s: %d idle sessions (pooler sessions %d): HeapInuse+StackInuse %.1f MiB -> %.1f MiB = %.1f KB per session (stacks %.1f KB); goroutines %d -> %d (%.2f per session); VmRSS %d -> %d KB (%.1f KB per session); load %s",
			mode, n, sessions, float64(before.heapStack)/(1<<20), float64(during.heapStack)/(1<<20), perKB, float64(during.stack-before.stack)/n/1024,
			before.goroutines, during.goroutines, float64(during.goroutines-before.goroutines)/n,
			before.rssKB, during.rssKB, float64(during.rssKB-before.rssKB)/n, loadavg())
	}
}

// procCPU returns a process's user+system CPU time from /proc/PID/stat.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	utime, _ := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	const clkTck = 100                          // getconf CLK_TCK on Linux
	return time.Duration(utime+stime) * time.Second / clkTck
}

// freeAddr returns a loopback address with a port that was free for network.
func freeAddr(t *testing.T, network string) string {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.LocalAddr().String()
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// measureQuery is the ramp's default query (see cmd/pgquic/README.md).
const measureQuery = "SELECT trunc(random() * 100) FROM generate_series(1, 10)"

// fixedRate runs queries on conns at rate queries per second in total for
// d, each connection on its own schedule. It returns completed queries and
// errors; queries that fall behind schedule are sent at once, never skipped.
func fixedRate(ctx context.Context, conns []*pgx.Conn, rate int, d time.Duration) (done, errs int64) {
	interval := time.Duration(float64(time.Second) * float64(len(conns)) / float64(rate))
	perConn := int(d / interval)
	var wg sync.WaitGroup
	var ok, bad atomic.Int64
	start := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			offset := interval * time.Duration(i) / time.Duration(len(conns))
			var v float64
			for k := 0; k < perConn; k++ {
				time.Sleep(time.Until(start.Add(offset + time.Duration(k)*interval)))
				if err := c.QueryRow(ctx, measureQuery).Scan(&v); err != nil {
					bad.Add(1)
					continue
				}
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	return ok.Load(), bad.Load()
}

// TestE2EMeasureCPUPerQuery compares the server CPU per query of the QUIC
// front with the TCP front at the same fixed rate. The server is the real
// `pgquic serve` binary (built here) in its own process, so its CPU time is
// read from /proc/PID/stat before and after each phase without counting the
// clients (this process) or PostgreSQL (other processes). TCP: 50 pgx
// connections; QUIC: 50 pgx sessions over 4 QUIC connections. Phases
// alternate TCP/QUIC; the medians are reported.
// PGQUIC_MEASURE_RATE (default 2000 q/s), PGQUIC_MEASURE_SECONDS (10) and
// PGQUIC_MEASURE_ROUNDS (3) tune it.
func TestE2EMeasureCPUPerQuery(t *testing.T) {
	measureOnly(t)
	rate, seconds, rounds := envInt("PGQUIC_MEASURE_RATE", 2000), envInt("PGQUIC_MEASURE_SECONDS", 10), envInt("PGQUIC_MEASURE_ROUNDS", 3)
	ctx := testCtx(t, 10*time.Minute)

	bin := filepath.Join(t.TempDir(), "pgquic")
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, "../cmd/pgquic").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/pgquic: %v\n%s", err, out)
	}
	cluster := pgtest.New(t, pgtest.Options{Settings: map[string]string{"max_connections": "100"}})
	tcpAddr, quicAddr := freeAddr(t, "tcp"), freeAddr(t, "udp")
	srvCtx, stopSrv := context.WithCancel(context.Background())
	certFile, keyFile := writeCertFiles(t)
	cmd := exec.CommandContext(srvCtx, bin, "serve", "--backend", cluster.SuperURL("postgres"),
		"--tcp-listen", tcpAddr, "--quic-listen", quicAddr, "--metrics-listen", "",
		"--pool-size", "20", "--min-pool", "20", "--tls-cert", certFile, "--tls-key", keyFile)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopSrv(); _ = cmd.Wait() })
	fpRe := regexp.MustCompile(`quic_fingerprint=([0-9a-fA-F:]+)`)
	fp := ""
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "pgquic ready") {
			if m := fpRe.FindStringSubmatch(sc.Text()); m != nil {
				fp = m[1]
			}
			break
		}
	}
	if fp == "" {
		t.Fatalf("no ready line with a QUIC fingerprint from pgquic serve")
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	pid := cmd.Process.Pid

	tcpCfg, err := pgx.ParseConfig("postgres://postgres:postgres@" + tcpAddr + "/postgres?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: quicAddr, Conns: 4, PinSHA256: fp}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	quicCfg := pgxConfig(t, d)
	open := func(cfg *pgx.ConnConfig) []*pgx.Conn {
		conns := make([]*pgx.Conn, 50)
		for i := range conns {
			c, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			conns[i] = c
		}
		return conns
	}
	tlsCfg, err := pgx.ParseConfig("postgres://postgres:postgres@" + tcpAddr + "/postgres?sslmode=require")
	if err != nil {
		t.Fatal(err)
	}
	phases := []string{"tcp", "tcp+tls", "quic"}
	sets := map[string][]*pgx.Conn{"tcp": open(tcpCfg), "tcp+tls": open(tlsCfg), "quic": open(quicCfg)}
	if st := sets["tcp+tls"][0].PgConn().Conn(); st == nil {
		t.Fatal("no TLS connection")
	} else if _, ok := st.(*tls.Conn); !ok {
		t.Fatalf("sslmode=require connection is %T, not TLS", st)
	}
	t.Logf("QUIC dialer: %+v", d.Stats())
	for _, name := range phases { // warm up: statement caches, pool
		fixedRate(ctx, sets[name], rate, 2*time.Second)
	}
	time.Sleep(time.Second)
	idle0 := procCPU(t, pid)
	time.Sleep(5 * time.Second)
	idleCPU := procCPU(t, pid) - idle0
	t.Logf("load average at start: %s; server idle CPU %v per 5s", loadavg(), idleCPU)

	per := map[string][]float64{}
	for r := 0; r < rounds; r++ {
		for _, name := range phases {
			time.Sleep(500 * time.Millisecond)
			c0 := procCPU(t, pid)
			t0 := time.Now()
			done, errs := fixedRate(ctx, sets[name], rate, time.Duration(seconds)*time.Second)
			wall := time.Since(t0)
			cpu := procCPU(t, pid) - c0
			if errs > 0 {
				t.Fatalf("%s phase: %d query errors", name, errs)
			}
			us := float64(cpu.Microseconds()) / float64(done)
			per[name] = append(per[name], us)
			t.Logf("round %d %-7s: %d queries in %v (%.0f q/s), server CPU %v = %.1f µs/query; load %s",
				r+1, name, done, wall.Round(time.Millisecond), float64(done)/wall.Seconds(), cpu, us, loadavg())
		}
	}
	med := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	mt, ms, mq := med(per["tcp"]), med(per["tcp+tls"]), med(per["quic"])
	t.Logf("MEASURE cpu-per-query at %d q/s, %ds phases, %d rounds: TCP median %.1f µs/query %v, TCP+TLS median %.1f µs/query %v, QUIC median %.1f µs/query %v; QUIC/TCP = %.2f, QUIC/TCP+TLS = %.2f",
		rate, seconds, rounds, mt, per["tcp"], ms, per["tcp+tls"], mq, per["quic"], mq/mt, mq/ms)
}

// writeCertFiles writes a self-signed certificate for 127.0.0.1 and its key
// as PEM files, for `pgquic serve --tls-cert/--tls-key` (TCP TLS and QUIC).
func writeCertFiles(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	cert, err := quicfront.GenerateSelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestE2EMeasureServerProfile writes a CPU profile of the server side (this
// process: pooler, fronts, backend pool) for each transport while a client
// subprocess sends queries at a fixed rate: 50 TCP connections, then 50
// sessions over 4 QUIC connections. Profiles go to PGQUIC_PROFILE_DIR
// (default: a temporary directory, logged); read them with
// `go tool pprof -top FILE`. It also logs this process's CPU per query,
// an in-process cross-check of TestE2EMeasureCPUPerQuery.
func TestE2EMeasureServerProfile(t *testing.T) {
	measureOnly(t)
	rate, seconds := envInt("PGQUIC_MEASURE_RATE", 2000), envInt("PGQUIC_MEASURE_SECONDS", 10)
	dir := os.Getenv("PGQUIC_PROFILE_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	e := newE2E(t, e2eOpts{tcp: true})
	ctx := testCtx(t, 5*time.Minute)
	for _, mode := range []string{"tcp", "quic"} {
		addr := e.addr
		if mode == "tcp" {
			addr = e.tcp.Addr().String()
		}
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestE2EMeasureClientHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), envClientMode+"="+mode, envClientAddr+"="+addr, envClientPin+"="+e.fingerprint(),
			envClientN+"=50", envClientConns+"=4", envClientRate+"="+strconv.Itoa(rate), envClientSeconds+"="+strconv.Itoa(seconds))
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		next := func(prefix string) string {
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), prefix) {
					return sc.Text()
				}
			}
			t.Fatalf("client subprocess ended before %s", prefix)
			return ""
		}
		next("READY")
		f, err := os.Create(filepath.Join(dir, "server-"+mode+".pprof"))
		if err != nil {
			t.Fatal(err)
		}
		c0 := procCPU(t, os.Getpid())
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(stdin, "go\n")
		line := next("DONE")
		pprof.StopCPUProfile()
		cpu := procCPU(t, os.Getpid()) - c0
		_ = f.Close()
		_ = stdin.Close()
		go func() { _, _ = io.Copy(io.Discard, stdout) }()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("client subprocess: %v", err)
		}
		var done, errs int64
		if _, err := fmt.Sscanf(line, "DONE %d %d", &done, &errs); err != nil || errs != 0 || done == 0 {
			t.Fatalf("client subprocess: %q", line)
		}
		t.Logf("MEASURE in-process server %s: %d queries, server CPU %v = %.1f µs/query; profile %s; load %s",
			mode, done, cpu, float64(cpu.Microseconds())/float64(done), f.Name(), loadavg())
		e.waitIdle(t, 0)
	}
}
