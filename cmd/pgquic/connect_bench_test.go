package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/loadgen/wan"
)

// TestConnectBenchFlags: malformed flags exit 2 naming the problem, before
// anything starts.
func TestConnectBenchFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--paths", "tcp,carrier-pigeon"}, `unknown path "carrier-pigeon"`},
		{[]string{"--n", "0"}, "--n at least 1"},
		{[]string{"--rtt", "0s"}, "--rtt must be positive"},
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{"--wan", "carrier-pigeon"}, `--wan "carrier-pigeon": want relay or packet`},
		{[]string{"--client", "true", "--client-n", "0"}, "--client-n must be at least 1"},
	} {
		var stdout, stderr strings.Builder
		if code := runConnectBench(context.Background(), tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("connect-bench %v: exit %d, stderr %q, want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// runConnectBenchJSON runs connect-bench with args and --json, and
// returns the report and what it printed.
func runConnectBenchJSON(t *testing.T, args ...string) (*connectReport, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "connect.json")
	var stdout, stderr strings.Builder
	if code := runConnectBench(context.Background(), append(args, "--json", out), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep connectReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return &rep, stdout.String()
}

// TestConnectBench runs every path at a 20 ms round trip, three sessions
// each: the JSON names each path with its model, every session crossed at
// least the model's round trips, and local startup beats the edge's
// ordinary path, which beats a fresh QUIC connection, which a new process
// resuming with its session cache file beats too.
func TestConnectBench(t *testing.T) {
	if _, err := pgtest.Binaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	page := filepath.Join(t.TempDir(), "connect.html")
	rep, stdout := runConnectBenchJSON(t, "--rtt", "20ms", "--n", "3", "--html", page)
	if rep.RTTMS != 20 || rep.N != 3 || rep.WAN != "relay" || len(rep.Paths) != len(connectPaths) {
		t.Fatalf("report %+v", rep)
	}
	med := map[string]float64{}
	for i, p := range rep.Paths {
		if p.Path != connectPaths[i].name || p.ModelRoundTrips != connectPaths[i].rtts || p.ModelMS != 20*float64(p.ModelRoundTrips) || len(p.SamplesMS) != 3 {
			t.Errorf("path %d: %+v", i, p)
		}
		for _, s := range p.SamplesMS {
			if s < p.ModelMS {
				t.Errorf("%s: a session took %.1f ms, less than the model's %.0f ms of round trips", p.Path, s, p.ModelMS)
			}
		}
		if p.P99MS < p.MedianMS {
			t.Errorf("%s: p99 %.1f below the median %.1f", p.Path, p.P99MS, p.MedianMS)
		}
		med[p.Path] = p.MedianMS
		if !strings.Contains(stdout, p.Path) {
			t.Errorf("the table lacks %s:\n%s", p.Path, stdout)
		}
	}
	html, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	// One page, no fetches: a median and a p99 bar per path.
	if p := string(html); !strings.Contains(p, "<svg") || strings.Count(p, "<rect") != 2*len(connectPaths) ||
		!strings.Contains(p, "edge-local") || strings.Contains(p, "src=") || strings.Contains(p, "<link") {
		t.Errorf("the page lacks its chart or fetches something:\n%s", p)
	}
	if !(med["edge-local"] < med["edge"] && med["edge"] < med["quic"]) {
		t.Errorf("medians %v: want edge-local < edge < quic", med)
	}
	// A new process with the cache file saves the startup round trip.
	if !(med["quic-resumed"] < med["quic"]) {
		t.Errorf("medians %v: want quic-resumed < quic", med)
	}
}

// TestConnectBenchClient runs psql through the timing proxy on the paths
// that carry plaintext TCP, across the packet-mode WAN at 20 ms when this
// process may create network namespaces (the relay otherwise): every
// path reports the command, the wire time is at least the model's round
// trips and within the command's wall time, and without the WAN the wire
// time is under one round trip.
func TestConnectBenchClient(t *testing.T) {
	if _, err := pgtest.Binaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("no psql:", err)
	}
	mode := wan.ModePacket
	if err := wan.PacketPermitted(); err != nil {
		t.Logf("relay mode: %v", err)
		mode = wan.ModeRelay
	}
	rep, stdout := runConnectBenchJSON(t, "--rtt", "20ms", "--n", "2", "--wan", mode, "--paths", "tcp,tcp+tls,edge,edge-local",
		"--client", psql+" -Atc 'select 1'", "--client-n", "2")
	if rep.WAN != mode || len(rep.Paths) != 4 {
		t.Fatalf("report %+v", rep)
	}
	for _, p := range rep.Paths {
		c := p.Client
		if p.Path == "tcp+tls" {
			if c != nil {
				t.Errorf("tcp+tls ran the client: %+v", c)
			}
			continue
		}
		if c == nil || !strings.Contains(c.Command, "select 1") || len(c.WireMS) != 2 || len(c.NoWANWallMS) != 2 {
			t.Fatalf("%s: client %+v", p.Path, c)
		}
		for i, w := range c.WireMS {
			if w < p.ModelMS || w > c.WallMS[i] {
				t.Errorf("%s: wire %.1f ms, wall %.1f ms, model %.0f ms", p.Path, w, c.WallMS[i], p.ModelMS)
			}
		}
		if c.NoWANWireMedianMS >= 20 {
			t.Errorf("%s: %.1f ms to the first row without the WAN", p.Path, c.NoWANWireMedianMS)
		}
	}
	if !strings.Contains(stdout, "first byte to first DataRow") {
		t.Errorf("no client table:\n%s", stdout)
	}
}

// TestReplyScanner: the first DataRow is found however the replies are
// cut, after an SSLRequest's 'N'; after 'S' (TLS) nothing is.
func TestReplyScanner(t *testing.T) {
	frame := func(typ byte, body string) string {
		return string([]byte{typ, 0, 0, 0, byte(4 + len(body))}) + body
	}
	// 'D' inside a body must not count; 'Z' carries 'I'.
	greeting := frame('R', "\x00\x00\x00\x00") + frame('S', "DateStyle\x00ISO\x00") + frame('Z', "I") + frame('T', "DDDD")
	replies := greeting + frame('D', "\x00\x01\x00\x00\x00\x011") + frame('C', "SELECT 1\x00")
	at := len(greeting)
	for _, tc := range []struct {
		name, in string
		skip     bool
		want     int // offset of the DataRow's type byte, -1 for none
	}{
		{"plain", replies, false, at},
		{"after N", "N" + replies, true, at + 1},
		{"after S", "S" + replies, true, -1},
		{"no rows", greeting + frame('C', "SELECT 0\x00"), false, -1},
	} {
		for _, chunk := range []int{1, 3, 7, len(tc.in)} {
			sc := replyScanner{skipOne: tc.skip}
			got := -1
			for i := 0; i < len(tc.in); i += chunk {
				end := min(i+chunk, len(tc.in))
				if sc.scan([]byte(tc.in[i:end])) {
					got = end - 1 // the chunk ends at or after the type byte
					if chunk == 1 {
						got = i
					}
					break
				}
			}
			if (tc.want < 0) != (got < 0) || (chunk == 1 && got != tc.want) || (got >= 0 && got < tc.want) {
				t.Errorf("%s, chunks of %d: found at %d, want %d", tc.name, chunk, got, tc.want)
			}
		}
	}
}
