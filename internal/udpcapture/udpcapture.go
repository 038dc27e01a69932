// Package udpcapture is a test tool for replay attacks on QUIC: a UDP proxy
// that records every datagram its first client sends (its first flight,
// the Initial and the 0-RTT packets, and whatever followed, which a new
// server connection cannot decrypt), and Replay, which sends such datagrams
// again from a new socket, as an attacker who captured them on the path
// would. It relays one client at a time.
package udpcapture

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"time"
)

// Proxy relays datagrams between clients and one server address, keeping
// the first flight of the first client.
type Proxy struct {
	ln       *net.UDPConn
	upstream *net.UDPAddr

	delay time.Duration // added to every datagram from the server

	mu     sync.Mutex
	flight [][]byte
	first  string // the first client's address
	client *net.UDPAddr
	up     *net.UDPConn
	wg     sync.WaitGroup

	fromClientsDone sync.WaitGroup
}

// New listens on a loopback port and relays to server.
func New(server string) (*Proxy, error) {
	p, err := newProxy(server)
	if err != nil {
		return nil, err
	}
	p.start()
	return p, nil
}

// newProxy listens on a loopback port for server, relaying nothing yet.
func newProxy(server string) (*Proxy, error) {
	up, err := net.ResolveUDPAddr("udp", server)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	return &Proxy{ln: ln, upstream: up}, nil
}

// start starts relaying.
func (p *Proxy) start() {
	p.wg.Add(1)
	p.fromClientsDone.Add(1)
	go func() {
		defer p.fromClientsDone.Done()
		p.fromClients()
	}()
}

// NewDelayed is New with delay added to every datagram the server sends,
// in order: a path on which the server's first answer arrives after the
// client's first flight has left, as on any real network. (Over bare
// loopback a QUIC client may still be opening its first 0-RTT stream when
// the server's answer is processed, which quic-go does not synchronize:
// quic-go issue 4303, a data race the race detector reports.)
func NewDelayed(server string, delay time.Duration) (*Proxy, error) {
	p, err := newProxy(server)
	if err != nil {
		return nil, err
	}
	p.delay = delay
	p.start()
	return p, nil
}

// Addr is the address clients dial instead of the server's.
func (p *Proxy) Addr() string { return p.ln.LocalAddr().String() }

// FirstFlight returns copies of the datagrams the first client sent, in
// order: its first flight and what followed. (A client writes its 0-RTT
// stream data when the application does, which on loopback may be after
// the server's first answer, so nothing shorter is sure to hold it.)
func (p *Proxy) FirstFlight() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([][]byte, len(p.flight))
	for i, d := range p.flight {
		out[i] = bytes.Clone(d)
	}
	return out
}

// Close stops relaying, once what clients had already sent (a closing
// client's last packet, say) is passed on.
func (p *Proxy) Close() error {
	// A read deadline, not a close, ends fromClients: the datagrams
	// already queued on the socket are read and relayed first.
	_ = p.ln.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	p.fromClientsDone.Wait()
	err := p.ln.Close()
	p.mu.Lock()
	if p.up != nil {
		_ = p.up.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) fromClients() {
	defer p.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, from, err := p.ln.ReadFromUDP(buf)
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.client == nil || p.client.String() != from.String() {
			// A new client (or the first): a new upstream socket.
			if p.up != nil {
				_ = p.up.Close()
			}
			up, err := net.DialUDP("udp", nil, p.upstream)
			if err != nil {
				p.mu.Unlock()
				return
			}
			p.client, p.up = from, up
			p.wg.Add(1)
			go p.fromServer(up, from)
		}
		if p.first == "" {
			p.first = from.String()
		}
		if p.first == from.String() {
			p.flight = append(p.flight, bytes.Clone(buf[:n]))
		}
		up := p.up
		p.mu.Unlock()
		_, _ = up.Write(buf[:n])
	}
}

func (p *Proxy) fromServer(up *net.UDPConn, client *net.UDPAddr) {
	defer p.wg.Done()
	if p.delay > 0 {
		p.fromServerDelayed(up, client)
		return
	}
	buf := make([]byte, 65536)
	for {
		n, err := up.Read(buf)
		if err != nil {
			return
		}
		_, _ = p.ln.WriteToUDP(buf[:n], client)
	}
}

// fromServerDelayed relays the server's datagrams p.delay after each
// arrived, in order.
func (p *Proxy) fromServerDelayed(up *net.UDPConn, client *net.UDPAddr) {
	type due struct {
		at time.Time
		b  []byte
	}
	q := make(chan due, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range q {
			time.Sleep(time.Until(d.at))
			_, _ = p.ln.WriteToUDP(d.b, client)
		}
	}()
	defer func() { close(q); <-done }()
	buf := make([]byte, 65536)
	for {
		n, err := up.Read(buf)
		if err != nil {
			return
		}
		select {
		case q <- due{time.Now().Add(p.delay), bytes.Clone(buf[:n])}:
		default: // a full queue drops, as a router would
		}
	}
}

// Replay sends datagrams to server from a new socket, in order, and reads
// (and drops) what the server answers until ctx ends or linger passes,
// never answering: the replayer cannot, lacking the client's keys.
func Replay(ctx context.Context, server string, datagrams [][]byte, linger time.Duration) error {
	addr, err := net.ResolveUDPAddr("udp", server)
	if err != nil {
		return err
	}
	c, err := net.DialUDP("udp", nil, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	for _, d := range datagrams {
		if _, err := c.Write(d); err != nil {
			return fmt.Errorf("udpcapture: replay: %w", err)
		}
	}
	deadline := time.Now().Add(linger)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.SetReadDeadline(deadline)
	buf := make([]byte, 65536)
	for {
		if _, err := c.Read(buf); err != nil {
			return nil
		}
	}
}
