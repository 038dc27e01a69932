package wan

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"strconv"
	"time"
)

// Defaults of the Config fields whose zero value means "use the default".
const (
	// DefaultListen binds loopback on a port the kernel picks; Relay.Addr
	// tells which.
	DefaultListen = "127.0.0.1:0"
	// DefaultUDPIdleTimeout is longer than QUIC's 30 s idle timeout, so a
	// mapping outlives any connection quic-go would still consider open.
	DefaultUDPIdleTimeout = 2 * time.Minute
	// DefaultMaxQueueBytes bounds the bytes held back per TCP direction and
	// per UDP flow: 8 MiB over a 75 ms one-way delay is about 110 MB/s.
	DefaultMaxQueueBytes = 8 << 20
	// DefaultMaxUDPFlows bounds the client source addresses mapped at once;
	// each mapping holds a socket and a 64 KiB read buffer.
	DefaultMaxUDPFlows = 1024
)

// minQueueBytes keeps the queue bound above the largest chunk or datagram
// the relay reads at once, so one read always fits an empty queue.
const minQueueBytes = 2 * maxRead

// Config describes one relay. The zero value of each optional field selects
// the default documented on it.
type Config struct {
	// Listen is the address clients connect to, for TCP and UDP alike (the
	// same port for both). Default DefaultListen.
	Listen string
	// Upstream is the address the relay forwards to (TCP and UDP, same
	// port), such as a pooler whose TCP and QUIC fronts share a port.
	// Required.
	Upstream string
	// RTT is the round trip the relay adds: each direction delays data by
	// RTT/2. Zero relays without delay.
	RTT time.Duration
	// Jitter spreads each one-way delay uniformly over
	// [RTT/2-Jitter, RTT/2+Jitter], as netem's "delay T J" does. It must not
	// exceed RTT/2. UDP datagrams may overtake each other; TCP bytes never do
	// (see README). Zero means a constant delay.
	Jitter time.Duration
	// Loss is the probability in [0, 1) that a UDP datagram (relay mode)
	// or any IP packet (packet mode) is dropped, drawn independently for
	// each in each direction. The relay never drops TCP. Zero means no loss.
	Loss float64
	// UDPIdleTimeout ends a UDP mapping (and its upstream socket) after no
	// datagram in either direction for this long. Default
	// DefaultUDPIdleTimeout.
	UDPIdleTimeout time.Duration
	// MaxQueueBytes bounds the data held back per TCP direction (the reader
	// then stops reading, so TCP flow control pushes back on the sender) and
	// per UDP flow (further datagrams are dropped and counted). Default
	// DefaultMaxQueueBytes.
	MaxQueueBytes int
	// MaxUDPFlows bounds the UDP mappings open at once; datagrams from further
	// sources are dropped and counted. Default DefaultMaxUDPFlows.
	MaxUDPFlows int

	// Packet selects packet mode (ModePacket): IP packets cross TUN devices
	// between two network namespaces the emulator creates, so Loss, the
	// burst loss, Reorder and the rate limit apply to TCP and UDP alike.
	// False is relay mode (ModeRelay), the default. Packet mode needs root
	// or CAP_NET_ADMIN+CAP_SYS_ADMIN (PacketPermitted).
	Packet bool
	// BurstLoss is the long-run fraction in [0, 1) of packets a
	// Gilbert-Elliott chain drops, in bursts of BurstLen packets on average
	// (packet mode only). Zero means none.
	BurstLoss float64
	// BurstLen is the mean length of a loss burst in packets, at least 1.
	// Default 1 when BurstLoss is set.
	BurstLen float64
	// Reorder is the probability in [0, 1) that a packet is held back by
	// ReorderDelay beyond its delivery time, so packets sent after it
	// overtake it (packet mode only). Jitter alone never reorders in packet
	// mode. Zero means none.
	Reorder float64
	// ReorderDelay is how long a reordered packet is held back. Default
	// DefaultReorderDelay.
	ReorderDelay time.Duration
	// Bandwidth is the rate limit in bits per second of each direction's
	// bottleneck (packet mode only); packets wait in a drop-tail queue of
	// Queue bytes while the link is busy. Zero means no limit.
	Bandwidth int64
	// Queue bounds the bytes waiting for the bottleneck per direction;
	// arrivals that do not fit are dropped. Only with Bandwidth or a trace.
	// Default one bandwidth-delay product at RTT, at least DefaultMinQueue
	// (with a trace: DefaultTraceQueue).
	Queue int
	// UplinkTrace and DownlinkTrace name Mahimahi link traces (mm-link's
	// format: one line per delivery opportunity, its time in milliseconds,
	// repeating with the last line's time as the period; each opportunity
	// carries one packet) for the client-to-server and server-to-client
	// bottlenecks (packet mode only). A trace replaces Bandwidth in its
	// direction. Empty means none.
	UplinkTrace, DownlinkTrace string
}

// The two emulation modes, as outputs name them.
const (
	// ModeRelay is the user-space relay of TCP streams and UDP datagrams.
	ModeRelay = "relay"
	// ModePacket is the TUN emulator between network namespaces.
	ModePacket = "packet"
)

// Mode names the mode c runs in.
func (c Config) Mode() string {
	if c.Packet {
		return ModePacket
	}
	return ModeRelay
}

// Defaults of the packet mode's fields.
const (
	// DefaultReorderDelay holds a reordered packet back by 10 ms: long
	// enough that at the ramp's rates several later packets overtake it.
	DefaultReorderDelay = 10 * time.Millisecond
	// DefaultMinQueue is the smallest default bottleneck queue: a few
	// full-size packets, so a slow link still takes a burst.
	DefaultMinQueue = 16 << 10
	// DefaultTraceQueue is the bottleneck queue with a link trace and no
	// --queue: 64 KiB, whatever rate the trace averages.
	DefaultTraceQueue = 64 << 10
)

// DefaultQueue is the bottleneck queue used when none is given: one
// bandwidth-delay product at rtt, at least DefaultMinQueue.
func DefaultQueue(bitsPerSecond int64, rtt time.Duration) int {
	return max(int(float64(bitsPerSecond)/8*rtt.Seconds()), DefaultMinQueue)
}

// withDefaults returns c with its zero-valued optional fields filled in.
func (c Config) withDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.UDPIdleTimeout == 0 {
		c.UDPIdleTimeout = DefaultUDPIdleTimeout
	}
	if c.MaxQueueBytes == 0 {
		c.MaxQueueBytes = DefaultMaxQueueBytes
	}
	if c.MaxUDPFlows == 0 {
		c.MaxUDPFlows = DefaultMaxUDPFlows
	}
	if c.BurstLoss > 0 && c.BurstLen == 0 {
		c.BurstLen = 1
	}
	if c.Reorder > 0 && c.ReorderDelay == 0 {
		c.ReorderDelay = DefaultReorderDelay
	}
	if c.Bandwidth > 0 && c.Queue == 0 {
		c.Queue = DefaultQueue(c.Bandwidth, c.RTT)
	}
	if c.Queue == 0 && (c.UplinkTrace != "" || c.DownlinkTrace != "") {
		c.Queue = DefaultTraceQueue
	}
	return c
}

// Validate reports every setting that cannot work, joined in one error, so a
// user fixes a command line in one go. It checks c as New would use it,
// defaults filled in.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.RTT < 0 {
		errs = append(errs, fmt.Errorf("rtt %v must not be negative", c.RTT))
	}
	if c.Jitter < 0 {
		errs = append(errs, fmt.Errorf("jitter %v must not be negative", c.Jitter))
	} else if c.RTT >= 0 && c.Jitter > c.RTT/2 {
		errs = append(errs, fmt.Errorf("jitter %v must not exceed half the rtt (%v): a one-way delay of RTT/2±jitter cannot be negative", c.Jitter, c.RTT/2))
	}
	if math.IsNaN(c.Loss) || c.Loss < 0 || c.Loss >= 1 {
		errs = append(errs, fmt.Errorf("loss %v must be a probability in [0, 1), e.g. 0.01 for 1%%", c.Loss))
	}
	if c.UDPIdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("udp idle timeout %v must not be negative", c.UDPIdleTimeout))
	}
	if c.MaxQueueBytes < minQueueBytes {
		errs = append(errs, fmt.Errorf("max queue bytes %d must be at least %d", c.MaxQueueBytes, minQueueBytes))
	}
	if c.MaxUDPFlows < 0 {
		errs = append(errs, fmt.Errorf("max udp flows %d must not be negative", c.MaxUDPFlows))
	}
	prob := func(name string, p float64) {
		if math.IsNaN(p) || p < 0 || p >= 1 {
			errs = append(errs, fmt.Errorf("%s %v must be a probability in [0, 1), e.g. 0.01 for 1%%", name, p))
		}
	}
	prob("burst loss", c.BurstLoss)
	prob("reorder", c.Reorder)
	if math.IsNaN(c.BurstLen) || c.BurstLen < 0 || (c.BurstLoss > 0 && c.BurstLen < 1) {
		errs = append(errs, fmt.Errorf("burst length %v must be at least 1 packet", c.BurstLen))
	}
	if c.ReorderDelay < 0 {
		errs = append(errs, fmt.Errorf("reorder delay %v must not be negative", c.ReorderDelay))
	}
	if c.Bandwidth < 0 {
		errs = append(errs, fmt.Errorf("bandwidth %d bit/s must not be negative", c.Bandwidth))
	}
	switch {
	case c.Queue < 0:
		errs = append(errs, fmt.Errorf("queue %d bytes must not be negative", c.Queue))
	case c.Queue > 0 && c.Bandwidth == 0 && c.UplinkTrace == "" && c.DownlinkTrace == "":
		errs = append(errs, errors.New("a queue needs a rate limit: without --bandwidth no queue forms"))
	case c.Queue > 0 && c.Queue < maxPacket:
		errs = append(errs, fmt.Errorf("queue %d bytes must hold at least one full-size packet (%d bytes)", c.Queue, maxPacket))
	}
	for _, tr := range []struct{ flag, path string }{{"uplink-trace", c.UplinkTrace}, {"downlink-trace", c.DownlinkTrace}} {
		if tr.path != "" {
			if _, err := LoadTrace(tr.path); err != nil {
				errs = append(errs, fmt.Errorf("--%s: %w", tr.flag, err))
			}
		}
	}
	if !c.Packet && (c.BurstLoss > 0 || c.Reorder > 0 || c.Bandwidth > 0 || c.UplinkTrace != "" || c.DownlinkTrace != "") {
		errs = append(errs, errors.New("burst loss, reordering and a rate limit need packet mode (--netns, or the ramp's --wan packet): the relay carries TCP as a byte stream"))
	}
	if c.Upstream == "" {
		errs = append(errs, errors.New("upstream address is required"))
	} else if c.Packet {
		if _, err := net.ResolveTCPAddr("tcp", c.Upstream); err != nil {
			errs = append(errs, fmt.Errorf("upstream %q: %w", c.Upstream, err))
		}
	} else if err := checkNotLoop(c.Listen, c.Upstream); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkNotLoop refuses a listen address that is the upstream itself: the
// relay would forward to itself forever.
func checkNotLoop(listen, upstream string) error {
	up, err := net.ResolveTCPAddr("tcp", upstream)
	if err != nil {
		return fmt.Errorf("upstream %q: %w", upstream, err)
	}
	ln, err := net.ResolveTCPAddr("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen %q: %w", listen, err)
	}
	if ln.Port == 0 || ln.Port != up.Port {
		return nil
	}
	anyLocal := func(ip net.IP) bool { return ip == nil || ip.IsUnspecified() }
	if ln.IP.Equal(up.IP) || anyLocal(ln.IP) && (anyLocal(up.IP) || up.IP.IsLoopback()) {
		return fmt.Errorf("listen %q and upstream %q are the same address: the relay would forward to itself", listen, upstream)
	}
	return nil
}

// RegisterFlags binds c's fields to the flags of `pgquic wan` on fs, with the
// current values of c as the defaults. Args is its inverse.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "`address` clients connect to, TCP and UDP on the same port (required)")
	fs.StringVar(&c.Upstream, "upstream", c.Upstream, "`address` to relay to, TCP and UDP on the same port (required)")
	fs.DurationVar(&c.RTT, "rtt", c.RTT, "round-trip `duration` added: each direction waits half of it (required; 0 relays without delay)")
	fs.DurationVar(&c.Jitter, "jitter", c.Jitter, "spread each one-way delay uniformly over RTT/2 ± this `duration` (at most RTT/2)")
	fs.Float64Var(&c.Loss, "loss", c.Loss, "`probability` in [0, 1) of dropping each packet, each direction (0.01 = 1%): UDP datagrams only in relay mode, every IP packet with --netns")
	fs.DurationVar(&c.UDPIdleTimeout, "udp-idle-timeout", c.UDPIdleTimeout, "end a UDP mapping after this idle `duration` (0 means 2m)")
	fs.IntVar(&c.MaxQueueBytes, "max-queue-bytes", c.MaxQueueBytes, "`bytes` held back per TCP direction and per UDP flow (0 means 8 MiB)")
	fs.IntVar(&c.MaxUDPFlows, "max-udp-flows", c.MaxUDPFlows, "UDP client addresses mapped at once (0 means 1024)")
	fs.BoolVar(&c.Packet, "netns", c.Packet, "packet mode: IP packets cross TUN devices between network namespaces this run creates, so TCP and UDP meet the same impairments (root or CAP_NET_ADMIN+CAP_SYS_ADMIN)")
	fs.Var(burstFlag{c}, "burst-loss", "packet mode: Gilbert-Elliott burst loss `P,LEN`: a long-run fraction P of packets lost in bursts of LEN packets on average, each direction")
	fs.Var(probFlag{&c.Reorder}, "reorder", "packet mode: `probability` that a packet is held back 10ms so later ones overtake it")
	fs.Var(RateFlag{&c.Bandwidth}, "bandwidth", "packet mode: rate limit of each direction, `RATE` such as 20mbit, 500kbit or 1gbit (bits per second)")
	fs.StringVar(&c.UplinkTrace, "uplink-trace", c.UplinkTrace, "packet mode: Mahimahi link trace `file` for the client-to-server bottleneck (one delivery opportunity per line, in ms, repeating)")
	fs.StringVar(&c.DownlinkTrace, "downlink-trace", c.DownlinkTrace, "packet mode: Mahimahi link trace `file` for the server-to-client bottleneck")
	fs.Var(BytesFlag{&c.Queue}, "queue", "packet mode with --bandwidth: drop-tail queue of each direction in `BYTES`, such as 64KB (default one bandwidth-delay product, at least 16KB)")
}

// Args returns the `pgquic wan` flags that reproduce c; StartProcess passes
// them to the child.
func (c Config) Args() []string {
	var args []string
	if !c.Packet {
		args = append(args, "--listen", c.Listen) // packet mode's address is the namespace's
	}
	args = append(args,
		"--upstream", c.Upstream,
		"--rtt", c.RTT.String(),
		"--jitter", c.Jitter.String(),
		"--loss", strconv.FormatFloat(c.Loss, 'g', -1, 64),
		"--udp-idle-timeout", c.UDPIdleTimeout.String(),
		"--max-queue-bytes", strconv.Itoa(c.MaxQueueBytes),
		"--max-udp-flows", strconv.Itoa(c.MaxUDPFlows),
		"--netns="+strconv.FormatBool(c.Packet),
	)
	if c.BurstLoss > 0 {
		args = append(args, "--burst-loss", burstFlag{&c}.String())
	}
	if c.Reorder > 0 {
		args = append(args, "--reorder", strconv.FormatFloat(c.Reorder, 'g', -1, 64))
	}
	if c.Bandwidth > 0 {
		args = append(args, "--bandwidth", strconv.FormatInt(c.Bandwidth, 10))
	}
	if c.Queue > 0 {
		args = append(args, "--queue", strconv.Itoa(c.Queue))
	}
	if c.UplinkTrace != "" {
		args = append(args, "--uplink-trace", c.UplinkTrace)
	}
	if c.DownlinkTrace != "" {
		args = append(args, "--downlink-trace", c.DownlinkTrace)
	}
	return args
}
