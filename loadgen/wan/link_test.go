package wan

import (
	"container/heap"
	"encoding/binary"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// feedLink offers n numbered packets, 100 µs apart in emulated time, and
// returns the numbers in the order they were scheduled for delivery.
func feedLink(t *testing.T, cfg Config, n int) (*link, []uint32) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var trace []time.Duration
	if cfg.UplinkTrace != "" {
		var err error
		if trace, err = LoadTrace(cfg.UplinkTrace); err != nil {
			t.Fatal(err)
		}
	}
	l := newLink(cfg.withDefaults(), 7, trace, nil)
	now := time.Unix(1000, 0)
	for i := range n {
		b := l.buf()[:100]
		binary.BigEndian.PutUint32(b, uint32(i))
		l.enqueue(b, now.Add(time.Duration(i)*100*time.Microsecond))
	}
	var order []uint32
	for len(l.due) > 0 {
		d := popDue(l)
		order = append(order, binary.BigEndian.Uint32(d.p))
	}
	return l, order
}

func popDue(l *link) duePacket {
	l.mu.Lock()
	defer l.mu.Unlock()
	return heap.Pop(&l.due).(duePacket)
}

// TestLinkBurstLoss: the Gilbert-Elliott chain loses the configured
// long-run fraction in bursts of the configured mean length.
func TestLinkBurstLoss(t *testing.T) {
	const n = 100_000
	l, order := feedLink(t, Config{Packet: true, Upstream: "127.0.0.1:1", RTT: 10 * time.Millisecond, BurstLoss: 0.03, BurstLen: 4}, n)
	lost := n - len(order)
	if frac := float64(lost) / n; math.Abs(frac-0.03) > 0.006 {
		t.Errorf("lost %.4f of packets, want 0.03 ± 0.006", frac)
	}
	bursts := 0
	prev := int64(-1)
	for _, k := range order {
		if int64(k) != prev+1 {
			bursts++
		}
		prev = int64(k)
	}
	if mean := float64(lost) / float64(bursts); math.Abs(mean-4) > 0.6 {
		t.Errorf("mean burst %.2f packets (%d lost in %d bursts), want 4 ± 0.6", mean, lost, bursts)
	}
	if st := l.stats(); st.BurstLost != uint64(lost) || st.Received != n {
		t.Errorf("stats %+v, want %d burst losses of %d", st, lost, n)
	}
}

// TestLinkJitterKeepsOrder: jitter alone never reorders; Reorder does, at
// about its rate.
func TestLinkJitterKeepsOrder(t *testing.T) {
	const n = 20_000
	cfg := Config{Packet: true, Upstream: "127.0.0.1:1", RTT: 100 * time.Millisecond, Jitter: 20 * time.Millisecond}
	_, order := feedLink(t, cfg, n)
	for i, k := range order {
		if int(k) != i {
			t.Fatalf("jitter reordered: position %d holds packet %d", i, k)
		}
	}
	cfg.Reorder = 0.05
	l, order := feedLink(t, cfg, n)
	late := 0
	for i := 1; i < len(order); i++ {
		if order[i] < order[i-1] {
			late++
		}
	}
	st := l.stats()
	if frac := float64(st.Reordered) / n; math.Abs(frac-0.05) > 0.01 || late == 0 {
		t.Errorf("reordered %d (%.3f), overtaken %d: want about 5%%", st.Reordered, frac, late)
	}
}

// TestLinkRandomLoss: random loss lands near its probability and every
// packet is accounted for.
func TestLinkRandomLoss(t *testing.T) {
	const n = 50_000
	l, order := feedLink(t, Config{Packet: true, Upstream: "127.0.0.1:1", Loss: 0.01}, n)
	st := l.stats()
	if frac := float64(st.Lost) / n; math.Abs(frac-0.01) > 0.003 {
		t.Errorf("lost %.4f, want 0.01", frac)
	}
	if uint64(len(order))+st.Lost != n {
		t.Errorf("%d scheduled + %d lost != %d", len(order), st.Lost, n)
	}
}

// TestPacketConfigErrors: bad packet-mode settings are refused with
// messages naming them.
func TestPacketConfigErrors(t *testing.T) {
	base := Config{Packet: true, Upstream: "127.0.0.1:1"}
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Bandwidth = -1 }, "bandwidth -1 bit/s must not be negative"},
		{func(c *Config) { c.Loss = 1 }, "loss 1 must be a probability in [0, 1)"},
		{func(c *Config) { c.Loss = -0.1 }, "loss -0.1 must be a probability"},
		{func(c *Config) { c.BurstLoss = 1.5 }, "burst loss 1.5 must be a probability"},
		{func(c *Config) { c.BurstLoss, c.BurstLen = 0.01, 0.5 }, "burst length 0.5 must be at least 1"},
		{func(c *Config) { c.Reorder = -1 }, "reorder -1 must be a probability"},
		{func(c *Config) { c.Queue = 1000 }, "a queue needs a rate limit"},
		{func(c *Config) { c.Bandwidth, c.Queue = 1e6, 100 }, "must hold at least one full-size packet"},
		{func(c *Config) { c.Packet, c.Bandwidth = false, 1e6 }, "need packet mode"},
	} {
		c := base
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", c, err, tc.want)
		}
	}
	var q int
	if err := (BytesFlag{&q}).Set("0"); err == nil || !strings.Contains(err.Error(), "drop every packet") {
		t.Errorf("--queue 0: %v", err)
	}
	for in, want := range map[string]int64{"20mbit": 20e6, "500kbit": 5e5, "1gbit": 1e9, "1000": 1000, "20Mbit/s": 20e6} {
		if got, err := ParseRate(in); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := ParseRate("-5mbit"); err == nil {
		t.Error("a negative rate was accepted")
	}
	for in, want := range map[string]int{"64KB": 65536, "64k": 65536, "1500": 1500, "1MB": 1 << 20} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, _, err := ParseBurst("0.02,0"); err == nil {
		t.Error("--burst-loss 0.02,0 was accepted")
	}
}

// TestLinkTrace: a Mahimahi trace's opportunities carry one packet each, in
// order, repeating with the last line as the period; opportunities passed
// while the link was idle are lost, and a queue beyond Queue drops.
func TestLinkTrace(t *testing.T) {
	path := t.TempDir() + "/trace"
	if err := os.WriteFile(path, []byte("1\n1\n3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Packet: true, Upstream: "127.0.0.1:1", UplinkTrace: path, Queue: 1500 * 5}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	trace, err := LoadTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	l := newLink(cfg.withDefaults(), 1, trace, nil)
	t0 := time.Unix(1000, 0)
	for range 6 { // the queue holds 5 of them
		l.enqueue(l.buf()[:1500], t0)
	}
	l.enqueue(l.buf()[:100], t0.Add(20*time.Millisecond)) // after idle opportunities
	var got []time.Duration
	for len(l.due) > 0 {
		got = append(got, popDue(l).at.Sub(t0))
	}
	ms := time.Millisecond
	want := []time.Duration{1 * ms, 1 * ms, 3 * ms, 4 * ms, 4 * ms, 21 * ms}
	if !slices.Equal(got, want) {
		t.Errorf("deliveries at %v, want %v", got, want)
	}
	if st := l.stats(); st.QueueDrops != 1 {
		t.Errorf("queue drops %d, want 1 (the sixth packet)", st.QueueDrops)
	}
	for _, bad := range []string{"", "0\n", "5\n3\n", "x\n"} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadTrace(path); err == nil {
			t.Errorf("trace %q accepted", bad)
		}
	}
	if err := (Config{Upstream: "127.0.0.1:1", UplinkTrace: path}).Validate(); err == nil || !strings.Contains(err.Error(), "need packet mode") {
		t.Errorf("a trace in relay mode: %v", err)
	}
}
