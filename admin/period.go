package admin

import (
	"sync"
	"time"
)

// DefaultStatsPeriod is PgBouncer's stats_period: SHOW STATS's avg_*
// columns average over the last completed period of this length.
const DefaultStatsPeriod = time.Minute

// dbAverages are one database's avg_* columns of SHOW STATS: counts per
// second over the period, times in microseconds per transaction, request or
// server assignment in it.
type dbAverages struct {
	assignments, xact, queries          int64
	xactMicros, queryMicros, waitMicros int64
	received, sent                      int64
	clientParses, serverParses, binds   int64
	logins                              int64
}

// statsPeriods turns SHOW STATS's cumulative totals into the averages of
// the last completed period. Periods are closed when SHOW STATS is run: the
// first call after a period has lasted at least its length computes the
// averages over it (however much longer it lasted) and starts the next one,
// so nothing runs in the background.
type statsPeriods struct {
	length time.Duration

	mu    sync.Mutex
	start time.Time           // the current period's start; zero before the first SHOW STATS
	base  map[string]dbTotals // totals at start
	avg   map[string]dbAverages
}

// averages returns the averages of the last completed period (nil before
// one has completed), after closing the current period if it is due.
func (sp *statsPeriods) averages(now time.Time, cur []dbTotals) map[string]dbAverages {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.start.IsZero() {
		sp.start, sp.base = now, index(cur)
		return nil
	}
	el := now.Sub(sp.start)
	if el < sp.length {
		return sp.avg
	}
	avg := make(map[string]dbAverages, len(cur))
	secs := el.Seconds()
	for _, t := range cur {
		b := sp.base[t.name]
		d := dbTotals{
			assignments: sub(t.assignments, b.assignments), xact: sub(t.xact, b.xact), queries: sub(t.queries, b.queries),
			xactMicros: max(t.xactMicros-b.xactMicros, 0), queryMicros: max(t.queryMicros-b.queryMicros, 0),
			waitMicros: max(t.waitMicros-b.waitMicros, 0),
		}
		rate := func(now, then uint64) int64 { return int64(float64(sub(now, then)) / secs) }
		avg[t.name] = dbAverages{
			received:     rate(t.received, b.received),
			sent:         rate(t.sent, b.sent),
			clientParses: rate(t.clientParses, b.clientParses),
			serverParses: rate(t.serverParses, b.serverParses),
			binds:        rate(t.binds, b.binds),
			logins:       rate(t.logins, b.logins),
			assignments:  int64(float64(d.assignments) / secs),
			xact:         int64(float64(d.xact) / secs),
			queries:      int64(float64(d.queries) / secs),
			xactMicros:   per(d.xactMicros, d.xact),
			queryMicros:  per(d.queryMicros, d.queries),
			waitMicros:   per(d.waitMicros, d.assignments),
		}
	}
	sp.start, sp.base, sp.avg = now, index(cur), avg
	return avg
}

// sub is a-b, or 0 when a pool closed in between took counts with it.
func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// per is total/n, 0 when n is 0.
func per(total int64, n uint64) int64 {
	if n == 0 {
		return 0
	}
	return total / int64(n)
}

func index(ts []dbTotals) map[string]dbTotals {
	m := make(map[string]dbTotals, len(ts))
	for _, t := range ts {
		m[t.name] = t
	}
	return m
}
