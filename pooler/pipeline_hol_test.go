package pooler_test

import (
	"testing"
	"time"
)

// Head-of-line blocking (pipeline.go): a request is written behind another
// client's only when no connection is idle, and never behind a query that
// has already run longer than the fast threshold.

// TestPipelineFreeConnectionFirst is the reported case: with a pool of
// four server connections, three free (idle, or not yet opened), B's query
// of a kind known fast (pg_sleep(0) made pg_sleep's shape fast) must not
// wait behind A's pg_sleep(3).
func TestPipelineFreeConnectionFirst(t *testing.T) {
	h, reg := pipeHarness(t, 4, time.Second)
	ctx, _ := warmClient(t, h, "SELECT pg_sleep(0), 'warm'")
	base := metricValue(t, reg, pipelinedMetric, "")
	a := startSleeper(ctx, t, h, "a", 3)
	waitRunning(ctx, t, h, "a")
	start := time.Now()
	if err := <-startSleeper(ctx, t, h, "b", 0).done; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("B took %v behind A's pg_sleep(3) with idle connections", d)
	}
	if got := metricValue(t, reg, pipelinedMetric, ""); got != base {
		t.Errorf("%v requests pipelined while connections were idle", got-base)
	}
	if err := <-a.done; err != nil {
		t.Fatal(err)
	}
}

// TestPipelineNotBehindOverrunningQuery: on the only connection, A's query
// of a kind known fast runs far longer than the threshold; B's request of the
// same kind, arriving then, is not written behind it (it waits for the
// connection). That the answer then keeps the kind slow is
// TestLatTableWorstRecent's.
func TestPipelineNotBehindOverrunningQuery(t *testing.T) {
	// A query of a fast kind counts as overrunning once it has run four
	// times the threshold (lanes.Limits.CancelHold, so that scheduling delay on
	// a busy machine is not taken for a slow query).
	const thr = 100 * time.Millisecond
	h, reg := pipeHarness(t, 1, thr)
	ctx, _ := warmClient(t, h, "SELECT pg_sleep(0), 'warm'")
	base := metricValue(t, reg, pipelinedMetric, "")
	a := startSleeper(ctx, t, h, "a", 1.5)
	waitRunning(ctx, t, h, "a")
	// The state needed is A having run past four times the threshold.
	time.Sleep(8 * thr)
	b := startSleeper(ctx, t, h, "b", 0)
	if err := <-a.done; err != nil {
		t.Fatal(err)
	}
	if err := <-b.done; err != nil {
		t.Fatal(err)
	}
	if got := metricValue(t, reg, pipelinedMetric, ""); got != base {
		t.Errorf("%v requests pipelined behind a query running past the threshold", got-base)
	}
}
