package wan

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestConfigErrors(t *testing.T) {
	up := "127.0.0.1:6432"
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error; empty means valid
	}{
		{"valid", Config{Upstream: up, RTT: 150 * time.Millisecond, Jitter: 10 * time.Millisecond, Loss: 0.01}, ""},
		{"zero rtt", Config{Upstream: up}, ""},
		{"negative rtt", Config{Upstream: up, RTT: -time.Millisecond}, "rtt -1ms must not be negative"},
		{"negative jitter", Config{Upstream: up, RTT: time.Second, Jitter: -1}, "jitter -1ns must not be negative"},
		{"jitter above half rtt", Config{Upstream: up, RTT: 100 * time.Millisecond, Jitter: 51 * time.Millisecond}, "must not exceed half the rtt"},
		{"loss one", Config{Upstream: up, Loss: 1}, "loss 1 must be a probability in [0, 1)"},
		{"negative loss", Config{Upstream: up, Loss: -0.1}, "loss -0.1 must be a probability"},
		{"loss NaN", Config{Upstream: up, Loss: math.NaN()}, "must be a probability"},
		{"no upstream", Config{}, "upstream address is required"},
		{"listen is upstream", Config{Listen: up, Upstream: up}, "are the same address"},
		{"any listen is loopback upstream", Config{Listen: ":6432", Upstream: up}, "are the same address"},
		{"localhost is upstream", Config{Listen: "localhost:6432", Upstream: up}, "are the same address"},
		{"other port", Config{Listen: "127.0.0.1:6433", Upstream: up}, ""},
		{"bad upstream", Config{Upstream: "nohostport"}, "upstream \"nohostport\""},
		{"small queue", Config{Upstream: up, MaxQueueBytes: 10}, "max queue bytes 10 must be at least"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
			if _, err := New(tt.cfg, nil); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
}

// TestArgsRoundTrip checks that the flags StartProcess passes to a child
// parse back into the same configuration.
func TestArgsRoundTrip(t *testing.T) {
	want := Config{Listen: "127.0.0.1:0", Upstream: "127.0.0.1:6432", RTT: 150 * time.Millisecond,
		Jitter: 3 * time.Millisecond, Loss: 0.015, UDPIdleTimeout: time.Minute, MaxQueueBytes: 1 << 20, MaxUDPFlows: 7}
	var got Config
	fs := flag.NewFlagSet("wan", flag.ContinueOnError)
	got.RegisterFlags(fs)
	if err := fs.Parse(want.Args()); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("round trip: got %+v, want %+v", got, want)
	}
}

// checkAddedRTT takes n interleaved samples of a round trip through the
// relay and of the same round trip straight to the server, and checks that
// the relay adds want ±5% (median minus median). Subtracting the direct
// round trip leaves out the endpoints' own time (quic-go's packet handling
// under -race takes a millisecond or more). A machine shared with other jobs
// delays samples at random: a second and a third attempt absorb that, while
// a relay that is off fails all three.
func checkAddedRTT(t *testing.T, what string, want time.Duration, n int, relayed, direct func() time.Duration) {
	t.Helper()
	var last string
	for attempt := 1; attempt <= 3; attempt++ {
		var rs, ds []time.Duration
		for range n {
			rs = append(rs, relayed())
			ds = append(ds, direct())
		}
		added := median(rs) - median(ds)
		last = fmt.Sprintf("%s: the relay adds %v (median %v through it, %v direct), want %v ±5%%", what, added, median(rs), median(ds), want)
		if within(added, want, 0.05) {
			t.Log(last)
			return
		}
		t.Logf("attempt %d: %s; samples through the relay %v", attempt, last, rs)
	}
	t.Fatal(last)
}

// tcpExchange returns a function that times one 64-byte request and its
// echo on c.
func tcpExchange(t *testing.T, c net.Conn) func() time.Duration {
	buf := make([]byte, 64)
	return func() time.Duration {
		start := time.Now()
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
}

// TestTCPRoundTrip times request/response exchanges on an established TCP
// connection through the relay: it adds the configured RTT within 5%.
func TestTCPRoundTrip(t *testing.T) {
	const rtt = 100 * time.Millisecond
	echo := startTCPEcho(t)
	r := startRelay(t, Config{Upstream: echo.addr(), RTT: rtt})
	var conns []net.Conn
	for _, addr := range []string{r.Addr(), echo.addr()} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	relayed, direct := tcpExchange(t, conns[0]), tcpExchange(t, conns[1])
	relayed() // pays the handshake
	checkAddedRTT(t, "TCP round trip", rtt, 15, relayed, direct)
	st := r.Stats().TCP
	// The writer counts a chunk just after writing it.
	eventually(t, 5*time.Second, "chunks of 64 bytes counted each way", func() bool {
		st = r.Stats().TCP
		return st.Up.Chunks >= 16 && st.Down.Chunks == st.Up.Chunks && st.Up.Bytes == 64*st.Up.Chunks && st.Down.Bytes == st.Up.Bytes
	})
	checkLateness(t, rtt, st.Up.Late, st.Up.Chunks, st.Down.Late, st.Down.Chunks)
}

// checkLateness checks the relay's own account of its timing error: the
// mean lateness of the two directions together stays within 5% of the RTT.
func checkLateness(t *testing.T, rtt time.Duration, up Lateness, upN uint64, down Lateness, downN uint64) {
	t.Helper()
	mean := up.Total/time.Duration(upN) + down.Total/time.Duration(downN)
	t.Logf("mean lateness per round trip %v (up max %v, down max %v)", mean, up.Max, down.Max)
	if mean < 0 || mean > rtt/20 {
		t.Errorf("mean lateness per round trip %v, want within [0, %v]", mean, rtt/20)
	}
}

// TestTCPHandshakeRTT times a new connection from dial to the echo of its
// first bytes: the relay adds the handshake's round trip plus the
// exchange's, 2·RTT.
func TestTCPHandshakeRTT(t *testing.T) {
	const rtt = 100 * time.Millisecond
	echo := startTCPEcho(t)
	r := startRelay(t, Config{Upstream: echo.addr(), RTT: rtt})
	dialExchange := func(addr string) func() time.Duration {
		return func() time.Duration {
			start := time.Now()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			buf := []byte("hello")
			if _, err := c.Write(buf); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				t.Fatal(err)
			}
			return time.Since(start)
		}
	}
	checkAddedRTT(t, "dial and first exchange", 2*rtt, 7, dialExchange(r.Addr()), dialExchange(echo.addr()))
}

// TestQUICRoundTrip times request/response exchanges on an established QUIC
// connection (quic-go on both ends, each with its own socket) through the
// relay: it adds the configured RTT within 5%.
func TestQUICRoundTrip(t *testing.T) {
	const rtt = 100 * time.Millisecond
	ctx := testCtx(t)
	srv := startQUICEcho(t)
	r := startRelay(t, Config{Upstream: srv, RTT: rtt})
	var exchanges []func() time.Duration
	for _, addr := range []string{r.Addr(), srv} {
		conn := dialQUIC(ctx, t, addr)
		s, err := conn.OpenStreamSync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			s.CancelRead(0)
			_ = s.Close()
		}()
		buf := make([]byte, 64)
		exchange := func() time.Duration {
			start := time.Now()
			if _, err := s.Write(buf); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(s, buf); err != nil {
				t.Fatal(err)
			}
			return time.Since(start)
		}
		exchange() // the server learns of the stream
		exchanges = append(exchanges, exchange)
	}
	checkAddedRTT(t, "QUIC round trip", rtt, 15, exchanges[0], exchanges[1])
	st := r.Stats().UDP
	if st.Flows != 1 || st.Up.Packets == 0 || st.Down.Packets == 0 {
		t.Fatalf("stats %+v, want one flow with packets both ways", st)
	}
	checkLateness(t, rtt, st.Up.Late, st.Up.Packets, st.Down.Late, st.Down.Packets)
}

// TestUDPLoss sends 5,000 datagrams each way through 10% loss: each
// direction loses between 8% and 12%, and every datagram is accounted for.
func TestUDPLoss(t *testing.T) {
	const n, loss = 5000, 0.1
	up, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	r := startRelay(t, Config{Upstream: up.LocalAddr().String(), RTT: 2 * time.Millisecond, Loss: loss})
	client, err := net.Dial("udp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	// Counting readers on both ends; the kernel must drop nothing, so the
	// senders go in bursts of 40 and wait for the relay to have read them.
	// The relay delivers a burst as tightly as it arrived (delays count
	// from the kernel's receive stamps), and a default 208 KiB receive
	// buffer holds about 90 small datagrams.
	var upGot, downGot int
	var flowAddr net.Addr
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := up.ReadFrom(buf)
			if err != nil {
				return
			}
			mu.Lock()
			upGot++
			flowAddr = from
			mu.Unlock()
		}
	})
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			if _, err := client.Read(buf); err != nil {
				return
			}
			mu.Lock()
			downGot++
			mu.Unlock()
		}
	})
	defer func() {
		_ = up.Close()
		_ = client.Close()
		wg.Wait()
	}()
	msg := make([]byte, 100)
	settled := func(d func(Stats) UDPDirection, sent uint64) func() bool {
		return func() bool {
			s := d(r.Stats())
			return s.Received == sent && s.Packets+s.Lost+s.QueueDrops+s.WriteErrors == sent
		}
	}
	upDir := func(s Stats) UDPDirection { return s.UDP.Up }
	downDir := func(s Stats) UDPDirection { return s.UDP.Down }
	for i := 1; i <= n; i++ {
		if _, err := client.Write(msg); err != nil {
			t.Fatal(err)
		}
		if i%40 == 0 {
			eventually(t, 10*time.Second, "the relay to forward a burst", settled(upDir, uint64(i)))
		}
	}
	eventually(t, 10*time.Second, "the upstream to read what the relay sent", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return uint64(upGot) == r.Stats().UDP.Up.Packets
	})
	mu.Lock()
	back := flowAddr
	mu.Unlock()
	for i := 1; i <= n; i++ {
		if _, err := up.WriteTo(msg, back); err != nil {
			t.Fatal(err)
		}
		if i%40 == 0 {
			eventually(t, 10*time.Second, "the relay to return a burst", settled(downDir, uint64(i)))
		}
	}
	eventually(t, 10*time.Second, "the client to read what the relay sent", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return uint64(downGot) == r.Stats().UDP.Down.Packets
	})
	st := r.Stats().UDP
	for name, d := range map[string]UDPDirection{"up": st.Up, "down": st.Down} {
		if d.QueueDrops != 0 || d.WriteErrors != 0 {
			t.Errorf("%s: drops other than loss: %+v", name, d)
		}
		rate := float64(d.Lost) / n
		if rate < 0.08 || rate > 0.12 {
			t.Errorf("%s: lost %d of %d (%.1f%%), want 8%%..12%%", name, d.Lost, n, 100*rate)
		}
		if d.Packets+d.Lost != n {
			t.Errorf("%s: delivered %d + lost %d != %d", name, d.Packets, d.Lost, n)
		}
	}
}

// TestUDPJitter sends probes 1 ms apart through RTT 100 ms ± 20 ms each way:
// round trips lie within [60, 140] ms (plus timer slack), the spread is
// actually used, and datagrams overtake each other (reordering is part of
// the UDP emulation).
func TestUDPJitter(t *testing.T) {
	const rtt, jitter, n = 100 * time.Millisecond, 20 * time.Millisecond, 200
	echo := startUDPEcho(t)
	r := startRelay(t, Config{Upstream: echo.LocalAddr().String(), RTT: rtt, Jitter: jitter})
	c, err := net.Dial("udp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sent := make([]time.Time, n)
	rtts := make([]time.Duration, 0, n)
	reordered := 0
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 16)
		last := -1
		for range n {
			if _, err := c.Read(buf); err != nil {
				done <- err
				return
			}
			i := int(binary.BigEndian.Uint32(buf))
			rtts = append(rtts, time.Since(sent[i]))
			if i < last {
				reordered++
			}
			last = max(last, i)
		}
		done <- nil
	}()
	msg := make([]byte, 16)
	for i := range n {
		binary.BigEndian.PutUint32(msg, uint32(i))
		sent[i] = time.Now()
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // pacing the probes, not waiting for a state
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The relay never delivers early, so no round trip is below the low
	// bound. A loaded machine delays a few samples, so the high bound is
	// checked on the 95th percentile: 127 ms for two uniform ±20 ms draws,
	// against 140 ms (+3 ms of timer slack) allowed.
	slices.Sort(rtts)
	lo, hi := rtt-2*jitter, rtt+2*jitter+3*time.Millisecond
	if rtts[0] < lo || rtts[n*95/100] > hi {
		t.Errorf("round trips from %v, 95th percentile %v; want within [%v, %v]", rtts[0], rtts[n*95/100], lo, hi)
	}
	// The sum of two uniform ±20 ms draws falls below -10 ms (or above
	// +10 ms) with probability 28%: the 10th percentile is below RTT-10ms
	// and the 90th above RTT+10ms.
	if p10, p90 := rtts[n/10], rtts[n*9/10]; p10 > rtt-jitter/2 || p90 < rtt+jitter/2 {
		t.Errorf("10th and 90th percentiles %v and %v: jitter not applied", p10, p90)
	}
	if reordered == 0 {
		t.Error("no datagram overtook another")
	}
}

// TestTCPOrderUnderJitter streams 2 MiB through RTT 40 ms ± 20 ms to an echo
// server: jitter delays chunks but never reorders a stream's bytes.
func TestTCPOrderUnderJitter(t *testing.T) {
	echo := startTCPEcho(t)
	r := startRelay(t, Config{Upstream: echo.addr(), RTT: 40 * time.Millisecond, Jitter: 20 * time.Millisecond})
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := make([]byte, 2<<20)
	for i := 0; i < len(want); i += 4 {
		binary.BigEndian.PutUint32(want[i:], uint32(i/4))
	}
	werr := make(chan error, 1)
	go func() {
		for off := 0; off < len(want); off += 1000 {
			if _, err := c.Write(want[off:min(off+1000, len(want))]); err != nil {
				werr <- err
				return
			}
		}
		werr <- c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Fatalf("echo differs from what was sent at byte %d (got %d bytes, want %d)", i, len(got), len(want))
	}
	if st := r.Stats().TCP; st.Up.Chunks < 10 || st.Down.Chunks < 10 {
		t.Fatalf("stats %+v: the stream crossed in too few chunks to test ordering", st)
	}
}

// TestTCPHalfClose checks that an end of stream crosses the relay after the
// data before it, and that the other direction stays open.
func TestTCPHalfClose(t *testing.T) {
	echo := startTCPEcho(t)
	r := startRelay(t, Config{Upstream: echo.addr(), RTT: 20 * time.Millisecond})
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "last words" {
		t.Fatalf("read %q, %v; want the echo then EOF", got, err)
	}
	eventually(t, 5*time.Second, "the relayed connection to end", func() bool { return r.Stats().TCP.Conns == 0 })
}

// TestTCPUpstreamRefused: a client whose upstream refuses is reset once its
// handshake would have completed, not before.
func TestTCPUpstreamRefused(t *testing.T) {
	const rtt = 60 * time.Millisecond
	r := startRelay(t, Config{Upstream: freeBoth(t), RTT: rtt})
	start := time.Now()
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Read(make([]byte, 1))
	if err == nil {
		t.Fatal("read succeeded through a relay whose upstream refuses")
	}
	if el := time.Since(start); el < rtt {
		t.Fatalf("reset after %v, before the emulated handshake (%v)", el, rtt)
	}
	if st := r.Stats().TCP; st.DialErrors != 1 {
		t.Fatalf("stats %+v, want one dial error", st)
	}
}

// TestTCPBackpressure: with a small queue bound a fast sender is slowed
// (stalls counted), nothing is dropped and every byte arrives.
func TestTCPBackpressure(t *testing.T) {
	echo := startTCPEcho(t)
	r := startRelay(t, Config{Upstream: echo.addr(), RTT: 50 * time.Millisecond, MaxQueueBytes: minQueueBytes})
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(want)
		werr <- errors.Join(err, c.(*net.TCPConn).CloseWrite())
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes back, want the %d sent", len(got), len(want))
	}
	if st := r.Stats().TCP; st.Up.Stalls == 0 {
		t.Fatalf("stats %+v: the bound never held the sender back", st)
	}
}

// TestUDPQueueBound: a burst larger than the flow's bound is cut, the excess
// counted as queue drops, and every datagram accounted for.
func TestUDPQueueBound(t *testing.T) {
	up, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	r := startRelay(t, Config{Upstream: up.LocalAddr().String(), RTT: 2 * time.Second, MaxQueueBytes: minQueueBytes})
	c, err := net.Dial("udp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n, size = 200, 1000
	msg := make([]byte, size)
	for i := 1; i <= n; i++ {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 {
			eventually(t, 10*time.Second, "the relay to read a burst", func() bool { return r.Stats().UDP.Up.Received == uint64(i) })
		}
	}
	st := r.Stats().UDP.Up
	if wantDrops := uint64(n - minQueueBytes/size); st.QueueDrops != wantDrops || st.Packets != 0 {
		t.Fatalf("stats %+v, want %d queue drops and nothing delivered yet", st, wantDrops)
	}
}

// TestUDPIdleTimeout: a mapping ends after its idle timeout, and the next
// datagram from the same client opens a new one.
func TestUDPIdleTimeout(t *testing.T) {
	echo := startUDPEcho(t)
	r := startRelay(t, Config{Upstream: echo.LocalAddr().String(), UDPIdleTimeout: 100 * time.Millisecond})
	c, err := net.Dial("udp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 8)
	for round := 1; round <= 2; round++ {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "the idle mapping to end", func() bool { return r.Stats().UDP.Flows == 0 })
		if total := r.Stats().UDP.FlowsTotal; total != uint64(round) {
			t.Fatalf("round %d: %d mappings opened", round, total)
		}
	}
}

// TestManyFlows runs 40 QUIC-like UDP clients and 40 TCP clients at once,
// each doing 10 exchanges through RTT 20 ms.
func TestManyFlows(t *testing.T) {
	const flows, rounds = 40, 10
	r := startRelay(t, Config{Upstream: startEchoBoth(t), RTT: 20 * time.Millisecond})
	ru, rt := r, r
	errs := make(chan error, 2*flows)
	var wg sync.WaitGroup
	for i := range flows {
		wg.Go(func() {
			c, err := net.Dial("udp", ru.Addr())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			msg, buf := make([]byte, 32), make([]byte, 64)
			for k := range rounds {
				binary.BigEndian.PutUint32(msg, uint32(i*rounds+k))
				if _, err := c.Write(msg); err != nil {
					errs <- err
					return
				}
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				n, err := c.Read(buf)
				if err != nil || !bytes.Equal(buf[:n], msg) {
					errs <- errors.Join(errors.New("udp echo mismatch"), err)
					return
				}
			}
		})
		wg.Go(func() {
			c, err := net.Dial("tcp", rt.Addr())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			msg, buf := make([]byte, 32), make([]byte, 32)
			for k := range rounds {
				binary.BigEndian.PutUint32(msg, uint32(i*rounds+k))
				if _, err := c.Write(msg); err != nil {
					errs <- err
					return
				}
				if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, msg) {
					errs <- errors.Join(errors.New("tcp echo mismatch"), err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A datagram is counted just after it is written, so the last echo
	// can be read before it is counted.
	udpCounted := func() bool {
		st := ru.Stats().UDP
		return st.FlowsTotal == flows && st.Up.Packets == flows*rounds && st.Down.Packets == flows*rounds
	}
	eventually(t, 5*time.Second, "every datagram counted", udpCounted)
	if st := rt.Stats().TCP; st.ConnsTotal != flows || st.Up.Bytes != flows*rounds*32 {
		t.Errorf("tcp stats %+v", st)
	}
}

// TestCloseEndsEverything closes a relay in the middle of traffic: TCP
// connections idle and with data held back, UDP flows with datagrams held
// back. Close returns with every goroutine gone, clients see their
// connections end, and cancelling Start's context works the same way.
func TestCloseEndsEverything(t *testing.T) {
	for _, how := range []string{"Close", "context"} {
		t.Run(how, func(t *testing.T) {
			echo := startTCPEcho(t)
			udpEcho := startUDPEcho(t)
			before := goleak.IgnoreCurrent()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rt, err := New(Config{Upstream: echo.addr(), RTT: time.Second}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := rt.Start(ctx); err != nil {
				t.Fatal(err)
			}
			ru, err := New(Config{Upstream: udpEcho.LocalAddr().String(), RTT: time.Second}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := ru.Start(ctx); err != nil {
				t.Fatal(err)
			}
			var conns []net.Conn
			for i := range 5 {
				c, err := net.Dial("tcp", rt.Addr())
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
				if i%2 == 0 {
					if _, err := c.Write([]byte("held back")); err != nil {
						t.Fatal(err)
					}
				}
				u, err := net.Dial("udp", ru.Addr())
				if err != nil {
					t.Fatal(err)
				}
				defer u.Close()
				if _, err := u.Write([]byte("held back")); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, 5*time.Second, "connections and flows to open", func() bool {
				return rt.Stats().TCP.Conns == 5 && ru.Stats().UDP.Flows == 5
			})
			if how == "Close" {
				_ = rt.Close()
				_ = ru.Close()
			} else {
				cancel()
				eventually(t, 5*time.Second, "connections and flows to close", func() bool {
					return rt.Stats().TCP.Conns == 0 && ru.Stats().UDP.Flows == 0
				})
				_ = rt.Close()
				_ = ru.Close()
			}
			for _, c := range conns {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if n, err := c.Read(make([]byte, 16)); err == nil || errors.Is(err, context.DeadlineExceeded) || n > 0 {
					t.Errorf("client read %d bytes, %v after Close; want the connection ended", n, err)
				}
				_ = c.Close()
			}
			if st := rt.Stats().TCP; st.Conns != 0 || st.Up.Chunks != 0 {
				t.Errorf("tcp stats after Close: %+v", st)
			}
			if st := ru.Stats().UDP; st.Flows != 0 || st.Up.Packets != 0 {
				t.Errorf("udp stats after Close: %+v", st)
			}
			goleak.VerifyNone(t, before)
		})
	}
}
