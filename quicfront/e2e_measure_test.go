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
	// With a load ("max" or a rate), the client subprocess runs queries instead of idling.
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
	if load := os.Getenv(envClientRate); load != "" {
		// Fixed-rate or saturation mode for TestE2EMeasureServerProfile.
		conns := make([]*pgx.Conn, n)
		for i := range conns {
			c, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			conns[i] = c
		}
		fixedRate(ctx, conns, 2000, time.Second) // warm up
		fmt.Println("READY")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		done, errs := runLoad(ctx, conns, load, time.Duration(envInt(envClientSeconds, 10))*time.Second)
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
	start := time.Now()
	return onEach(ctx, conns, func(i int, query func()) {
		offset := interval * time.Duration(i) / time.Duration(len(conns))
		for k := 0; k < perConn; k++ {
			time.Sleep(time.Until(start.Add(offset + time.Duration(k)*interval)))
			query()
		}
	})
}

// saturate runs queries back to back on every connection for d and returns
// completed queries and errors: the highest rate the clients, the server and
// PostgreSQL reach together.
func saturate(ctx context.Context, conns []*pgx.Conn, d time.Duration) (done, errs int64) {
	end := time.Now().Add(d)
	return onEach(ctx, conns, func(_ int, query func()) {
		for time.Now().Before(end) {
			query()
		}
	})
}

// onEach runs drive for every connection at once, handing it a function
// that runs measureQuery once on that connection and counts the outcome,
// and returns completed queries and errors once every drive has returned.
func onEach(ctx context.Context, conns []*pgx.Conn, drive func(i int, query func())) (done, errs int64) {
	var wg sync.WaitGroup
	var ok, bad atomic.Int64
	for i, c := range conns {
		wg.Go(func() {
			var v float64
			drive(i, func() {
				if err := c.QueryRow(ctx, measureQuery).Scan(&v); err != nil {
					bad.Add(1)
					return
				}
				ok.Add(1)
			})
		})
	}
	wg.Wait()
	return ok.Load(), bad.Load()
}

// runLoad runs load ("max" for saturation, else queries per second) on conns
// for d.
func runLoad(ctx context.Context, conns []*pgx.Conn, load string, d time.Duration) (done, errs int64) {
	if load == "max" {
		return saturate(ctx, conns, d)
	}
	rate, err := strconv.Atoi(load)
	if err != nil || rate <= 0 {
		panic("load must be max or a positive rate: " + load)
	}
	return fixedRate(ctx, conns, rate, d)
}

// ctxSwitches sums the voluntary and involuntary context switches of every
// thread of a process.
func ctxSwitches(pid int) int64 {
	dirs, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	var n int64
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "voluntary_ctxt_switches:") || strings.HasPrefix(l, "nonvoluntary_ctxt_switches:") {
				v, _ := strconv.ParseInt(strings.TrimSpace(l[strings.IndexByte(l, ':')+1:]), 10, 64)
				n += v
			}
		}
	}
	return n
}

// perfSyscalls are the system calls TestE2EMeasureCPUPerQuery counts per
// query with PGQUIC_MEASURE_PERF=1; raw_syscalls:sys_enter is all of them.
var perfSyscalls = []string{"raw_syscalls:sys_enter", "syscalls:sys_enter_read", "syscalls:sys_enter_write",
	"syscalls:sys_enter_sendmsg", "syscalls:sys_enter_recvmsg", "syscalls:sys_enter_recvmmsg",
	"syscalls:sys_enter_futex", "syscalls:sys_enter_epoll_pwait", "syscalls:sys_enter_nanosleep"}

// perfStat counts perfSyscalls of process pid until the returned function is
// called, which returns the counts by short name (e.g. "sendmsg", "all").
// It returns nil when perf cannot start.
func perfStat(t *testing.T, pid int) func() map[string]int64 {
	t.Helper()
	out := filepath.Join(t.TempDir(), "perf.csv")
	cmd := exec.Command("perf", "stat", "-x,", "-o", out, "-e", strings.Join(perfSyscalls, ","), "-p", strconv.Itoa(pid))
	if err := cmd.Start(); err != nil {
		t.Logf("perf stat: %v", err)
		return nil
	}
	time.Sleep(200 * time.Millisecond) // let perf attach
	return func() map[string]int64 {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		b, _ := os.ReadFile(out)
		m := map[string]int64{}
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Split(l, ",")
			if len(f) < 3 {
				continue
			}
			v, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				continue
			}
			name := strings.TrimPrefix(strings.TrimPrefix(f[2], "syscalls:sys_enter_"), "raw_syscalls:sys_enter")
			if name == "" {
				name = "all"
			}
			m[name] = v
		}
		return m
	}
}

func envList(name, def string) []string {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	return strings.Split(v, ",")
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// TestE2EMeasureCPUPerQuery compares the server CPU per query of the QUIC
// front with the TCP front under the same load. The server is the real
// `pgquic serve` binary (built here) in its own process, serving both fronts,
// so its CPU time is read from /proc/PID/stat before and after each phase
// without counting the clients (this process) or PostgreSQL (other
// processes). TCP: N pgx connections (and N more with TLS); QUIC: N pgx
// sessions over a few QUIC connections. Phases alternate within each load;
// the medians over the rounds and the ratios are reported.
//
// Knobs: PGQUIC_MEASURE_LOADS (comma-separated; "max" = every session
// querying back to back, a number = that many queries per second in total;
// default 2000), PGQUIC_MEASURE_SESSIONS (50), PGQUIC_MEASURE_QUIC_CONNS (4),
// PGQUIC_MEASURE_PHASES (tcp,tcp+tls,quic), PGQUIC_MEASURE_SECONDS (10),
// PGQUIC_MEASURE_ROUNDS (3), PGQUIC_MEASURE_SERVE_FLAGS (extra flags for
// pgquic serve, space-separated).
func TestE2EMeasureCPUPerQuery(t *testing.T) {
	measureOnly(t)
	seconds, rounds := envInt("PGQUIC_MEASURE_SECONDS", 10), envInt("PGQUIC_MEASURE_ROUNDS", 3)
	sessions, quicConns := envInt("PGQUIC_MEASURE_SESSIONS", 50), envInt("PGQUIC_MEASURE_QUIC_CONNS", 4)
	loads, phases := envList("PGQUIC_MEASURE_LOADS", "2000"), envList("PGQUIC_MEASURE_PHASES", "tcp,tcp+tls,quic")
	ctx := testCtx(t, 60*time.Minute)

	bin := filepath.Join(t.TempDir(), "pgquic")
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, "../cmd/pgquic").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/pgquic: %v\n%s", err, out)
	}
	cluster := pgtest.New(t, pgtest.Options{Settings: map[string]string{"max_connections": "100"}})
	flags := append([]string{"--pool-size", "20", "--min-pool", "20"}, strings.Fields(os.Getenv("PGQUIC_MEASURE_SERVE_FLAGS"))...)
	srv := startServe(t, bin, cluster, flags...)
	tcpAddr, quicAddr, fp, pid := srv.tcpAddr, srv.quicAddr, srv.fp, srv.pid

	cfgs := map[string]*pgx.ConnConfig{}
	for name, url := range map[string]string{"tcp": "sslmode=disable", "tcp+tls": "sslmode=require"} {
		c, err := pgx.ParseConfig("postgres://postgres:postgres@" + tcpAddr + "/postgres?" + url)
		if err != nil {
			t.Fatal(err)
		}
		cfgs[name] = c
	}
	d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: quicAddr, Conns: quicConns, PinSHA256: fp}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	cfgs["quic"] = pgxConfig(t, d)
	// quic-nc: the same without the client's write coalescing.
	dnc, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: quicAddr, Conns: quicConns, PinSHA256: fp, NoCoalescing: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dnc.Close() })
	cfgs["quic-nc"] = pgxConfig(t, dnc)
	dialers := map[string]*quicclient.Dialer{"quic": d, "quic-nc": dnc}
	if slices.Contains(phases, "edge") {
		// edge: pgx over TCP to a sidecar (edge.Edge in this process, its own
		// Dialer), as pgbench or psql would reach the pooler.
		de, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: quicAddr, Conns: quicConns, PinSHA256: fp}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = de.Close() }) // after the sidecar's own cleanup
		sidecar := startSidecar(t, de, nil)
		c, err := pgx.ParseConfig("postgres://postgres:postgres@" + sidecar.Addr().String() + "/postgres?sslmode=disable")
		if err != nil {
			t.Fatal(err)
		}
		cfgs["edge"] = c
		dialers["edge"] = de
	}
	sets := map[string][]*pgx.Conn{}
	for _, name := range phases {
		cfg, ok := cfgs[name]
		if !ok {
			t.Fatalf("unknown phase %q (tcp, tcp+tls, quic, quic-nc, edge)", name)
		}
		conns := make([]*pgx.Conn, sessions)
		for i := range conns {
			c, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			conns[i] = c
		}
		if name == "tcp+tls" {
			if _, ok := conns[0].PgConn().Conn().(*tls.Conn); !ok {
				t.Fatalf("sslmode=require connection is %T, not TLS", conns[0].PgConn().Conn())
			}
		}
		sets[name] = conns
	}
	t.Logf("QUIC dialers: %+v, without coalescing %+v", d.Stats(), dnc.Stats())
	for _, name := range phases { // warm up: statement caches, pool
		fixedRate(ctx, sets[name], 2000, 2*time.Second)
	}
	time.Sleep(time.Second)
	idle0 := procCPU(t, pid)
	time.Sleep(5 * time.Second)
	idleCPU := procCPU(t, pid) - idle0
	t.Logf("load average at start: %s; server idle CPU %v per 5s; %d sessions per phase, QUIC over %d connections",
		loadavg(), idleCPU, sessions, quicConns)

	type key struct{ load, phase string }
	cpuPer, csPer, qps := map[key][]float64{}, map[key][]float64{}, map[key][]float64{}
	for r := 0; r < rounds; r++ {
		for _, load := range loads {
			order := slices.Clone(phases)
			for i := 0; i < r%len(order); i++ { // rotate the order each round
				order = append(order[1:], order[0])
			}
			for _, name := range order {
				time.Sleep(500 * time.Millisecond)
				var stopPerf func() map[string]int64
				if os.Getenv("PGQUIC_MEASURE_PERF") == "1" {
					stopPerf = perfStat(t, pid)
				}
				var p0 quicclient.DialerStats
				if qd := dialers[name]; qd != nil {
					p0 = qd.Stats()
				}
				c0, s0, cl0 := procCPU(t, pid), ctxSwitches(pid), procCPU(t, os.Getpid())
				t0 := time.Now()
				done, errs := runLoad(ctx, sets[name], load, time.Duration(seconds)*time.Second)
				wall := time.Since(t0)
				cpu, cs, client := procCPU(t, pid)-c0, ctxSwitches(pid)-s0, procCPU(t, os.Getpid())-cl0
				sys := fmt.Sprintf("; clients (this process) %.1f µs/query", float64(client.Microseconds())/float64(done))
				if qd := dialers[name]; qd != nil {
					// The server receives what the clients send and sends what they receive.
					p1 := qd.Stats()
					sys += fmt.Sprintf("; QUIC packets/query in %.2f, out %.2f",
						float64(p1.PacketsSent-p0.PacketsSent)/float64(done), float64(p1.PacketsReceived-p0.PacketsReceived)/float64(done))
				}
				if stopPerf != nil {
					counts := stopPerf()
					sys += "; syscalls/query (perf, phase plus ~0.2 s):"
					for _, n := range []string{"all", "read", "write", "sendmsg", "recvmsg", "recvmmsg", "futex", "epoll_pwait", "nanosleep"} {
						sys += fmt.Sprintf(" %s=%.2f", n, float64(counts[n])/float64(done))
					}
				}
				if errs > 0 {
					t.Fatalf("%s phase: %d query errors", name, errs)
				}
				k := key{load, name}
				us := float64(cpu.Microseconds()) / float64(done)
				cpuPer[k] = append(cpuPer[k], us)
				csPer[k] = append(csPer[k], float64(cs)/float64(done))
				qps[k] = append(qps[k], float64(done)/wall.Seconds())
				t.Logf("round %d load %-5s %-7s: %d queries in %v (%.0f q/s), server CPU %v = %.1f µs/query, %.2f ctx switches/query%s; load %s",
					r+1, load, name, done, wall.Round(time.Millisecond), float64(done)/wall.Seconds(), cpu, us, float64(cs)/float64(done), sys, loadavg())
			}
		}
	}
	for _, load := range loads {
		var b strings.Builder
		for _, name := range phases {
			k := key{load, name}
			fmt.Fprintf(&b, "; %s %.1f µs/query %v, %.0f q/s, %.2f cs/query", name, median(cpuPer[k]), cpuPer[k], median(qps[k]), median(csPer[k]))
		}
		for _, q := range []string{"quic", "quic-nc", "edge"} {
			if mq, tc := median(cpuPer[key{load, q}]), median(cpuPer[key{load, "tcp"}]); mq > 0 && tc > 0 {
				fmt.Fprintf(&b, "; %s/tcp = %.2f", q, mq/tc)
				if ts := median(cpuPer[key{load, "tcp+tls"}]); ts > 0 {
					fmt.Fprintf(&b, ", %s/tcp+tls = %.2f", q, mq/ts)
				}
			}
		}
		t.Logf("MEASURE cpu-per-query load %s, %d sessions (QUIC over %d conns), %ds phases, %d rounds%s",
			load, sessions, quicConns, seconds, rounds, b.String())
	}
	t.Logf("load average at end: %s", loadavg())
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
// subprocess sends queries: N TCP connections, then N sessions over a few
// QUIC connections, under the first load of PGQUIC_MEASURE_LOADS (the knobs
// of TestE2EMeasureCPUPerQuery; PGQUIC_MEASURE_PHASES picks tcp and/or quic).
// Profiles go to PGQUIC_PROFILE_DIR (default: a temporary directory,
// logged); read them with `go tool pprof -top FILE`. It also logs this
// process's CPU per query, an in-process cross-check of
// TestE2EMeasureCPUPerQuery.
func TestE2EMeasureServerProfile(t *testing.T) {
	measureOnly(t)
	load, seconds := envList("PGQUIC_MEASURE_LOADS", "2000")[0], envInt("PGQUIC_MEASURE_SECONDS", 10)
	sessions, quicConns := envInt("PGQUIC_MEASURE_SESSIONS", 50), envInt("PGQUIC_MEASURE_QUIC_CONNS", 4)
	dir := os.Getenv("PGQUIC_PROFILE_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	e := newE2E(t, e2eOpts{tcp: true})
	ctx := testCtx(t, 5*time.Minute)
	for _, mode := range envList("PGQUIC_MEASURE_PHASES", "tcp,quic") {
		addr := e.addr
		if mode == "tcp" {
			addr = e.tcp.Addr().String()
		}
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestE2EMeasureClientHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), envClientMode+"="+mode, envClientAddr+"="+addr, envClientPin+"="+e.fingerprint(),
			envClientN+"="+strconv.Itoa(sessions), envClientConns+"="+strconv.Itoa(quicConns), envClientRate+"="+load, envClientSeconds+"="+strconv.Itoa(seconds))
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
		writeAllocs := func(suffix string) {
			af, err := os.Create(filepath.Join(dir, "server-"+mode+".allocs"+suffix))
			if err != nil {
				t.Fatal(err)
			}
			defer af.Close()
			if err := pprof.Lookup("allocs").WriteTo(af, 0); err != nil {
				t.Fatal(err)
			}
		}
		writeAllocs(".base")
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		c0 := procCPU(t, os.Getpid())
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(stdin, "go\n")
		line := next("DONE")
		pprof.StopCPUProfile()
		cpu := procCPU(t, os.Getpid()) - c0
		runtime.ReadMemStats(&ms1)
		writeAllocs("")
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
		t.Logf("MEASURE in-process server %s: %d queries, server CPU %v = %.1f µs/query, %.1f allocations and %.0f bytes/query, %d GCs; profile %s (allocations: go tool pprof -sample_index=alloc_space -base %s.allocs.base %s.allocs); load %s",
			mode, done, cpu, float64(cpu.Microseconds())/float64(done), float64(ms1.Mallocs-ms0.Mallocs)/float64(done),
			float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(done), ms1.NumGC-ms0.NumGC, f.Name(),
			strings.TrimSuffix(f.Name(), ".pprof"), strings.TrimSuffix(f.Name(), ".pprof"), loadavg())
		e.waitIdle(t, 0)
	}
}
