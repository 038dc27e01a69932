package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	} {
		var stdout, stderr strings.Builder
		if code := runConnectBench(context.Background(), tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("connect-bench %v: exit %d, stderr %q, want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

// TestConnectBench runs every path at a 20 ms round trip, three sessions
// each: the JSON names each path with its model, every session crossed at
// least the model's round trips, and local startup beats the edge's
// ordinary path, which beats a fresh QUIC connection.
func TestConnectBench(t *testing.T) {
	needPostgres(t)
	out := filepath.Join(t.TempDir(), "connect.json")
	page := filepath.Join(t.TempDir(), "connect.html")
	var stdout, stderr strings.Builder
	if code := runConnectBench(context.Background(), []string{"--rtt", "20ms", "--n", "3", "--json", out, "--html", page}, &stdout, &stderr); code != 0 {
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
		if !strings.Contains(stdout.String(), p.Path) {
			t.Errorf("the table lacks %s:\n%s", p.Path, stdout.String())
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
}
