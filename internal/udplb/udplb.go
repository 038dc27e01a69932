// Package udplb is a small user-space UDP load balancer for tests: it
// stands for the Kubernetes Service (kube-proxy and conntrack) or the cloud
// load balancer in front of several pgquic replicas, so tests can measure
// what QUIC clients see when a replica goes away.
//
// Each client address is a flow, pinned to one backend chosen by a hash of
// the address among the backends still up, and forwarded through its own
// connected upstream socket, as conntrack keeps a flow on one endpoint.
// A backend is marked down when the kernel reports its port unreachable
// (ECONNREFUSED on the connected socket, which is what a killed process
// leaves behind); the flow's next packet then goes to another backend,
// as a Service does once the dead endpoint's conntrack entries are gone.
//
// NewCIDRouting makes it a QUIC-LB style balancer instead: packets are
// routed by the server ID in their destination connection ID
// (internal/quiclb), so a connection stays on its replica when the
// client's address changes; other IDs (the client's first Initial
// packets) are routed by a hash of the ID.
package udplb

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/pgquic/pgquic/internal/quiclb"
)

// LB forwards datagrams between clients and backends. It is safe for
// concurrent use.
type LB struct {
	front    *net.UDPConn
	backends []*backend
	log      *slog.Logger

	// byID maps a server ID to its backend; nil routes by client address.
	byID      map[int]int
	cidRouted atomic.Int64 // datagrams routed by a decoded server ID

	mu     sync.Mutex
	flows  map[string]*flow
	closed bool
	wg     sync.WaitGroup
}

type backend struct {
	addr     *net.UDPAddr
	down     atomic.Bool
	failover atomic.Int64 // flows moved away from it
}

// flow is one client address and its upstream socket to one backend.
type flow struct {
	client  *net.UDPAddr
	up      *net.UDPConn
	backend int
}

// New listens on listen (e.g. "127.0.0.1:0") and balances over backends.
// logger nil discards logs.
func New(listen string, backends []string, logger *slog.Logger) (*LB, error) {
	return newLB(listen, backends, nil, logger)
}

// NewCIDRouting is New routing by connection ID: serverIDs[i] is the
// server ID backend i puts in its connection IDs (quicfront's ServerID).
// A datagram whose destination connection ID carries a known server ID
// goes to that backend while it is up; any other ID (the client's first
// Initial packets, chosen at random), or one whose backend is down, goes
// by a hash of the ID to a backend up (which answers a connection it does
// not know with a stateless reset); a datagram too short for a connection
// ID by the client's address. Each client
// address and backend pair has its own upstream socket, so a client whose
// address changed reaches its replica from a new address, as through a
// real balancer.
func NewCIDRouting(listen string, backends []string, serverIDs []int, logger *slog.Logger) (*LB, error) {
	if len(serverIDs) != len(backends) {
		return nil, errors.New("udplb: one server ID per backend")
	}
	byID := map[int]int{}
	for i, id := range serverIDs {
		if _, dup := byID[id]; dup {
			return nil, fmt.Errorf("udplb: server ID %d given twice", id)
		}
		byID[id] = i
	}
	return newLB(listen, backends, byID, logger)
}

func newLB(listen string, backends []string, byID map[int]int, logger *slog.Logger) (*LB, error) {
	if len(backends) == 0 {
		return nil, errors.New("udplb: no backends")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	lb := &LB{log: logger, flows: map[string]*flow{}, byID: byID}
	for _, b := range backends {
		a, err := net.ResolveUDPAddr("udp", b)
		if err != nil {
			return nil, fmt.Errorf("udplb: backend %s: %w", b, err)
		}
		lb.backends = append(lb.backends, &backend{addr: a})
	}
	la, err := net.ResolveUDPAddr("udp", listen)
	if err != nil {
		return nil, fmt.Errorf("udplb: %w", err)
	}
	if lb.front, err = net.ListenUDP("udp", la); err != nil {
		return nil, fmt.Errorf("udplb: %w", err)
	}
	lb.wg.Add(1)
	go lb.run()
	return lb, nil
}

// Addr is the address clients send to.
func (lb *LB) Addr() net.Addr { return lb.front.LocalAddr() }

// Flows returns how many flows each backend carries now.
func (lb *LB) Flows() []int {
	n := make([]int, len(lb.backends))
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for _, f := range lb.flows {
		n[f.backend]++
	}
	return n
}

// Rebind gives every flow a new upstream socket, so the backends see each
// client from a new source port: what a NAT that forgot its mappings (or
// rebound them) does to a QUIC client, which knows nothing of it. Datagrams
// the backends send to the old ports are lost. It returns how many flows
// were rebound.
func (lb *LB) Rebind() (int, error) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return 0, net.ErrClosed
	}
	n := 0
	for key, f := range lb.flows {
		if _, err := lb.newFlow(key, f.client, f.backend); err != nil {
			return n, err
		}
		_ = f.up.Close() // its back goroutine ends
		n++
	}
	return n, nil
}

// CIDRouted returns how many datagrams were routed by the server ID in
// their connection ID (NewCIDRouting).
func (lb *LB) CIDRouted() int64 { return lb.cidRouted.Load() }

// Failovers returns how many flows were moved away from backend i because
// it was down.
func (lb *LB) Failovers(i int) int64 { return lb.backends[i].failover.Load() }

// Close stops forwarding and waits for its goroutines.
func (lb *LB) Close() error {
	lb.mu.Lock()
	lb.closed = true
	flows := lb.flows
	lb.flows = map[string]*flow{}
	lb.mu.Unlock()
	err := lb.front.Close()
	for _, f := range flows {
		_ = f.up.Close()
	}
	lb.wg.Wait()
	return err
}

// pick returns the backend for a client: the first one up, starting at the
// client's hash, so clients spread and keep their backend while it lives.
func (lb *LB) pick(client *net.UDPAddr) (int, error) {
	return lb.pickFrom([]byte(client.String()))
}

// pickFrom returns the first backend up, starting at the hash of key.
func (lb *LB) pickFrom(key []byte) (int, error) {
	h := fnv.New32a()
	h.Write(key)
	start := int(h.Sum32() % uint32(len(lb.backends)))
	for i := range lb.backends {
		j := (start + i) % len(lb.backends)
		if !lb.backends[j].down.Load() {
			return j, nil
		}
	}
	return 0, errors.New("udplb: every backend is down")
}

// flowFor returns the client's flow, replacing one whose backend is down.
func (lb *LB) flowFor(client *net.UDPAddr) (*flow, error) {
	key := client.String()
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return nil, net.ErrClosed
	}
	if f, ok := lb.flows[key]; ok {
		if !lb.backends[f.backend].down.Load() {
			return f, nil
		}
		lb.backends[f.backend].failover.Add(1)
		delete(lb.flows, key)
		_ = f.up.Close()
	}
	i, err := lb.pick(client)
	if err != nil {
		return nil, err
	}
	return lb.newFlow(key, client, i)
}

// newFlow opens the upstream socket of a flow to backend i; lb.mu held.
func (lb *LB) newFlow(key string, client *net.UDPAddr, i int) (*flow, error) {
	up, err := net.DialUDP("udp", nil, lb.backends[i].addr)
	if err != nil {
		return nil, fmt.Errorf("udplb: %w", err)
	}
	f := &flow{client: client, up: up, backend: i}
	lb.flows[key] = f
	lb.wg.Add(1)
	go lb.back(f)
	lb.log.Debug("new flow", "client", client.String(), "backend", lb.backends[i].addr)
	return f, nil
}

// routeCID returns the backend for a datagram by its connection ID
// (NewCIDRouting).
func (lb *LB) routeCID(pkt []byte, client *net.UDPAddr) (int, error) {
	dcid, ok := quiclb.DestConnID(pkt)
	if !ok {
		return lb.pick(client)
	}
	if id, ok := quiclb.ServerID(dcid); ok {
		if i, known := lb.byID[id]; known && !lb.backends[i].down.Load() {
			lb.cidRouted.Add(1)
			return i, nil
		}
	}
	return lb.pickFrom(dcid)
}

// flowTo returns the flow of client to backend i (NewCIDRouting).
func (lb *LB) flowTo(client *net.UDPAddr, i int) (*flow, error) {
	key := client.String() + "/" + strconv.Itoa(i)
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return nil, net.ErrClosed
	}
	if f, ok := lb.flows[key]; ok {
		return f, nil
	}
	return lb.newFlow(key, client, i)
}

// run forwards client datagrams to their flows' backends.
func (lb *LB) run() {
	defer lb.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, client, err := lb.front.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		for attempt := 0; attempt < 2; attempt++ {
			var f *flow
			if lb.byID == nil {
				f, err = lb.flowFor(client)
			} else {
				var i int
				if i, err = lb.routeCID(buf[:n], client); err == nil {
					f, err = lb.flowTo(client, i)
				}
			}
			if err != nil {
				break // dropped, as a load balancer without endpoints does
			}
			if _, err := f.up.Write(buf[:n]); err != nil {
				if lb.markDown(f, err) {
					continue // resend on the backend the flow moves to
				}
			}
			break
		}
	}
}

// back forwards a backend's datagrams to the flow's client.
func (lb *LB) back(f *flow) {
	defer lb.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, err := f.up.Read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			lb.markDown(f, err)
			continue
		}
		_, _ = lb.front.WriteToUDP(buf[:n], f.client)
	}
}

// markDown marks the flow's backend down when err says its port is
// unreachable, and reports whether it did.
func (lb *LB) markDown(f *flow, err error) bool {
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return false
	}
	if lb.backends[f.backend].down.CompareAndSwap(false, true) {
		lb.log.Info("backend down", "backend", lb.backends[f.backend].addr, "err", err)
	}
	return true
}
