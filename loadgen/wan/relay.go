// Package wan is a user-space WAN emulator: a relay that carries TCP
// connections and UDP datagrams (QUIC) from a listen address to an upstream,
// adding a configured round trip, jitter and UDP loss. The kernel's netem is
// not needed, and the endpoints keep their own sockets, so QUIC keeps its
// GSO, ECN and batching. It is what `pgquic wan` runs and what the ramp puts
// between its clients and the pooler.
package wan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// udpSocketBuffer is what the relay asks for its UDP sockets; the kernel
// caps it at net.core.rmem_max/wmem_max. Bursts larger than the buffer are
// dropped by the kernel, not by the emulation, so the larger the better.
const udpSocketBuffer = 4 << 20

// acceptRetry is the pause after a failed Accept (for example out of file
// descriptors) before trying again.
const acceptRetry = 50 * time.Millisecond

// Relay is one running emulator. Create it with New, start it with Start,
// stop it with Close (or by cancelling Start's context, then Close to wait).
type Relay struct {
	cfg    Config
	logger *slog.Logger
	oneWay int64 // RTT/2 in nanoseconds
	jitter int64
	rtt    int64
	epoch  time.Time

	ln     *net.TCPListener
	udp    *net.UDPConn
	upUDP  *net.UDPAddr
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	flows  map[netip.AddrPort]*udpFlow
	conns  map[*tcpConn]struct{}

	c counters
}

// New checks cfg and returns a relay that is not listening yet. A nil logger
// discards the relay's log lines.
func New(cfg Config, logger *slog.Logger) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("wan: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	return &Relay{
		cfg:    cfg,
		logger: logger,
		oneWay: int64(cfg.RTT / 2),
		jitter: int64(cfg.Jitter),
		rtt:    int64(cfg.RTT),
		flows:  make(map[netip.AddrPort]*udpFlow),
		conns:  make(map[*tcpConn]struct{}),
	}, nil
}

// Start opens the TCP listener and the UDP socket on the same port and
// starts relaying in the background until ctx is done or Close is called.
func (r *Relay) Start(ctx context.Context) error {
	if r.ctx != nil {
		return errors.New("wan: relay already started")
	}
	up, err := net.ResolveUDPAddr("udp", r.cfg.Upstream)
	if err != nil {
		return fmt.Errorf("wan: upstream %q: %w", r.cfg.Upstream, err)
	}
	ln, uc, err := listenBoth(r.cfg.Listen)
	if err != nil {
		return fmt.Errorf("wan: listen %q: %w", r.cfg.Listen, err)
	}
	_ = uc.SetReadBuffer(udpSocketBuffer)
	_ = uc.SetWriteBuffer(udpSocketBuffer)
	enableRxStamps(uc)
	r.upUDP, r.ln, r.udp = up, ln, uc
	r.epoch = time.Now()
	r.ctx, r.cancel = context.WithCancel(ctx)
	r.wg.Go(r.acceptLoop)
	r.wg.Go(r.udpLoop)
	r.wg.Go(r.closeOnDone)
	return nil
}

// listenBoth listens for TCP and UDP on the same port. When the port is 0 the
// kernel picks a free TCP port, which may be taken for UDP: then it tries
// another.
func listenBoth(addr string) (*net.TCPListener, *net.UDPConn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, err
	}
	for attempt := 0; ; attempt++ {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, nil, err
		}
		ln := l.(*net.TCPListener)
		p := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err == nil {
			return ln, pc.(*net.UDPConn), nil
		}
		_ = ln.Close()
		if port != "0" || !errors.Is(err, syscall.EADDRINUSE) || attempt == 20 {
			return nil, nil, err
		}
	}
}

// Addr is the address the relay listens on, for TCP and UDP alike, once
// Start has returned.
func (r *Relay) Addr() string {
	if r.ln == nil {
		return ""
	}
	return r.ln.Addr().String()
}

// Stats returns a snapshot of the counters.
func (r *Relay) Stats() Stats {
	return r.c.snapshot()
}

// Close stops relaying: listeners, TCP connections and UDP mappings are
// closed at once (data still held back is discarded) and Close returns when
// every goroutine of the relay has ended. It may be called more than once.
func (r *Relay) Close() error {
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.wg.Wait()
	return nil
}

// closeOnDone tears everything down when the relay's context ends.
func (r *Relay) closeOnDone() {
	<-r.ctx.Done()
	r.mu.Lock()
	r.closed = true
	conns := make([]*tcpConn, 0, len(r.conns))
	for tc := range r.conns {
		conns = append(conns, tc)
	}
	r.mu.Unlock()
	_ = r.ln.Close()
	_ = r.udp.Close()
	for _, tc := range conns {
		tc.abort()
	}
	// UDP flows see the context themselves (their scheduler selects on it).
}

// now is the relay's clock: monotonic nanoseconds since Start.
func (r *Relay) now() int64 {
	return int64(time.Since(r.epoch))
}

// delay draws one one-way delay: RTT/2, spread uniformly by the jitter.
func (r *Relay) delay() int64 {
	if r.jitter == 0 {
		return r.oneWay
	}
	return r.oneWay + rand.Int64N(2*r.jitter+1) - r.jitter
}

// lose draws whether the emulated loss drops one datagram.
func (r *Relay) lose() bool {
	return r.cfg.Loss > 0 && rand.Float64() < r.cfg.Loss
}

// sleepUntil waits until the relay clock reaches t; it returns false if the
// relay stopped first.
func (r *Relay) sleepUntil(t int64) bool {
	d := time.Duration(t - r.now())
	if d <= 0 {
		return r.ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-r.ctx.Done():
		return false
	}
}
