package lanes

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestLatencyWorstRecent: a kind of query is fast only while its worst
// recent answer is; one slow answer (pg_sleep(3) after many pg_sleep(0),
// one fingerprint) makes it slow at once, and only a long run of fast
// answers makes it fast again.
func TestLatencyWorstRecent(t *testing.T) {
	var lt Latency
	const fp, thr = 42, 5 * time.Millisecond
	for range latMinSamples - 1 {
		lt.Observe(fp, time.Millisecond)
	}
	if lt.Fast(fp, thr) {
		t.Fatal("fast before enough answers")
	}
	lt.Observe(fp, time.Millisecond)
	if !lt.Fast(fp, thr) {
		t.Fatal("not fast after enough fast answers")
	}
	lt.Observe(fp, 3*time.Second)
	if lt.Fast(fp, thr) {
		t.Fatal("still fast after a 3 s answer")
	}
	n := 0
	for !lt.Fast(fp, thr) {
		lt.Observe(fp, time.Millisecond)
		n++
	}
	if n < 15 {
		t.Errorf("fast again after %d fast answers, want a couple of dozen", n)
	}
}

// TestCancelHold: a cancel for a request with others behind it waits four
// times the fast threshold, never less than 20 ms nor more than 1 s.
func TestCancelHold(t *testing.T) {
	for fast, want := range map[time.Duration]time.Duration{
		time.Millisecond:       20 * time.Millisecond,
		10 * time.Millisecond:  40 * time.Millisecond,
		time.Second:            time.Second,
		0:                      20 * time.Millisecond,
		100 * time.Millisecond: 400 * time.Millisecond,
	} {
		if got := (Limits{Fast: fast}).CancelHold(); got != want {
			t.Errorf("CancelHold with Fast %v = %v, want %v", fast, got, want)
		}
	}
}

// TestRiderReset: a rider's memory is reused for each request, keeping
// its turn channel and dropping a signal the last request did not wait
// for, so a stale signal cannot start the next request's turn early.
func TestRiderReset(t *testing.T) {
	var rd Rider
	rd.Reset(1, true)
	own := rd.own
	own <- struct{}{}
	rd.myTurn, rd.joined = true, true
	if r := rd.Reset(2, false); r != &rd || rd.own != own || rd.fp != 2 || rd.fast || rd.MyTurn() || rd.Joined() {
		t.Fatalf("after Reset: %+v", rd)
	}
	select {
	case <-own:
		t.Error("a stale turn signal survived Reset")
	default:
	}
}
