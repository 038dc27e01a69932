package backend

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/wire"
)

// unreachable is a connection string no test server listens on; pools built
// on it with MinPool 0 never dial.
const unreachable = "postgres://u:p@127.0.0.1:1/db?sslmode=disable&connect_timeout=1"

func TestPoolConfigDefaults(t *testing.T) {
	got, err := PoolConfig{ConnString: "x"}.populate()
	if err != nil {
		t.Fatal(err)
	}
	want := PoolConfig{ConnString: "x", PoolSize: 20, ConnectTimeout: 5 * time.Second,
		ServerLifetime: time.Hour, ServerIdleTimeout: 10 * time.Minute, HealthCheckAfter: 30 * time.Second}
	if got != want {
		t.Fatalf("defaults: got %+v, want %+v", got, want)
	}

	got, err = PoolConfig{MinPool: 3}.withDefaults(PoolConfig{ConnString: "d", PoolSize: 5, MinPool: 1, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got.ConnString != "d" || got.PoolSize != 5 || got.MinPool != 3 || got.ConnectTimeout != time.Second {
		t.Fatalf("route defaults: got %+v", got)
	}
}

func TestPoolConfigInvalid(t *testing.T) {
	for name, cfg := range map[string]PoolConfig{
		"negative size":     {ConnString: unreachable, PoolSize: -1},
		"negative min":      {ConnString: unreachable, MinPool: -1},
		"min above size":    {ConnString: unreachable, PoolSize: 2, MinPool: 3},
		"negative duration": {ConnString: unreachable, ServerLifetime: -time.Second},
		"empty conn string": {},
		"bad conn string":   {ConnString: "postgres://u@host:notaport/db"},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := NewPool(context.Background(), cfg, nil, nil)
			if err == nil {
				p.Close()
				t.Fatal("NewPool accepted an invalid config")
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
		})
	}
}

func TestNewPoolUnreachableServer(t *testing.T) {
	// An unreachable server is not an error at start; Acquire reports it.
	p, err := NewPool(context.Background(), PoolConfig{ConnString: unreachable, MinPool: 1, ConnectTimeout: time.Second}, nil, NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Acquire(context.Background()); err == nil {
		t.Fatal("Acquire from an unreachable server succeeded")
	}
	if p.Database() != "db" || p.User() != "u" {
		t.Fatalf("Database/User = %q/%q", p.Database(), p.User())
	}
}

func TestAcquireAfterClose(t *testing.T) {
	p, err := NewPool(context.Background(), PoolConfig{ConnString: unreachable}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Close() // idempotent
	if _, err := p.Acquire(context.Background()); !errors.Is(err, ErrPoolClosed) {
		t.Fatalf("Acquire after Close: %v, want ErrPoolClosed", err)
	}
}

func TestRouteMatch(t *testing.T) {
	routes := []Route{
		{Database: "*", User: "*", PoolConfig: PoolConfig{ConnString: unreachable}},       // 0
		{Database: "db1", User: "", PoolConfig: PoolConfig{ConnString: unreachable}},      // 1
		{Database: "db1", User: "alice", PoolConfig: PoolConfig{ConnString: unreachable}}, // 2
		{Database: "*", User: "bob", PoolConfig: PoolConfig{ConnString: unreachable}},     // 3
		{Database: "db2", User: "carol", PoolConfig: PoolConfig{ConnString: unreachable}}, // 4
	}
	m, err := NewManager(context.Background(), ManagerConfig{Routes: routes}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, tc := range []struct {
		db, user string
		want     int
	}{
		{"db1", "alice", 2},
		{"db1", "zed", 1},
		{"db2", "bob", 3},
		{"db2", "carol", 4},
		{"db2", "zed", 0},
		{"other", "alice", 0},
	} {
		if got := m.match(tc.db, tc.user); got != tc.want {
			t.Errorf("match(%s, %s) = %d, want %d", tc.db, tc.user, got, tc.want)
		}
	}
}

func TestManagerNoRoute(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewManager(context.Background(), ManagerConfig{
		Routes:   []Route{{Database: "db", User: "u"}},
		Defaults: PoolConfig{ConnString: unreachable},
	}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := m.Pool(ctx, "db", "other"); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("Pool(db, other): %v, want ErrNoRoute", err)
	}
	p1, err := m.Pool(ctx, "db", "u")
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := m.Pool(ctx, "db", "u")
	if p1 != p2 || len(m.Pools()) != 1 {
		t.Fatalf("pools not cached: %p %p, %d pools", p1, p2, len(m.Pools()))
	}
	m.Close()
	m.Close()
	if _, err := m.Pool(ctx, "db", "u"); !errors.Is(err, ErrPoolClosed) {
		t.Fatalf("Pool after Close: %v, want ErrPoolClosed", err)
	}
	// Close unregistered the metrics, so a new manager may register again.
	m2, err := NewManager(ctx, ManagerConfig{Routes: []Route{{Database: "db", PoolConfig: PoolConfig{ConnString: unreachable}}}}, nil, reg)
	if err != nil {
		t.Fatalf("second manager on the same registry: %v", err)
	}
	m2.Close()
}

func TestManagerInvalid(t *testing.T) {
	for name, cfg := range map[string]ManagerConfig{
		"no routes":                  {},
		"no database":                {Routes: []Route{{User: "u", PoolConfig: PoolConfig{ConnString: unreachable}}}},
		"no conn string":             {Routes: []Route{{Database: "db"}}},
		"bad min pool":               {Routes: []Route{{Database: "db", PoolConfig: PoolConfig{ConnString: unreachable, PoolSize: 1, MinPool: 2}}}},
		"negative max pools":         {Routes: []Route{{Database: "*", PoolConfig: PoolConfig{ConnString: unreachable}}}, MaxPools: -1},
		"negative pool idle timeout": {Routes: []Route{{Database: "*", PoolConfig: PoolConfig{ConnString: unreachable}}}, PoolIdleTimeout: -time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			m, err := NewManager(context.Background(), cfg, nil, nil)
			if err == nil {
				m.Close()
				t.Fatal("NewManager accepted an invalid config")
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
		})
	}
}

// socketPair returns both ends of a loopback TCP connection.
func socketPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// bareConn wraps nc the way dial does, without a pool.
func bareConn(nc net.Conn) *Conn {
	c := &Conn{
		R:       wire.NewReader(nc, bufSize, maxServerMessage),
		W:       bufio.NewWriterSize(nc, bufSize),
		Params:  map[string]string{},
		netConn: nc,
	}
	c.initRaw()
	return c
}

func TestAliveDetectsUnsolicitedDataAndClose(t *testing.T) {
	client, server := socketPair(t)
	c := bareConn(client)
	if c.raw == nil {
		t.Fatal("no raw socket access on a TCP connection")
	}
	if err := c.alive(); err != nil {
		t.Fatalf("quiet socket reported dead: %v", err)
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = c.alive() }); allocs != 0 {
		t.Errorf("alive allocates %v times per call", allocs)
	}
	if _, err := server.Write([]byte{'E'}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "peek to see data", func() bool { return errors.Is(c.alive(), errUnsolicited) })

	client2, server2 := socketPair(t)
	c2 := bareConn(client2)
	server2.Close()
	waitFor(t, 5*time.Second, "peek to see EOF", func() bool { return errors.Is(c2.alive(), io.EOF) })
}

func TestCancelSendsCancelRequest(t *testing.T) {
	// A scripted fake server: record the CancelRequest, then close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		n, _ := io.ReadAtLeast(c, buf, 16)
		got <- buf[:n]
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	p := unopenedPool(t, port)
	if err := p.Cancel(testCtx(t), 4242, []byte{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	b := <-got
	if len(b) != 16 || binary.BigEndian.Uint32(b[0:4]) != 16 || binary.BigEndian.Uint32(b[4:8]) != pgproto.CancelRequestCode ||
		binary.BigEndian.Uint32(b[8:12]) != 4242 || string(b[12:]) != "\x01\x02\x03\x04" {
		t.Fatalf("CancelRequest bytes % x", b)
	}
}

// TestCancelOnceNotSent: a CancelOnce whose session cannot be opened says
// it signalled nothing, so the caller may fall back to a CancelRequest
// without cancelling twice.
func TestCancelOnceNotSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close() // nothing listens there now
	p := unopenedPool(t, port)
	if err := p.CancelOnce(testCtx(t), 4242); !errors.Is(err, ErrCancelNotSent) {
		t.Fatalf("CancelOnce to a closed port: %v, want ErrCancelNotSent", err)
	}
}

// unopenedPool is a pool of no connections aimed at 127.0.0.1:port, for
// Cancel and CancelOnce against a scripted server or none.
func unopenedPool(t *testing.T, port int) *Pool {
	t.Helper()
	p, err := NewPool(context.Background(), PoolConfig{
		ConnString: "host=127.0.0.1 port=" + itoa(port) + " user=u dbname=d sslmode=disable",
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestNilMetrics(t *testing.T) {
	var pm *poolMetrics
	pm.acquired(time.Now())
	pm.connected()
	pm.connectFailed()
	pm.destroyedFor(reasonDead)
	pm.detach()
	var m *Metrics
	if m.forPool(&Pool{}) != nil {
		t.Fatal("nil Metrics bound a pool")
	}
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// TestSetParamCountsChanges checks that ParamsGen moves with every change
// SetParam makes to Params and only then: the pooler skips comparing a
// client's parameters with a connection's while it stays put, so a missed
// change would leave a client with settings it did not ask for, and a
// spurious one only costs a comparison.
func TestSetParamCountsChanges(t *testing.T) {
	var c Conn
	steps := []struct {
		name, value string
		gen         uint64
	}{
		{"TimeZone", "UTC", 1}, // on a nil map
		{"TimeZone", "UTC", 1}, // the same value again
		{"DateStyle", "ISO, MDY", 2},
		{"TimeZone", "Europe/Paris", 3},
		{"TimeZone", "", 4}, // an empty value is a value
		{"TimeZone", "", 4},
	}
	for _, st := range steps {
		c.SetParam(st.name, st.value)
		if got := c.ParamsGen(); got != st.gen || c.Params[st.name] != st.value {
			t.Fatalf("after SetParam(%q, %q): gen %d, value %q; want %d, %q", st.name, st.value, got, c.Params[st.name], st.gen, st.value)
		}
	}
}
