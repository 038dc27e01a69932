package admin

import (
	"testing"
	"time"
)

// TestStatsPeriods: the avg_* columns are the last completed period's
// averages, computed when SHOW STATS runs after the period is due, and kept
// until the next one completes.
func TestStatsPeriods(t *testing.T) {
	sp := &statsPeriods{length: time.Minute}
	t0 := time.Unix(1000, 0)
	at := func(xact, queries, assign uint64, xactUs, queryUs, waitUs int64) []dbTotals {
		return []dbTotals{{name: "app", xact: xact, queries: queries, assignments: assign,
			xactMicros: xactUs, queryMicros: queryUs, waitMicros: waitUs}}
	}
	if avg := sp.averages(t0, at(100, 200, 100, 0, 0, 0)); avg != nil {
		t.Fatalf("averages before a period completed: %v", avg)
	}
	if avg := sp.averages(t0.Add(30*time.Second), at(400, 700, 400, 0, 0, 0)); avg != nil {
		t.Fatalf("averages half-way through the first period: %v", avg)
	}
	// 60 s later: 1,200 transactions, 2,400 requests, 1,200 assignments
	// more, taking 2.4 s, 3.6 s and 0.12 s.
	got := sp.averages(t0.Add(time.Minute), at(1300, 2600, 1300, 2_400_000, 3_600_000, 120_000))["app"]
	want := dbAverages{assignments: 20, xact: 20, queries: 40, xactMicros: 2000, queryMicros: 1500, waitMicros: 100}
	if got != want {
		t.Fatalf("averages of the first period = %+v, want %+v", got, want)
	}
	// Kept through the next period; a pool closed meanwhile (totals going
	// down) gives 0, not a negative rate.
	if got := sp.averages(t0.Add(90*time.Second), at(1, 1, 1, 0, 0, 0))["app"]; got != want {
		t.Fatalf("averages during the second period = %+v, want the first's %+v", got, want)
	}
	if got := sp.averages(t0.Add(2*time.Minute), at(1, 1, 1, 0, 0, 0))["app"]; got != (dbAverages{}) {
		t.Fatalf("averages after totals went down = %+v, want zeros", got)
	}
}
