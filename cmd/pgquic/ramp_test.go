package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/loadgen/report"
	"github.com/pgquic/pgquic/loadgen/wan"
)

func TestRampFlags(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stdout string
		stderr []string
	}{
		{args: []string{"--help"}, code: 0, stdout: "-quic-target"},
		{args: []string{"--tcp-conns", "0"}, code: 2, stderr: []string{"--tcp-conns must be at least 1 (got 0)"}},
		{args: []string{"--queue", "0"}, code: 2, stderr: []string{"a queue of 0 bytes would drop every packet"}},
		{args: []string{"--bandwidth", "-5mbit"}, code: 2, stderr: []string{`rate "-5mbit" must not be negative`}},
		{args: []string{"--loss", "1"}, code: 2, stderr: []string{"--loss must be a probability in [0, 1)"}},
		{args: []string{"--burst-loss", "1.2,3"}, code: 2, stderr: []string{"want a probability in [0, 1)"}},
		{args: []string{"--reorder", "-0.1"}, code: 2, stderr: []string{"--reorder must be a probability in [0, 1)"}},
		{args: []string{"--wan", "netem"}, code: 2, stderr: []string{`--wan "netem": want packet or relay`}},
		{args: []string{"--wan", "relay", "--bandwidth", "20mbit"}, code: 2, stderr: []string{"--bandwidth need --wan packet"}},
		{args: []string{"--queue", "64KB"}, code: 2, stderr: []string{"--queue needs --bandwidth"}},
		{args: []string{"--quic-conns", "-1", "--streams", "0"}, code: 2,
			stderr: []string{"--quic-conns must be at least 1 (got -1)", "--streams must be at least 1 (got 0)"}},
		{args: []string{"--rtt", "ten"}, code: 2, stderr: []string{`invalid value "ten" for flag -rtt: not a duration`}},
		{args: []string{"--rtt", "-1ms"}, code: 2, stderr: []string{"--rtt must not be negative"}},
		{args: []string{"--jitter", "100ms"}, code: 2, stderr: []string{"--jitter 100ms must not exceed half the --rtt (75ms)"}},
		{args: []string{"--loss", "1"}, code: 2, stderr: []string{"--loss must be a probability in [0, 1)"}},
		{args: []string{"--from", "0", "--to", "0"}, code: 2, stderr: []string{"nothing would be offered"}},
		{args: []string{"--from", "-5"}, code: 2, stderr: []string{"--from and --to must not be negative"}},
		{args: []string{"--to", "NaN"}, code: 2, stderr: []string{`invalid value "NaN" for flag -to`}},
		{args: []string{"--duration", "0s"}, code: 2, stderr: []string{"--duration must be positive"}},
		{args: []string{"--query", " "}, code: 2, stderr: []string{"--query must not be empty"}},
		{args: []string{"--pool-size", "0"}, code: 2, stderr: []string{"--pool-size must be at least 1"}},
		{args: []string{"--calibrate", "-1"}, code: 2, stderr: []string{"--calibrate must not be negative"}},
		{args: []string{"--pipeline-depth", "-1"}, code: 2, stderr: []string{"--pipeline-depth must not be negative"}},
		{args: []string{"--quic-target", "127.0.0.1:1", "--insecure", "--pipeline-depth", "4"}, code: 2,
			stderr: []string{"--pipeline-depth sets the in-process pooler's; a target runs its own settings"}},
		{args: []string{"--pin", "abcd"}, code: 2, stderr: []string{"the in-process pooler's generated certificate is pinned automatically"}},
		{args: []string{"--quic-target", "127.0.0.1:1"}, code: 2,
			stderr: []string{"--quic-target uses TLS: verify the server's certificate with --pin SHA256, --ca FILE or --insecure"}},
		{args: []string{"--tcp-target", "127.0.0.1:1"}, code: 2, stderr: []string{"(or --tcp-tls=false for plain TCP)"}},
		{args: []string{"--tcp-target", "127.0.0.1:1", "--pin", "ab", "--insecure"}, code: 2, stderr: []string{"at most one of --pin, --ca and --insecure"}},
		{args: []string{"--tcp-target", "db.internal"}, code: 2, stderr: []string{`--tcp-target "db.internal": want HOST:PORT`}},
		{args: []string{"--quic-target", "", "--insecure"}, code: 2, stderr: []string{`--quic-target "": want HOST:PORT`}},
		{args: []string{"--tcp-target", "127.0.0.1:1", "--tcp-tls=false", "--ca", "/nonexistent/ca.pem"}, code: 2, stderr: []string{"--ca: stat /nonexistent/ca.pem"}},
		{args: []string{"--dsn", "postgres://a b"}, code: 2, stderr: []string{"--dsn: "}},
		{args: []string{"--out", ""}, code: 2, stderr: []string{"--out '' writes no directory"}},
		{args: []string{"--log-level", "loud"}, code: 2, stderr: []string{`log level "loud"`}},
		{args: []string{"extra"}, code: 2, stderr: []string{`unexpected argument "extra"`}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			start := time.Now()
			code := run(context.Background(), append([]string{"ramp"}, tt.args...), &stdout, &stderr)
			if code != tt.code {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.stdout) {
				t.Errorf("stdout lacks %q:\n%s", tt.stdout, stdout.String())
			}
			for _, want := range tt.stderr {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
				}
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("flag handling took %v: nothing should have started", el)
			}
		})
	}
}

// TestRampFlagDefaults checks that the zero-flag run is the default
// comparison, and that target mode runs only the targeted transports.
func TestRampFlagDefaults(t *testing.T) {
	rc, err := parseRampFlags(nil, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if rc.rtt != 150*time.Millisecond || rc.from != 100 || rc.to != 5000 || rc.duration != 30*time.Second ||
		rc.tcpConns != 500 || rc.quicConns != 50 || rc.streams != 40 || rc.poolSize != 20 || !rc.tcpTLS ||
		rc.query != "SELECT trunc(random() * 100) FROM generate_series(1, 10)" || rc.user != "postgres" || rc.database != "postgres" {
		t.Errorf("defaults: %+v", rc)
	}
	if got := rc.transports(); len(got) != 2 || got[0] != "tcp" || got[1] != "quic" {
		t.Errorf("transports %v, want [tcp quic]", got)
	}
	if got := rc.outDir(time.Date(2026, 12, 1, 9, 30, 5, 0, time.UTC)); got != "ramp-20261201-093005" {
		t.Errorf("default out dir %q", got)
	}
	rc, err = parseRampFlags([]string{"--quic-target", "127.0.0.1:6432", "--insecure", "--dsn", "postgres://app@db:5432/shop"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if got := rc.transports(); len(got) != 1 || got[0] != "quic" {
		t.Errorf("target transports %v, want [quic]", got)
	}
	if rc.user != "app" || rc.database != "shop" || rc.poolSize != 0 {
		t.Errorf("target mode: user %q database %q pool size %d, want app, shop and 0 (unknown)", rc.user, rc.database, rc.poolSize)
	}
}

// testRampEnv runs the WAN emulator from the test binary (TestMain calls
// wan.MainIfChild).
func testRampEnv(t *testing.T) rampEnv {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return rampEnv{wan: wan.ProcessConfig{Path: exe, Env: []string{wan.ChildEnv + "=1"}}, now: time.Now,
		packetPermitted: func() error { return errTestUnprivileged }}
}

// errTestUnprivileged stands in for a process without CAP_NET_ADMIN: the
// ramp tests run relay mode unless they ask for packet mode.
var errTestUnprivileged = errors.New("packet mode needs root or CAP_NET_ADMIN+CAP_SYS_ADMIN, which this process lacks")

// runRampTest parses args and runs the ramp with the test environment.
func runRampTest(ctx context.Context, t *testing.T, args []string, stdout, stderr *lockedBuffer) int {
	t.Helper()
	rc, err := parseRampFlags(args, stdout, stderr)
	if err != nil {
		t.Fatalf("flags %v: %v\n%s", args, err, stderr.String())
	}
	return rampMain(ctx, rc, testRampEnv(t), stdout, stderr)
}

// TestRampEndToEnd runs a short ramp with no --dsn: a throwaway
// PostgreSQL, the in-process pooler and one WAN emulator child per front,
// and checks what it wrote.
func TestRampEndToEnd(t *testing.T) {
	needPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	out := filepath.Join(t.TempDir(), "results")
	jsonFile := filepath.Join(t.TempDir(), "copy.json")
	var stdout, stderr lockedBuffer
	code := runRampTest(ctx, t, []string{"--rtt", "20ms", "--from", "20", "--to", "200", "--duration", "3s",
		"--tcp-conns", "10", "--quic-conns", "2", "--streams", "5", "--out", out, "--json", jsonFile}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	rep, err := report.ReadJSON(filepath.Join(out, "ramp.json")) // validates the accounting
	if err != nil {
		t.Fatal(err)
	}
	if _, err := report.ReadJSON(jsonFile); err != nil {
		t.Errorf("--json: %v", err)
	}
	if s := rep.Scenario; s.RTTMs != 20 || s.FromQPS != 20 || s.ToQPS != 200 || s.DurationS != 3 || s.PoolSize != 20 ||
		s.Query != "SELECT trunc(random() * 100) FROM generate_series(1, 10)" {
		t.Errorf("scenario %+v", s)
	}
	if len(rep.Runs) != 2 || rep.Runs[0].Transport != "tcp" || rep.Runs[1].Transport != "quic" {
		t.Fatalf("runs %+v, want tcp then quic", rep.Runs)
	}
	if rep.Scenario.WAN != "relay" || !strings.Contains(rep.Scenario.WANNote, "CAP_NET_ADMIN") {
		t.Errorf("wan %q note %q: want the relay fallback and why", rep.Scenario.WAN, rep.Scenario.WANNote)
	}
	for _, r := range rep.Runs {
		// (20 + 200) / 2 x 3 s, evenly spaced.
		if r.Scheduled != 330 || r.Completed+r.Errors+r.Unfinished != r.Scheduled {
			t.Errorf("%s: scheduled %d = completed %d + errors %d + unfinished %d, want 330 scheduled",
				r.Transport, r.Scheduled, r.Completed, r.Errors, r.Unfinished)
		}
		if r.Errors != 0 || r.Completed < r.Scheduled*9/10 {
			t.Errorf("%s: %d completed, %d errors (kinds %v)", r.Transport, r.Completed, r.Errors, r.ErrorKinds)
		}
		if !r.TLS || r.Sessions() != 10 {
			t.Errorf("%s: TLS %v, %d sessions, want TLS and 10", r.Transport, r.TLS, r.Sessions())
		}
		// Every query crossed the emulator: at least one round trip each.
		if r.LatencyMs.P50 < 20 {
			t.Errorf("%s: p50 %.1f ms below the emulated 20 ms round trip", r.Transport, r.LatencyMs.P50)
		}
		// 10 sessions / (20 ms + a little) is a bit under 500 q/s.
		if r.PredictedCeilingQPS < 400 || r.PredictedCeilingQPS > 500 || r.PredictedPoolCeilingQPS <= 0 {
			t.Errorf("%s: predicted %.0f q/s, pool %.0f q/s", r.Transport, r.PredictedCeilingQPS, r.PredictedPoolCeilingQPS)
		}
		if r.Emulator == nil || r.Emulator.CPUSeconds <= 0 || r.Client.CPUSeconds <= 0 || r.Client.PeakRSSBytes <= 0 {
			t.Errorf("%s: emulator %+v, client %+v", r.Transport, r.Emulator, r.Client)
		}
		if len(r.Seconds) < 3 {
			t.Errorf("%s: %d seconds, want at least 3", r.Transport, len(r.Seconds))
		}
		var offered float64
		for _, s := range r.Seconds {
			offered += s.OfferedQPS
		}
		if int64(offered) != r.Scheduled {
			t.Errorf("%s: seconds offer %v queries, scheduled %d", r.Transport, offered, r.Scheduled)
		}
		if r.Connect == nil || r.Connect.Sessions != 10 {
			t.Errorf("%s: connect %+v", r.Transport, r.Connect)
		}
	}
	html, err := os.ReadFile(filepath.Join(out, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(html), "<svg"); n < 4 {
		t.Errorf("report.html has %d charts, want at least 4", n)
	}
	for _, want := range []string{
		"tcp+tls: 10 sessions connected", "quic: 10 sessions connected", // connected before the ramp
		"tcp+tls   1s  offered", "quic      2s  offered", // progress lines
		"predicted ceiling", "measured knee", "emulator CPU", // summary
		"wrote " + filepath.Join(out, "report.html"),
		"WAN emulation: relay mode (relay mode: packet mode needs root", // the fallback, said
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
}

// TestRampUnreachableTarget: a target nobody listens on fails within
// seconds with a message naming it, and leaves no output directory.
func TestRampUnreachableTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	out := filepath.Join(t.TempDir(), "results")
	var stdout, stderr lockedBuffer
	start := time.Now()
	code := runRampTest(context.Background(), t, []string{"--tcp-target", addr, "--tcp-tls=false", "--out", out}, &stdout, &stderr)
	if el := time.Since(start); el > probeTimeout+5*time.Second {
		t.Errorf("took %v to fail", el)
	}
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	for _, want := range []string{"pgquic ramp: --tcp-target " + addr + ": cannot connect", "connection refused"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("output directory left behind (%v)", err)
	}
}

// TestRampFailingQuery: a query PostgreSQL refuses ends the ramp before
// any load, with the server's message.
func TestRampFailingQuery(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	var stdout, stderr lockedBuffer
	code := runRampTest(context.Background(), t, []string{"--dsn", cluster.SuperURL("postgres"), "--query", "SELEC 1",
		"--out", filepath.Join(t.TempDir(), "results")}, &stdout, &stderr)
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	for _, want := range []string{"the query failed (check --query)", "SQLSTATE 42601"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

// TestRampInterrupted cancels a long ramp during its first transport: it
// stops promptly, exits 130 and still writes what it measured.
func TestRampInterrupted(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	out := filepath.Join(t.TempDir(), "results")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr lockedBuffer
	code := make(chan int, 1)
	go func() {
		code <- runRampTest(ctx, t, []string{"--dsn", cluster.SuperURL("postgres"), "--rtt", "20ms", "--from", "50", "--to", "50",
			"--duration", "10m", "--tcp-conns", "5", "--quic-conns", "1", "--streams", "5", "--out", out}, &stdout, &stderr)
	}()
	waitFor(t, func() bool { return strings.Contains(stdout.String(), "tcp+tls   2s  offered") })
	cancel()
	start := time.Now()
	var got int
	select {
	case got = <-code:
	case <-time.After(testTimeout):
		t.Fatalf("the ramp did not stop after its context was canceled\n%s", stdout.String())
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("took %v to stop", el)
	}
	if got != rampInterrupted {
		t.Errorf("exit code %d, want %d\nstderr:\n%s", got, rampInterrupted, stderr.String())
	}
	rep, err := report.ReadJSON(filepath.Join(out, "ramp.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 1 || rep.Runs[0].Transport != "tcp" {
		b, _ := json.Marshal(rep.Runs)
		t.Fatalf("runs %s, want the interrupted tcp run only", b)
	}
	r := rep.Runs[0]
	if !r.Interrupted || r.Scheduled < 100 || r.Completed == 0 || len(r.Seconds) < 2 {
		t.Errorf("interrupted run: interrupted %v, scheduled %d, completed %d, %d seconds", r.Interrupted, r.Scheduled, r.Completed, len(r.Seconds))
	}
	if _, err := os.Stat(filepath.Join(out, "report.html")); err != nil {
		t.Error(err)
	}
	if !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("stderr does not say it was interrupted:\n%s", stderr.String())
	}
}

// TestRampPacketMode runs a short ramp in packet mode with 2% loss each
// way: the clients' sockets live in the emulator's namespace, TCP reports
// retransmissions and QUIC lost packets (run totals and per second), and
// nothing the run made is left in `ip netns list`.
func TestRampPacketMode(t *testing.T) {
	needPostgres(t)
	if err := wan.PacketPermitted(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI runs as root and must test packet mode: %v", err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	out := t.TempDir()
	jsonFile := filepath.Join(out, "ramp.json")
	var stdout, stderr lockedBuffer
	rc, err := parseRampFlags([]string{"--rtt", "30ms", "--from", "50", "--to", "300", "--duration", "3s", "--loss", "0.02",
		"--tcp-conns", "10", "--quic-conns", "2", "--streams", "5", "--out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	env := testRampEnv(t)
	env.packetPermitted = wan.PacketPermitted
	if code := rampMain(ctx, rc, env, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	rep, err := report.ReadJSON(jsonFile)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Scenario.WAN != "packet" || rep.Scenario.Loss != 0.02 || rep.Scenario.WANNote != "" {
		t.Errorf("scenario %+v: want packet mode at loss 0.02", rep.Scenario)
	}
	for _, r := range rep.Runs {
		p := r.Path
		if p == nil || p.SentPackets == 0 || p.EmulatorDrops == 0 || p.SRTTMs < 27 {
			t.Fatalf("%s: path %+v", r.Transport, p)
		}
		if r.Transport == "tcp" && p.Retransmits == 0 || r.Transport == "quic" && p.LostPackets == 0 {
			t.Errorf("%s: no loss recovery seen across 2%% loss: %+v", r.Transport, p)
		}
		var sent uint64
		for _, s := range r.Seconds {
			if s.Path != nil {
				sent += s.Path.SentPackets
			}
		}
		if sent == 0 || sent > p.SentPackets {
			t.Errorf("%s: per-second packets %d, run %d", r.Transport, sent, p.SentPackets)
		}
	}
	if html, err := os.ReadFile(filepath.Join(out, "report.html")); err != nil || !strings.Contains(string(html), `data-chart="path"`) ||
		!strings.Contains(string(html), "loss: predicted mean latency added") {
		t.Errorf("report.html lacks the path chart or the loss prediction (%v)", err)
	}
	for _, r := range rep.Runs {
		if r.PredictedLossInflationMs <= 0 {
			t.Errorf("%s: no predicted loss inflation", r.Transport)
		}
	}
	if !strings.Contains(stdout.String(), "clients in network namespace pgq-") || !strings.Contains(stdout.String(), "WAN emulation: packet mode") {
		t.Errorf("stdout does not name packet mode and the namespace:\n%s", stdout.String())
	}
	list, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(list), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], wan.NetnsPrefix) && !otherLiveRun(f[0]) {
			t.Errorf("left over after the ramp: %s", f[0])
		}
	}
}

// otherLiveRun reports whether a pgq- namespace belongs to a process still
// alive (another test binary running in parallel), not to this ramp.
func otherLiveRun(name string) bool {
	f := strings.Split(strings.TrimPrefix(name, wan.NetnsPrefix), "-")
	if len(f) < 1 {
		return false
	}
	_, err := os.Stat("/proc/" + f[0])
	return err == nil
}

// TestRampPacketRefused: --wan packet without the privilege, and the
// packet-only flags with relay mode, are refused before anything starts.
func TestRampPacketRefused(t *testing.T) {
	var stdout, stderr lockedBuffer
	rc, err := parseRampFlags([]string{"--wan", "packet", "--out", "", "--json", filepath.Join(t.TempDir(), "x.json")}, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if code := rampMain(context.Background(), rc, testRampEnv(t), &stdout, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "--wan packet: packet mode needs root or CAP_NET_ADMIN+CAP_SYS_ADMIN") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
	rc, err = parseRampFlags([]string{"--bandwidth", "20mbit", "--out", "", "--json", filepath.Join(t.TempDir(), "x.json")}, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	stderr = lockedBuffer{}
	if code := rampMain(context.Background(), rc, testRampEnv(t), &stdout, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "need packet mode") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}
