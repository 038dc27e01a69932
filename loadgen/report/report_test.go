package report

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// contractKeys lists, per JSON object, the keys the ramp report contract
// promises. Users script against these names, so they must never change.
var contractKeys = map[string][]string{
	"report":     {"scenario", "runs"},
	"scenario":   {"rtt_ms", "jitter_ms", "from_qps", "to_qps", "duration_s", "query", "pool_size"},
	"run":        {"transport", "conns", "streams_per_conn", "tls", "predicted_ceiling_qps", "knee_qps", "scheduled", "completed", "errors", "unfinished", "peak_qps", "latency_ms", "client", "seconds"},
	"latency_ms": {"p50", "p90", "p99", "max", "mean"},
	"client":     {"peak_rss_bytes", "cpu_seconds", "fds"},
	"second":     {"t", "offered_qps", "completed_qps", "in_flight", "backlog", "p50_ms", "p99_ms", "max_ms"},
	// Not in the minimal contract but always present: a run whose generator
	// fell behind must say so even when the answer is false.
	"run extras": {"generator_lag_ms", "generator_fell_behind"},
}

// TestContractKeys encodes a report whose fields are all zero and checks
// that every key of the contract is present, so an omitempty or a renamed
// tag cannot drop one.
func TestContractKeys(t *testing.T) {
	r := Report{Runs: []Run{{Transport: TransportTCP, Seconds: []Second{{}}}}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	run := top["runs"].([]any)[0].(map[string]any)
	objects := map[string]map[string]any{
		"report":     top,
		"scenario":   top["scenario"].(map[string]any),
		"run":        run,
		"run extras": run,
		"latency_ms": run["latency_ms"].(map[string]any),
		"client":     run["client"].(map[string]any),
		"second":     run["seconds"].([]any)[0].(map[string]any),
	}
	for name, keys := range contractKeys {
		for _, k := range keys {
			if _, ok := objects[name][k]; !ok {
				t.Errorf("%s lacks key %q: %s", name, k, b)
			}
		}
	}
}

// TestChurnContractKeys: a session-per-query run writes new_sessions and
// connect_ms (p50, p99) even when they are zero; other runs leave them out.
func TestChurnContractKeys(t *testing.T) {
	var zero int64
	for _, tt := range []struct {
		run   Run
		churn bool
	}{
		{Run{Transport: TransportTCP, NewSessions: &zero, ConnectMs: &ConnectLatency{}}, true},
		{Run{Transport: TransportTCP}, false},
	} {
		b, err := json.Marshal(tt.run)
		if err != nil {
			t.Fatal(err)
		}
		var run map[string]any
		if err := json.Unmarshal(b, &run); err != nil {
			t.Fatal(err)
		}
		_, hasNew := run["new_sessions"]
		c, hasConnect := run["connect_ms"].(map[string]any)
		if hasNew != tt.churn || hasConnect != tt.churn {
			t.Errorf("churn %v: %s", tt.churn, b)
		}
		if tt.churn {
			if _, ok := c["p50"]; !ok {
				t.Errorf("connect_ms lacks p50: %s", b)
			}
			if _, ok := c["p99"]; !ok {
				t.Errorf("connect_ms lacks p99: %s", b)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	ok := func() Run {
		return Run{Transport: TransportQUIC, Scheduled: 10, Completed: 7, Errors: 1, Unfinished: 2}
	}
	tests := []struct {
		name string
		edit func(*Run)
		want []string // substrings of the error; none means valid
	}{
		{name: "balanced", edit: func(*Run) {}},
		{name: "empty run", edit: func(r *Run) { *r = Run{Transport: TransportTCP} }},
		{name: "one query vanished", edit: func(r *Run) { r.Completed = 6 },
			want: []string{"scheduled 10 != completed 6 + errors 1 + unfinished 2 (= 9)"}},
		{name: "one query counted twice", edit: func(r *Run) { r.Unfinished = 3 },
			want: []string{"(= 11)"}},
		{name: "negative", edit: func(r *Run) { r.Errors = -1; r.Completed = 9 },
			want: []string{"negative count"}},
		{name: "unknown transport", edit: func(r *Run) { r.Transport = "udp" },
			want: []string{`transport "udp"`}},
		{name: "two problems", edit: func(r *Run) { r.Transport = ""; r.Scheduled = 0 },
			want: []string{`transport ""`, "scheduled 0 !="}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := ok()
			tt.edit(&run)
			r := &Report{Runs: []Run{ok(), run}}
			err := r.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate = %v, want an error wrapping ErrInvalid", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), "run 1") {
				t.Errorf("error %q does not name the run", err)
			}
		})
	}
}

func TestWriteReadJSON(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ramp.json")
	want := Synthetic()
	if err := want.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	got, err := ReadJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	wb, _ := json.Marshal(want)
	gb, _ := json.Marshal(got)
	if string(wb) != string(gb) {
		t.Errorf("round trip changed the report:\nwrote %s\nread  %s", wb, gb)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only ramp.json (no temporary file left)", len(entries))
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("ramp.json mode %v (%v), want 0644", fi.Mode(), err)
	}
}

func TestWriteJSONRefusesUnbalancedReport(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ramp.json")
	r := Synthetic()
	r.Runs[0].Completed--
	if err := r.WriteJSON(path); !errors.Is(err, ErrInvalid) {
		t.Fatalf("WriteJSON = %v, want ErrInvalid", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an invalid report was written (stat: %v)", err)
	}
}

func TestReadJSON(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A report from a newer version with a field this one does not know
	// still loads.
	p := write("newer.json", `{"scenario":{"rtt_ms":150,"future":1},"runs":[{"transport":"tcp","scheduled":3,"completed":2,"errors":0,"unfinished":1,"new_field":true}]}`)
	r, err := ReadJSON(p)
	if err != nil {
		t.Fatalf("ReadJSON: %v", err)
	}
	if r.Scenario.RTTMs != 150 || r.Runs[0].Unfinished != 1 {
		t.Errorf("ReadJSON = %+v", r)
	}

	p = write("unbalanced.json", `{"runs":[{"transport":"tcp","scheduled":3,"completed":1}]}`)
	if _, err := ReadJSON(p); !errors.Is(err, ErrInvalid) {
		t.Errorf("ReadJSON(unbalanced) = %v, want ErrInvalid", err)
	}
	p = write("garbage.json", `{"runs":`)
	if _, err := ReadJSON(p); err == nil || errors.Is(err, ErrInvalid) {
		t.Errorf("ReadJSON(garbage) = %v, want a decode error", err)
	}
	if _, err := ReadJSON(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadJSON(missing) = %v, want os.ErrNotExist", err)
	}
}

func TestSyntheticIsValid(t *testing.T) {
	r := Synthetic()
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	var transports []string
	for _, run := range r.Runs {
		transports = append(transports, run.Transport)
		if len(run.Seconds) != int(r.Scenario.DurationS) {
			t.Errorf("%s: %d seconds, want %v", run.Transport, len(run.Seconds), r.Scenario.DurationS)
		}
	}
	if !slices.Equal(transports, []string{TransportTCP, TransportQUIC}) {
		t.Errorf("transports %v", transports)
	}
}
