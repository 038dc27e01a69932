package quictest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// SteadyLoad runs "select <n>" every period on each of a set of sessions
// until Stop, recording each query's start and latency and every error:
// the constant-rate load under which migration tests change the client's
// address.
type SteadyLoad struct {
	mu      sync.Mutex
	starts  []time.Time
	lat     []time.Duration
	errs    []error
	queries int

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// StartSteadyLoad starts one query loop per session.
func StartSteadyLoad(ctx context.Context, sessions []*pgconn.PgConn, period time.Duration) *SteadyLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &SteadyLoad{cancel: cancel}
	for i, c := range sessions {
		l.wg.Go(func() {
			tick := time.NewTicker(period)
			defer tick.Stop()
			for n := i; ; n += len(sessions) {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				start := time.Now()
				qctx, qcancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := QueryInt(qctx, c, n)
				qcancel()
				l.mu.Lock()
				l.starts, l.lat = append(l.starts, start), append(l.lat, time.Since(start))
				if err != nil {
					l.errs = append(l.errs, err)
				}
				l.queries++
				l.mu.Unlock()
			}
		})
	}
	return l
}

// Stop ends the load and waits for the queries in flight.
func (l *SteadyLoad) Stop() {
	l.cancel()
	l.wg.Wait()
}

// Queries returns the queries completed so far and the errors among them.
func (l *SteadyLoad) Queries() (int, []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.queries, slices.Clone(l.errs)
}

// LogChanges logs, for the rebinding at rebindAt and the move at moveAt,
// the worst latency of the second after each beside the median, with the
// query and error counts: the blip a migration test reports.
func (l *SteadyLoad) LogChanges(t testing.TB, rebindAt, moveAt time.Time) {
	t.Helper()
	queries, errs := l.Queries()
	for _, ev := range []struct {
		name string
		at   time.Time
	}{{"NAT rebinding", rebindAt}, {"move to another local address", moveAt}} {
		median, worst := l.Blip(ev.at)
		t.Logf("%s: worst latency in the second after it %v (median of the run %v); %d queries, %d failed",
			ev.name, worst.Round(time.Microsecond), median.Round(time.Microsecond), queries, len(errs))
	}
}

// Blip returns the median latency of the whole load and the worst latency
// of the queries started within a second after at (from 50 ms before it).
func (l *SteadyLoad) Blip(at time.Time) (median, worst time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lat) == 0 {
		return 0, 0
	}
	median = slices.Sorted(slices.Values(l.lat))[len(l.lat)/2]
	for i, s := range l.starts {
		if !s.Before(at.Add(-50*time.Millisecond)) && s.Before(at.Add(time.Second)) {
			worst = max(worst, l.lat[i])
		}
	}
	return median, worst
}

// AwaitQueries waits until the load completed n more queries.
func (l *SteadyLoad) AwaitQueries(t testing.TB, n int) {
	t.Helper()
	done, _ := l.Queries()
	want := done + n
	Eventually(t, 30*time.Second, "queries going on", func() bool {
		got, _ := l.Queries()
		return got >= want
	})
}
