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
package udplb

import (
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// LB forwards datagrams between clients and backends. It is safe for
// concurrent use.
type LB struct {
	front    *net.UDPConn
	backends []*backend
	log      *slog.Logger

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
	if len(backends) == 0 {
		return nil, errors.New("udplb: no backends")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	lb := &LB{log: logger, flows: map[string]*flow{}}
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
	h := fnv.New32a()
	h.Write([]byte(client.String()))
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
	up, err := net.DialUDP("udp", nil, lb.backends[i].addr)
	if err != nil {
		return nil, fmt.Errorf("udplb: %w", err)
	}
	f := &flow{client: client, up: up, backend: i}
	lb.flows[key] = f
	lb.wg.Add(1)
	go lb.back(f)
	lb.log.Debug("new flow", "client", key, "backend", lb.backends[i].addr)
	return f, nil
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
			f, err := lb.flowFor(client)
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
