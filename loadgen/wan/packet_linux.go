package wan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// PacketPath is a running packet-mode emulator: a client and a server
// network namespace, a TUN device in each, two links (one per direction)
// moving IP packets between the devices, and a relay inside the server
// namespace that carries TCP connections and UDP flows arriving at
// ServerIP to the upstream in this process's own namespace (usually the
// host's loopback). The kernel's TCP therefore runs end to end from the
// client namespace to the relay, across the emulated path, with its
// handshake, retransmissions and congestion control; QUIC's datagrams
// cross the same links.
type PacketPath struct {
	cfg    Config
	logger *slog.Logger
	ns     *pathNamespaces
	tunC   *os.File
	tunS   *os.File
	up     *link // client -> server
	down   *link // server -> client
	ln     *net.TCPListener
	udp    *net.UDPConn
	upAddr *net.UDPAddr
	addr   string

	stop chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	// extraAddrs counts the client addresses AddClientAddress added.
	extraAddrs int
	flows      map[netip.AddrPort]*packetFlow
	closeMu    sync.Once

	tcpTotal, udpTotal, dialErrors atomic.Uint64
}

// StartPacket removes what killed runs left behind, creates the namespaces
// (named after this process's pid) and devices, and starts moving packets.
// Close undoes all of it. cfg.Packet must be set.
func StartPacket(cfg Config, logger *slog.Logger) (*PacketPath, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if !cfg.Packet {
		return nil, errors.New("wan: StartPacket needs Config.Packet")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("wan: %w", err)
	}
	cfg = cfg.withDefaults()
	if err := PacketPermitted(); err != nil {
		return nil, fmt.Errorf("wan: %w", err)
	}
	if removed, err := RemoveStale(); err != nil {
		logger.Warn("could not remove the namespaces of an earlier run", "err", err)
	} else if len(removed) > 0 {
		logger.Info("removed the namespaces of killed runs", "netns", removed)
	}
	up, err := net.ResolveUDPAddr("udp", cfg.Upstream)
	if err != nil {
		return nil, fmt.Errorf("wan: upstream %q: %w", cfg.Upstream, err)
	}
	ns, err := createNamespaces(os.Getpid())
	if err != nil {
		return nil, fmt.Errorf("wan: %w", err)
	}
	p := &PacketPath{cfg: cfg, logger: logger, ns: ns, upAddr: up, stop: make(chan struct{}),
		conns: map[net.Conn]struct{}{}, flows: map[netip.AddrPort]*packetFlow{}}
	if err := p.setup(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *PacketPath) setup() error {
	var err error
	if p.tunC, err = openTUN(p.ns.client, ClientIP, ServerIP); err != nil {
		return err
	}
	if p.tunS, err = openTUN(p.ns.server, ServerIP, ClientIP); err != nil {
		return err
	}
	listen := net.JoinHostPort(ServerIP, fmt.Sprint(p.upAddr.Port))
	err = InNetns(p.ns.server, func() error {
		ln, err := net.Listen("tcp", listen)
		if err != nil {
			return fmt.Errorf("wan: listen in %s: %w", p.ns.server, err)
		}
		p.ln = ln.(*net.TCPListener)
		la, _ := net.ResolveUDPAddr("udp", listen)
		if p.udp, err = net.ListenUDP("udp", la); err != nil {
			return fmt.Errorf("wan: listen in %s: %w", p.ns.server, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	_ = p.udp.SetReadBuffer(udpSocketBuffer)
	_ = p.udp.SetWriteBuffer(udpSocketBuffer)
	p.addr = listen
	var upTrace, downTrace []time.Duration
	if p.cfg.UplinkTrace != "" {
		if upTrace, err = LoadTrace(p.cfg.UplinkTrace); err != nil {
			return fmt.Errorf("wan: uplink trace: %w", err)
		}
	}
	if p.cfg.DownlinkTrace != "" {
		if downTrace, err = LoadTrace(p.cfg.DownlinkTrace); err != nil {
			return fmt.Errorf("wan: downlink trace: %w", err)
		}
	}
	tunC, tunS := p.tunC, p.tunS
	p.up = newLink(p.cfg, 1, upTrace, func(b []byte) error { _, err := tunS.Write(b); return err })
	p.down = newLink(p.cfg, 2, downTrace, func(b []byte) error { _, err := tunC.Write(b); return err })
	p.wg.Add(6)
	go p.pump(p.tunC, p.up)
	go p.pump(p.tunS, p.down)
	go func() { defer p.wg.Done(); p.up.run(p.stop) }()
	go func() { defer p.wg.Done(); p.down.run(p.stop) }()
	go p.acceptTCP()
	go p.readUDP()
	return nil
}

// Addr is where clients in the client namespace reach the upstream, TCP
// and UDP alike: ServerIP and the upstream's port.
func (p *PacketPath) Addr() string { return p.addr }

// ClientNetns names the namespace clients must run in (InNetns, or
// `ip netns exec NAME`).
func (p *PacketPath) ClientNetns() string { return p.ns.client }

// ServerNetns names the namespace of the server-side relay.
func (p *PacketPath) ServerNetns() string { return p.ns.server }

// AddClientAddress gives the client namespace one more address, the next
// of 198.18.0.3, 198.18.0.4, ... (at most 250), reachable across the same
// links: the client's TUN device takes it and the server namespace routes
// it back through its own. A client that binds a socket to it and moves
// its QUIC connections there changes its address as a phone moving to
// another network does: new source address and port, same path. The
// addresses go with the namespaces at Close.
func (p *PacketPath) AddClientAddress() (netip.Addr, error) {
	p.mu.Lock()
	if p.closed || p.extraAddrs >= 250 {
		p.mu.Unlock()
		return netip.Addr{}, errors.New("wan: no client address left to add")
	}
	p.extraAddrs++
	a := netip.AddrFrom4([4]byte{198, 18, 0, byte(2 + p.extraAddrs)})
	p.mu.Unlock()
	host := a.String() + "/32"
	for _, args := range [][]string{
		{"-n", p.ns.client, "addr", "add", host, "dev", tunName},
		{"-n", p.ns.server, "route", "add", host, "dev", tunName},
	} {
		if err := ipCmd(args...); err != nil {
			return netip.Addr{}, fmt.Errorf("wan: add client address %s: %w", a, err)
		}
	}
	return a, nil
}

// Stats returns a snapshot of the counters.
func (p *PacketPath) Stats() PacketStats {
	return PacketStats{Up: p.up.stats(), Down: p.down.stats(),
		TCPConns: p.tcpTotal.Load(), UDPFlows: p.udpTotal.Load(), DialErrors: p.dialErrors.Load()}
}

// pump reads packets from one TUN device into a link.
func (p *PacketPath) pump(tun *os.File, l *link) {
	defer p.wg.Done()
	for {
		b := l.buf()
		n, err := tun.Read(b)
		if err != nil {
			return // closed
		}
		l.enqueue(b[:n], time.Now())
	}
}

// acceptTCP relays each connection accepted in the server namespace to the
// upstream.
func (p *PacketPath) acceptTCP() {
	defer p.wg.Done()
	for {
		c, err := p.ln.AcceptTCP()
		if err != nil {
			select {
			case <-p.stop:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(acceptRetry)
			continue
		}
		p.tcpTotal.Add(1)
		p.wg.Add(1)
		go p.relayTCP(c)
	}
}

func (p *PacketPath) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *PacketPath) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// relayTCP copies both directions (splice on Linux), passing half-closes
// on. A refused upstream resets the client's connection.
func (p *PacketPath) relayTCP(c *net.TCPConn) {
	defer p.wg.Done()
	defer c.Close()
	if !p.track(c) {
		return
	}
	defer p.untrack(c)
	d := net.Dialer{Timeout: 5 * time.Second}
	uc, err := d.Dial("tcp", p.cfg.Upstream)
	if err != nil {
		p.dialErrors.Add(1)
		_ = c.SetLinger(0)
		return
	}
	u := uc.(*net.TCPConn)
	defer u.Close()
	if !p.track(u) {
		return
	}
	defer p.untrack(u)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(u, c)
		_ = u.CloseWrite()
	}()
	_, _ = io.Copy(c, u)
	_ = c.CloseWrite()
	wg.Wait()
}

// packetFlow is one UDP client address's upstream socket.
type packetFlow struct {
	up   *net.UDPConn
	last atomic.Int64 // unix nanoseconds of the last datagram either way
}

// readUDP relays datagrams from the server namespace's socket to each
// client address's own upstream socket, so the upstream sees one peer per
// client, as in relay mode.
func (p *PacketPath) readUDP() {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, from, err := p.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		f := p.flows[from]
		if f == nil && !p.closed && len(p.flows) < p.cfg.MaxUDPFlows {
			up, err := net.DialUDP("udp", nil, p.upAddr)
			if err == nil {
				_ = up.SetReadBuffer(udpSocketBuffer)
				_ = up.SetWriteBuffer(udpSocketBuffer)
				f = &packetFlow{up: up}
				p.flows[from] = f
				p.udpTotal.Add(1)
				p.wg.Add(1)
				go p.udpBack(from, f)
			}
		}
		p.mu.Unlock()
		if f == nil {
			continue
		}
		f.last.Store(time.Now().UnixNano())
		_, _ = f.up.Write(buf[:n])
	}
}

// udpBack relays the upstream's answers to one client until the flow has
// been idle for UDPIdleTimeout or the path closes.
func (p *PacketPath) udpBack(to netip.AddrPort, f *packetFlow) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.flows, to)
		p.mu.Unlock()
		f.up.Close()
	}()
	buf := make([]byte, 64<<10)
	idle := p.cfg.UDPIdleTimeout
	for {
		_ = f.up.SetReadDeadline(time.Now().Add(idle))
		n, err := f.up.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, f.last.Load())) < idle {
				continue
			}
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, net.ErrClosed) {
				return
			}
			continue // e.g. ECONNREFUSED from an ICMP error: keep the flow
		}
		f.last.Store(time.Now().UnixNano())
		_, _ = p.udp.WriteToUDPAddrPort(buf[:n], to)
	}
}

// Close stops the links and the relay, closes the devices and deletes both
// namespaces. It waits for every goroutine and is safe to call again.
func (p *PacketPath) Close() error {
	var err error
	p.closeMu.Do(func() {
		p.mu.Lock()
		p.closed = true
		for c := range p.conns {
			c.Close()
		}
		for _, f := range p.flows {
			f.up.Close()
		}
		p.mu.Unlock()
		close(p.stop)
		for _, c := range []io.Closer{p.ln, p.udp, p.tunC, p.tunS} {
			if c != nil && !isNilCloser(c) {
				c.Close()
			}
		}
		p.wg.Wait()
		err = p.ns.remove()
	})
	return err
}

// isNilCloser reports whether c holds a typed nil pointer.
func isNilCloser(c io.Closer) bool {
	switch v := c.(type) {
	case *net.TCPListener:
		return v == nil
	case *net.UDPConn:
		return v == nil
	case *os.File:
		return v == nil
	}
	return false
}

// runPacket is Run in packet mode.
func runPacket(ctx context.Context, cfg Config, logger *slog.Logger) error {
	p, err := StartPacket(cfg, logger)
	if err != nil {
		return err
	}
	serveSnapshots(ctx, logger, func() Stats { st := p.Stats(); return Stats{Packet: &st} })
	logger.Info(ReadyMessage, "listen", p.Addr(), "mode", ModePacket, "netns", p.ClientNetns(),
		"server_netns", p.ServerNetns(), "upstream", cfg.Upstream, "rtt", cfg.RTT.String(),
		"jitter", cfg.Jitter.String(), "loss", cfg.Loss, "burst_loss", cfg.BurstLoss, "burst_len", cfg.BurstLen,
		"reorder", cfg.Reorder, "bandwidth_bps", cfg.Bandwidth, "queue_bytes", p.cfg.Queue)
	<-ctx.Done()
	cerr := p.Close()
	st := p.Stats()
	logger.Info(StoppedMessage, "stats", Stats{Packet: &st})
	return cerr
}
