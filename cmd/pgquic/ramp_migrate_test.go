package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/loadgen/report"
)

// TestRampMigrateFlags: --migrate-at times must be inside the run, in
// order, and need a QUIC run.
func TestRampMigrateFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--migrate-at", "0s"}, "each time must be inside the run"},
		{[]string{"--duration", "10s", "--migrate-at", "5s,10s"}, "each time must be inside the run"},
		{[]string{"--migrate-at", "2s,1s"}, "increasing order"},
		{[]string{"--migrate-at", "soon"}, "invalid"},
		{[]string{"--migrate-at", "1s:teleport"}, "move or rebind"},
		{[]string{"--tcp-target", "127.0.0.1:1", "--tcp-tls=false", "--migrate-at", "1s"}, "no QUIC run"},
	} {
		var stdout, stderr lockedBuffer
		if _, err := parseRampFlags(tc.args, &stdout, &stderr); err == nil ||
			!strings.Contains(err.Error()+stderr.String(), tc.want) {
			t.Errorf("%v: error %v (stderr %q), want %q", tc.args, err, stderr.String(), tc.want)
		}
	}
	var stdout, stderr lockedBuffer
	rc, err := parseRampFlags([]string{"--duration", "30s", "--migrate-at", "10s, 20s:rebind,25s:move"}, &stdout, &stderr)
	if err != nil || len(rc.migrateAt) != 3 || rc.migrateAt.String() != "10s,20s:rebind,25s" || !rc.migrateAt.rebinds() {
		t.Fatalf("--migrate-at 10s,20s:rebind,25s:move: %v %v", rc, err)
	}
}

// TestRampMigrate: a constant-rate run whose QUIC clients' addresses
// change twice, a NAT rebinding (a NAT in front of the pooler gives every
// flow a new port) and a deliberate move to a new local address: no query
// fails, no session reconnects, and the report lists both changes with the
// latency around them; the TCP run has none.
func TestRampMigrate(t *testing.T) {
	if _, err := pgtest.Binaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI: %v", err)
		}
		t.Skipf("PostgreSQL not installed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	jsonFile := filepath.Join(t.TempDir(), "ramp.json")
	var stdout, stderr lockedBuffer
	code := runRampTest(ctx, t, []string{"--rtt", "20ms", "--from", "60", "--to", "60", "--duration", "4s",
		"--migrate-at", "1s:rebind,2500ms", "--tcp-conns", "4", "--quic-conns", "2", "--streams", "4",
		"--calibrate", "0", "--out", "", "--json", jsonFile}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	rep, err := report.ReadJSON(jsonFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Runs {
		if r.Errors != 0 || r.Reconnects != 0 || r.Unfinished != 0 {
			t.Errorf("%s: %d errors (%v), %d reconnects, %d unfinished", r.Transport, r.Errors, r.ErrorKinds, r.Reconnects, r.Unfinished)
		}
		switch r.Transport {
		case "tcp":
			if len(r.Migrations) != 0 {
				t.Errorf("tcp: migrations %+v", r.Migrations)
			}
		case "quic":
			if len(r.Migrations) != 2 {
				t.Fatalf("quic: migrations %+v, want 2", r.Migrations)
			}
			for i, m := range r.Migrations {
				// A move takes a round trip, a rebinding none.
				if m.Error != "" || m.Kind != []string{"rebind", "move"}[i] || (m.Kind == "move" && m.TookMs < 20) ||
					m.MaxMsAround < 20 || m.AtS < []float64{1, 2.5}[i] {
					t.Errorf("quic: move %d %+v", i, m)
				}
			}
		}
	}
	for _, want := range []string{"the NAT rebound every flow", "moved the QUIC connections to a new local address",
		"note: quic: NAT rebinding at 1.0s", "note: quic: moved to a new local address at 2.5s"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
}
