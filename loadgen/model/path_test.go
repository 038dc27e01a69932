package model

import (
	"math"
	"testing"
	"time"
)

func TestPipelinedPoolCeiling(t *testing.T) {
	if got := PipelinedPoolCeiling(20, 16, 400*time.Microsecond, 100*time.Microsecond); got != 640_000 {
		t.Errorf("got %v, want 20 x 16 / 0.5 ms", got)
	}
	if got := PipelinedPoolCeiling(20, 0, 400*time.Microsecond, 100*time.Microsecond); got != 40_000 {
		t.Errorf("depth 0: got %v, want the plain pool ceiling", got)
	}
}

func TestLossModel(t *testing.T) {
	const rtt = 150 * time.Millisecond
	if got := LossRecovery(TCPTLS, rtt); got != 350*time.Millisecond {
		t.Errorf("TCP recovery %v, want 150ms + 200ms", got)
	}
	if got := LossRecovery(QUIC, rtt); got != 168750*time.Microsecond {
		t.Errorf("QUIC recovery %v, want 9/8·150ms", got)
	}
	if h := LossHitRate(0.01, 2); math.Abs(h-0.0199) > 1e-9 {
		t.Errorf("hit rate %v", h)
	}
	if d := LossInflation(TCP, rtt, 0.01, 2); d != time.Duration(0.0199*float64(350*time.Millisecond)) {
		t.Errorf("TCP inflation %v", d)
	}
	if LossInflation(QUIC, rtt, 0, 2) != 0 {
		t.Error("inflation without loss")
	}
	// 20 Mbit/s is 2.5 MB/s: 500 bytes per query is 5,000 q/s.
	if c := BandwidthCeiling(20_000_000, 500); c != 5000 {
		t.Errorf("bandwidth ceiling %v", c)
	}
	// 64 KiB at 20 Mbit/s drains in 26.2 ms.
	if d := QueueDelayMax(20_000_000, 64<<10); d.Round(100*time.Microsecond) != 26200*time.Microsecond {
		t.Errorf("queue delay %v", d)
	}
}
