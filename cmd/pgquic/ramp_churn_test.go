package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgquic/pgquic/loadgen/report"
	"github.com/pgquic/pgquic/loadgen/wan"
)

// TestRampChurnFlags checks the --session-per-query defaults and what it
// refuses.
func TestRampChurnFlags(t *testing.T) {
	rc, err := parseRampFlags([]string{"--session-per-query"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if rc.from != 10 || rc.to != 200 || rc.duration != 20*time.Second || rc.tcpConns != 100 || rc.quicConns != 1 ||
		rc.streams != 100 || rc.rtt != 150*time.Millisecond {
		t.Errorf("churn defaults: %+v", rc)
	}
	runs := rc.runs()
	if len(runs) != 3 || runs[0].churn != "tcp" || runs[1].churn != "tcp+tls" || runs[2].churn != "edge-local" {
		t.Errorf("runs %+v, want tcp, tcp+tls, edge-local", runs)
	}
	rc, err = parseRampFlags([]string{"--session-per-query", "--to", "50", "--tcp-conns", "7"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil || rc.to != 50 || rc.tcpConns != 7 || rc.from != 10 {
		t.Errorf("explicit flags win: %+v, %v", rc, err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--session-per-query", "--tcp-target", "127.0.0.1:1", "--tcp-tls=false"}, "--session-per-query runs against the in-process pooler"},
		{[]string{"--session-per-query", "--tcp-tls=false"}, "drop --tcp-tls"},
	} {
		var stderr bytes.Buffer
		if _, err := parseRampFlags(tt.args, &bytes.Buffer{}, &stderr); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: %v, want %q", tt.args, err, tt.want)
		}
	}
}

// TestRampSessionPerQuery runs a small churn ramp in relay mode at a 100 ms
// round trip: every query accounted for, one new session per query, the
// connect times reported, every session closed at the pooler, and the
// model's round trips visible in the latencies: about 1 RTT through the
// edge with local startup, about 3 over plain TCP, at least 5 with TLS. A
// round trip this long keeps a noisy machine's CPU waits (TLS handshakes
// under -race while other tests run) well inside the bounds.
func TestRampSessionPerQuery(t *testing.T) {
	needPostgres(t)
	testRampSessionPerQuery(t, testRampEnv(t), "relay")
}

// TestRampSessionPerQueryPacket is the same in packet mode (root): the TCP
// connections and the edge's UDP socket live in the emulator's client
// namespace, and every path reports its smoothed RTT.
func TestRampSessionPerQueryPacket(t *testing.T) {
	needPostgres(t)
	if err := wan.PacketPermitted(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI runs as root and must test packet mode: %v", err)
		}
		t.Skip(err)
	}
	env := testRampEnv(t)
	env.packetPermitted = wan.PacketPermitted
	rep := testRampSessionPerQuery(t, env, "packet")
	for _, r := range rep.Runs {
		if r.Path == nil || r.Path.SentPackets == 0 || r.Path.SRTTMs < 95 {
			t.Errorf("%s: path %+v, want packets sent and a smoothed RTT near 100 ms", r.SessionPath, r.Path)
		}
	}
}

// testRampSessionPerQuery runs the churn ramp in the given WAN mode and
// checks what every mode must show.
func testRampSessionPerQuery(t *testing.T, env rampEnv, mode string) *report.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	out := filepath.Join(t.TempDir(), "results")
	var stdout, stderr lockedBuffer
	rc, err := parseRampFlags([]string{"--session-per-query", "--wan", mode, "--rtt", "100ms", "--from", "10", "--to", "30",
		"--duration", "2s", "--tcp-conns", "20", "--streams", "20", "--calibrate", "20", "--out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	code := rampMain(ctx, rc, env, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	rep, err := report.ReadJSON(filepath.Join(out, "ramp.json")) // validates the accounting
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 3 {
		t.Fatalf("%d runs, want tcp, tcp+tls and edge-local", len(rep.Runs))
	}
	const rtt = 100.0
	for i, want := range []struct {
		path      string
		transport string
		tls       bool
		k         int
		hi        float64 // the median's upper bound in round trips
	}{
		{"tcp", "tcp", false, 3, 3.9},        // not 4
		{"tcp+tls", "tcp", true, 5, 8},       // TLS handshakes cost CPU a busy machine may lack
		{"edge-local", "quic", true, 1, 1.9}, // not 2, as without local startup
	} {
		r := rep.Runs[i]
		if r.SessionPath != want.path || r.Transport != want.transport || r.TLS != want.tls || r.ModelRoundTrips != want.k {
			t.Errorf("run %d: path %q transport %q TLS %v k %d, want %+v", i, r.SessionPath, r.Transport, r.TLS, r.ModelRoundTrips, want)
		}
		// (10 + 30) / 2 x 2 s, evenly spaced.
		if r.Scheduled != 40 || r.Completed+r.Errors+r.Unfinished != r.Scheduled {
			t.Errorf("%s: scheduled %d = completed %d + errors %d + unfinished %d, want 40 scheduled",
				r.SessionPath, r.Scheduled, r.Completed, r.Errors, r.Unfinished)
		}
		if r.Errors != 0 || r.Completed < r.Scheduled*9/10 {
			t.Errorf("%s: %d completed, %d errors (kinds %v)", r.SessionPath, r.Completed, r.Errors, r.ErrorKinds)
		}
		// One new session per query that started: all but at most the
		// unfinished ones that never got one.
		if r.NewSessions == nil || *r.NewSessions < r.Completed+r.Errors || *r.NewSessions > r.Scheduled {
			t.Errorf("%s: new_sessions %v, want completed + errors (%d) to scheduled (%d)", r.SessionPath, r.NewSessions, r.Completed+r.Errors, r.Scheduled)
		}
		if r.ConnectMs == nil || r.ConnectMs.P50 <= 0 || r.ConnectMs.P99 < r.ConnectMs.P50 {
			t.Errorf("%s: connect_ms %+v", r.SessionPath, r.ConnectMs)
		}
		if r.PoolerClientsAfter == nil || *r.PoolerClientsAfter != 0 {
			t.Errorf("%s: the pooler holds %v client sessions after the run, want 0", r.SessionPath, r.PoolerClientsAfter)
		}
		if r.PredictedLatencyMs < float64(want.k)*rtt || r.PredictedCeilingQPS <= 0 {
			t.Errorf("%s: predicted latency %.1f ms, ceiling %.0f q/s", r.SessionPath, r.PredictedLatencyMs, r.PredictedCeilingQPS)
		}
		// The median is k round trips plus a little: generous bounds for a
		// noisy machine, still telling 1 from 2 and 3 from 4. The relay
		// delays every hop, so nothing is faster than k round trips.
		lo, hi := float64(want.k)*rtt*0.95, want.hi*rtt
		if p50 := r.LatencyMs.P50; p50 < lo || p50 > hi {
			t.Errorf("%s: median latency %.1f ms, want about %d RTT (%.0f to %.0f ms)", r.SessionPath, p50, want.k, lo, hi)
		}
	}
	// The TCP paths wait for their session before the query; the edge
	// answers the startup at once.
	if tcp, edge := rep.Runs[0].ConnectMs, rep.Runs[2].ConnectMs; tcp != nil && edge != nil && (tcp.P50 < 2*rtt*0.9 || edge.P50 > rtt/2) {
		t.Errorf("connect p50: tcp %.1f ms (want about 2 RTT), edge-local %.1f ms (want well under 1 RTT)", tcp.P50, edge.P50)
	}
	for _, want := range []string{"k = 3", "k = 5", "k = 1", "new sessions", "connect p50 / p99 (model)",
		"edge-local   1s  offered", "wrote " + filepath.Join(out, "report.html")} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	html, err := os.ReadFile(filepath.Join(out, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"EDGE-LOCAL", "new sessions", "connect p50 / p99"} {
		if !strings.Contains(string(html), want) {
			t.Errorf("report.html lacks %q", want)
		}
	}
	if rep.Scenario.WAN != mode {
		t.Errorf("WAN mode %q, want %q", rep.Scenario.WAN, mode)
	}
	return rep
}
