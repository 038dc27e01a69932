package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestCeilingCommand runs the ceiling subcommand as a user would and checks
// its answers, its exit codes and that each error names the flag at fault.
func TestCeilingCommand(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string // substrings expected on stdout, runs of spaces as one
		stderr []string // substrings expected on stderr
	}{
		{name: "issue example", args: []string{"--conns", "10", "--rtt", "30ms"},
			stdout: []string{"client ceiling q/s 333 333 333", "connect: round trips", "file descriptors"}},
		{name: "target", args: []string{"--conns", "10", "--rtt", "30ms", "--target-qps", "1000"},
			stdout: []string{"for 1,000 q/s", "connections needed", "10 x 3 streams"}},
		{name: "QUIC streams and pool", args: []string{"--conns", "50", "--streams", "40", "--rtt", "150ms", "--exec", "400us", "--overhead", "100us"},
			stdout: []string{"2000 (50x40)", "13,289", "pool ceiling: 40,000 q/s"}},
		{name: "help", args: []string{"--help"}, stdout: []string{"Little's law", "-target-qps", "-streams"}},
		{name: "no flags", args: nil, code: 2, stderr: []string{"--conns is required", "--rtt is required"}},
		{name: "zero RTT", args: []string{"--conns", "10", "--rtt", "0s"}, code: 2, stderr: []string{"--rtt must be positive"}},
		{name: "negative RTT", args: []string{"--conns", "10", "--rtt", "-30ms"}, code: 2, stderr: []string{"--rtt must be positive"}},
		{name: "RTT without unit", args: []string{"--conns", "10", "--rtt", "30"}, code: 2,
			stderr: []string{`invalid value "30" for flag -rtt`, "with a unit, such as 30ms"}},
		{name: "zero conns", args: []string{"--conns", "0", "--rtt", "30ms"}, code: 2, stderr: []string{"--conns must be at least 1"}},
		{name: "conns not a number", args: []string{"--conns", "ten", "--rtt", "30ms"}, code: 2, stderr: []string{`invalid value "ten" for flag -conns`}},
		{name: "negative streams", args: []string{"--conns", "1", "--streams", "-2", "--rtt", "30ms"}, code: 2, stderr: []string{"--streams must be at least 1"}},
		{name: "negative exec", args: []string{"--conns", "1", "--rtt", "30ms", "--exec", "-1ms"}, code: 2, stderr: []string{"--exec must not be negative"}},
		{name: "negative overhead", args: []string{"--conns", "1", "--rtt", "30ms", "--overhead", "-1ms"}, code: 2, stderr: []string{"--overhead must not be negative"}},
		{name: "negative target", args: []string{"--conns", "1", "--rtt", "30ms", "--target-qps", "-5"}, code: 2, stderr: []string{"--target-qps must not be negative"}},
		{name: "NaN target", args: []string{"--conns", "1", "--rtt", "30ms", "--target-qps", "NaN"}, code: 2, stderr: []string{"not a number of queries per second"}},
		{name: "negative pool", args: []string{"--conns", "1", "--rtt", "30ms", "--pool-size", "-1"}, code: 2, stderr: []string{"--pool-size must not be negative"}},
		{name: "unknown auth", args: []string{"--conns", "1", "--rtt", "30ms", "--auth", "gss"}, code: 2, stderr: []string{`--auth "gss"`}},
		{name: "unknown flag", args: []string{"--conns", "1", "--rtt", "30ms", "--nope"}, code: 2, stderr: []string{"flag provided but not defined: -nope"}},
		{name: "extra argument", args: []string{"--conns", "1", "--rtt", "30ms", "extra"}, code: 2, stderr: []string{`unexpected argument "extra"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"ceiling"}, tt.args...), &stdout, &stderr)
			if code != tt.code {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			squeezed := strings.Join(strings.Fields(stdout.String()), " ")
			for _, s := range tt.stdout {
				if !strings.Contains(squeezed, s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr lacks %q:\n%s", s, stderr.String())
				}
			}
			if tt.code == 2 && stdout.Len() > 0 {
				t.Errorf("an error printed to stdout:\n%s", stdout.String())
			}
		})
	}
}

func TestCeilingJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"ceiling", "--conns", "10", "--rtt", "30ms", "--target-qps", "1000", "--json"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	var out struct {
		Transports []struct {
			Transport  string  `json:"transport"`
			CeilingQPS float64 `json:"ceiling_qps"`
			Need       struct {
				Conns          int `json:"conns"`
				StreamsPerConn int `json:"streams_per_conn"`
			} `json:"need"`
		} `json:"transports"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, stdout.String())
	}
	if len(out.Transports) != 3 {
		t.Fatalf("%d transports:\n%s", len(out.Transports), stdout.String())
	}
	for _, tr := range out.Transports {
		if int(tr.CeilingQPS) != 333 {
			t.Errorf("%s ceiling %v, want 333.3", tr.Transport, tr.CeilingQPS)
		}
	}
	if n := out.Transports[0].Need; n.Conns != 30 {
		t.Errorf("tcp needs %d connections, want 30", n.Conns)
	}
	if n := out.Transports[2].Need; n.Conns != 10 || n.StreamsPerConn != 3 {
		t.Errorf("quic needs %dx%d, want 10x3", n.Conns, n.StreamsPerConn)
	}
}
