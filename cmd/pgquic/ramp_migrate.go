package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgquic/pgquic/internal/udplb"
	"github.com/pgquic/pgquic/loadgen"
	"github.com/pgquic/pgquic/loadgen/report"
)

// The kinds of address change --migrate-at makes.
const (
	// migrateMove is a deliberate move: Dialer.Migrate to a new local
	// port, validated before the connections switch.
	migrateMove = "move"
	// migrateRebind is a NAT rebinding: a NAT between the emulator and
	// the pooler gives every flow a new source port; the clients know
	// nothing of it.
	migrateRebind = "rebind"
)

// migrateEvent is one --migrate-at entry.
type migrateEvent struct {
	at   time.Duration
	kind string
}

// migrateList is a comma-separated list of T or T:KIND (KIND move, the
// default, or rebind), as --migrate-at takes it.
type migrateList []migrateEvent

// String returns the list as the flag spells it.
func (l *migrateList) String() string {
	var parts []string
	for _, e := range *l {
		p := e.at.String()
		if e.kind != migrateMove {
			p += ":" + e.kind
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ",")
}

// Set parses the list; the times must increase.
func (l *migrateList) Set(v string) error {
	var out migrateList
	for _, p := range strings.Split(v, ",") {
		at, kind, _ := strings.Cut(strings.TrimSpace(p), ":")
		d, err := time.ParseDuration(at)
		if err != nil {
			return err
		}
		switch kind {
		case "", migrateMove:
			kind = migrateMove
		case migrateRebind:
		default:
			return fmt.Errorf("%q: the kind of change is move or rebind", p)
		}
		out = append(out, migrateEvent{d, kind})
	}
	if !slices.IsSortedFunc(out, func(a, b migrateEvent) int { return cmp.Compare(a.at, b.at) }) {
		return fmt.Errorf("%q: give the times in increasing order", v)
	}
	*l = out
	return nil
}

// rebinds reports whether the list has a rebinding, which puts a NAT in
// front of the pooler.
func (l migrateList) rebinds() bool {
	return slices.ContainsFunc(l, func(e migrateEvent) bool { return e.kind == migrateRebind })
}

// validateMigrateAt checks --migrate-at against the run's duration.
func (rc *rampConfig) validateMigrateAt(bad func(string, ...any)) {
	for _, e := range rc.migrateAt {
		if d := e.at; d <= 0 || (rc.duration > 0 && d >= rc.duration) {
			bad("--migrate-at %v: each time must be inside the run (0 < t < --duration %v)", d, rc.duration)
		}
	}
	if len(rc.migrateAt) > 0 && !slices.Contains(rc.transports(), loadgen.QUIC) {
		bad("--migrate-at moves QUIC connections; no QUIC run is measured")
	}
}

// migrator moves a run's QUIC connections to a new local address at each
// of the --migrate-at times after the run started.
type migrator struct {
	start  time.Time
	stop   context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	events []report.Migration
}

// startMigrator starts the timers; it returns nil when there is nothing to
// move (TCP, or no --migrate-at). nat is the NAT in front of the pooler for
// the rebindings (nil when the list has none).
func startMigrator(ctx context.Context, at migrateList, tr loadgen.Transport, clients *loadgen.Clients, nat *udplb.LB, out io.Writer, label string) *migrator {
	if len(at) == 0 || tr != loadgen.QUIC {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &migrator{start: time.Now(), stop: cancel}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for _, e := range at {
			t := time.NewTimer(time.Until(m.start.Add(e.at)))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			began := time.Now()
			what, note := "moved the QUIC connections to a new local address", "every connection moved"
			var err error
			if e.kind == migrateRebind {
				var n int
				n, err = nat.Rebind()
				what, note = "the NAT rebound every flow", fmt.Sprintf("%d flows now reach the pooler from new ports", n)
			} else {
				err = clients.Migrate(ctx)
			}
			ev := report.Migration{AtS: began.Sub(m.start).Seconds(), TookMs: msOf(time.Since(began)), Kind: e.kind}
			if err != nil {
				ev.Error, note = err.Error(), "failed: "+err.Error()
			}
			fmt.Fprintf(out, "%s: %.1fs  %s in %.1f ms; %s\n", label, ev.AtS, what, ev.TookMs, note)
			m.mu.Lock()
			m.events = append(m.events, ev)
			m.mu.Unlock()
		}
	}()
	return m
}

// finish stops the timers and returns the moves made, each with the
// largest max_ms of its second and the next (the blip).
func (m *migrator) finish(seconds []report.Second) []report.Migration {
	if m == nil {
		return nil
	}
	m.stop()
	m.wg.Wait()
	for i := range m.events {
		k := int(m.events[i].AtS)
		for j := k; j <= k+1 && j < len(seconds); j++ {
			m.events[i].MaxMsAround = max(m.events[i].MaxMsAround, seconds[j].MaxMs)
		}
	}
	return m.events
}

// migrationNote is the summary's line about one move.
func migrationNote(label string, m report.Migration, p50 float64) string {
	what := "moved to a new local address"
	if m.Kind == migrateRebind {
		what = "NAT rebinding"
	}
	s := fmt.Sprintf("%s: %s at %.1fs (%.1f ms); worst latency that second and the next %.1f ms (run p50 %.1f ms)",
		label, what, m.AtS, m.TookMs, m.MaxMsAround, p50)
	if m.Error != "" {
		s += "; failed: " + m.Error
	}
	return s
}
