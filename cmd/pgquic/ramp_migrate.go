package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgquic/pgquic/loadgen"
	"github.com/pgquic/pgquic/loadgen/report"
)

// durationList is a comma-separated list of durations, as --migrate-at
// takes it.
type durationList []time.Duration

// String returns the list as the flag spells it.
func (l *durationList) String() string {
	var parts []string
	for _, d := range *l {
		parts = append(parts, d.String())
	}
	return strings.Join(parts, ",")
}

// Set parses a comma-separated list of durations, in increasing order.
func (l *durationList) Set(v string) error {
	var out durationList
	for _, p := range strings.Split(v, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(p))
		if err != nil {
			return err
		}
		out = append(out, d)
	}
	if !slices.IsSorted(out) {
		return fmt.Errorf("%q: give the times in increasing order", v)
	}
	*l = out
	return nil
}

// validateMigrateAt checks --migrate-at against the run's duration.
func (rc *rampConfig) validateMigrateAt(bad func(string, ...any)) {
	for _, d := range rc.migrateAt {
		if d <= 0 || (rc.duration > 0 && d >= rc.duration) {
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
// move (TCP, or no --migrate-at).
func startMigrator(ctx context.Context, at []time.Duration, tr loadgen.Transport, clients *loadgen.Clients, out io.Writer, label string) *migrator {
	if len(at) == 0 || tr != loadgen.QUIC {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &migrator{start: time.Now(), stop: cancel}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for _, d := range at {
			t := time.NewTimer(time.Until(m.start.Add(d)))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			began := time.Now()
			err := clients.Migrate(ctx)
			ev := report.Migration{AtS: began.Sub(m.start).Seconds(), TookMs: msOf(time.Since(began))}
			note := "every connection moved"
			if err != nil {
				ev.Error, note = err.Error(), "not every connection moved: "+err.Error()
			}
			fmt.Fprintf(out, "%s: %.1fs  moved the QUIC connections to a new local address in %.1f ms; %s\n", label, ev.AtS, ev.TookMs, note)
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
	s := fmt.Sprintf("%s: moved to a new local address at %.1fs (%.1f ms); worst latency that second and the next %.1f ms (run p50 %.1f ms)",
		label, m.AtS, m.TookMs, m.MaxMsAround, p50)
	if m.Error != "" {
		s += "; not every connection moved: " + m.Error
	}
	return s
}
