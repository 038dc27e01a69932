package loadgen

// The stack the client tests measure: a real PostgreSQL (internal/pgtest,
// one cluster shared by the package), the backend pool manager with a
// wildcard route, the pooler, and its TCP (TLS) and QUIC fronts, all in
// this process over loopback. The fronts share one generated certificate,
// which clients pin.

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
	"github.com/pgquic/pgquic/quicclient"
	"github.com/pgquic/pgquic/quicfront"
	"github.com/pgquic/pgquic/tcpfront"
)

// testPoolSize is the pooler's server connection limit in these tests.
const testPoolSize = 20

// shared is one PostgreSQL cluster reused by the tests that do not restart
// or break it, so the package does not pay initdb once per test.
var shared pgtest.Shared

// sharedCluster returns the shared cluster, starting it on first use. It
// skips like pgtest.New when PostgreSQL is absent, except under CI=true.
func sharedCluster(t testing.TB) *pgtest.Cluster {
	t.Helper()
	return shared.Get(t)
}

// stack is a running pooler with both fronts.
type stack struct {
	cluster  *pgtest.Cluster
	pooler   *pooler.Pooler
	tcpAddr  string // TCP front (TLS after SSLRequest)
	quicAddr string // QUIC front
	pin      string // SHA-256 of the fronts' certificate
}

// newStack starts a pooler in front of the shared cluster; t.Cleanup stops it.
func newStack(t *testing.T) *stack {
	t.Helper()
	return newStackWith(t, pooler.Config{})
}

// newStackWith is newStack with the pooler's configuration (edge trust).
func newStackWith(t *testing.T, pcfg pooler.Config) *stack {
	t.Helper()
	c := sharedCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := backend.NewManager(ctx, backend.ManagerConfig{
		Routes:   []backend.Route{{Database: backend.Wildcard, PoolConfig: backend.PoolConfig{ConnString: c.SuperURL("postgres")}}},
		Defaults: backend.PoolConfig{PoolSize: testPoolSize},
	}, dbgLogger(), nil)
	if err != nil {
		cancel()
		t.Fatalf("backend.NewManager: %v", err)
	}
	p, err := pooler.New(pcfg, mgr, dbgLogger(), nil)
	if err != nil {
		cancel()
		mgr.Close()
		t.Fatalf("pooler.New: %v", err)
	}
	cert, err := quicfront.GenerateSelfSigned("127.0.0.1")
	if err != nil {
		cancel()
		mgr.Close()
		t.Fatal(err)
	}
	tlsConf := &tls.Config{Certificates: []tls.Certificate{cert}}
	var wg sync.WaitGroup
	ts, err := tcpfront.New(tcpfront.Config{Addr: "127.0.0.1:0", TLSConfig: tlsConf}, p, nil, nil)
	if err == nil {
		err = ts.Listen()
	}
	if err != nil {
		cancel()
		mgr.Close()
		t.Fatalf("tcpfront: %v", err)
	}
	qs, err := quicfront.NewServer(quicfront.ServerConfig{Addr: "127.0.0.1:0", TLSConfig: tlsConf}, p, nil, nil)
	if err == nil {
		err = qs.Listen()
	}
	if err != nil {
		cancel()
		mgr.Close()
		t.Fatalf("quicfront: %v", err)
	}
	wg.Add(2)
	go func() { defer wg.Done(); _ = ts.Serve(ctx) }()
	go func() { defer wg.Done(); _ = qs.Serve(ctx) }()
	t.Cleanup(func() {
		sctx, done := context.WithTimeout(context.Background(), 10*time.Second)
		defer done()
		_ = qs.Shutdown(sctx)
		_ = ts.Shutdown(sctx)
		_ = p.Shutdown(sctx)
		cancel()
		wg.Wait()
		mgr.Close()
	})
	return &stack{
		cluster:  c,
		pooler:   p,
		tcpAddr:  ts.Addr().String(),
		quicAddr: qs.Addr().String(),
		pin:      quicclient.Fingerprint(cert.Certificate[0]),
	}
}

// connect opens the sessions of cfg (closed in t.Cleanup), failing the test
// on error.
func connect(t *testing.T, cfg ClientConfig) *Clients {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Connect(ctx, cfg, nil)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// stallProxy is a TCP relay the test controls: stall stops forwarding in
// both directions until resume, as a stalled server or network path would.
type stallProxy struct {
	ln       net.Listener
	upstream string
	gate     *gate
	ctx      context.Context // canceled by close, so held chunks are dropped
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
}

func newStallProxy(t *testing.T, upstream string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &stallProxy{ln: ln, upstream: upstream, gate: newGate(), ctx: ctx, cancel: cancel}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(u, c)
		go p.pipe(c, u)
	}
}

// pipe copies src to dst, holding each chunk while the gate is shut.
func (p *stallProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.gate.wait(p.ctx) != nil {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) close() {
	p.cancel()
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// dbgLogger logs the pooler and backend pool to stderr with
// PGQUIC_E2E_DEBUG=1 and discards otherwise.
func dbgLogger() *slog.Logger {
	if os.Getenv("PGQUIC_E2E_DEBUG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
