package quicfront

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgquic/pgquic/internal/front"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// scriptedPG speaks just enough of the PostgreSQL protocol for pgconn and
// libpq to connect and run "select <n>" and "select pg_sleep(<s>)" simple
// queries; a CancelRequest interrupts the matching session's sleep.
type scriptedPG struct {
	nextPID  atomic.Uint32
	sessions atomic.Int64
	cancels  atomic.Int64
	sleeping chan uint32 // receives a session's pid when it starts sleeping; may be nil

	mu      sync.Mutex
	cancelC map[uint32]chan struct{}
	peers   []front.Peer
}

func newScriptedPG() *scriptedPG {
	return &scriptedPG{cancelC: map[uint32]chan struct{}{}, sleeping: make(chan uint32, 16)}
}

func (h *scriptedPG) Serve(ctx context.Context, rwc io.ReadWriteCloser, peer front.Peer) error {
	defer rwc.Close()
	h.mu.Lock()
	h.peers = append(h.peers, peer)
	h.mu.Unlock()
	be := pgproto3.NewBackend(rwc, rwc)
startup:
	for {
		msg, err := be.ReceiveStartupMessage()
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if _, err := rwc.Write([]byte{'N'}); err != nil {
				return err
			}
		case *pgproto3.CancelRequest:
			h.cancels.Add(1)
			h.mu.Lock()
			if c, ok := h.cancelC[m.ProcessID]; ok {
				close(c)
				delete(h.cancelC, m.ProcessID)
			}
			h.mu.Unlock()
			return nil
		case *pgproto3.StartupMessage:
			break startup
		default:
			return errors.New("unexpected startup message")
		}
	}
	h.sessions.Add(1)
	pid := h.nextPID.Add(1)
	be.Send(&pgproto3.AuthenticationOk{})
	for _, kv := range [][2]string{{"server_version", "15.0"}, {"client_encoding", "UTF8"},
		{"server_encoding", "UTF8"}, {"standard_conforming_strings", "on"}, {"DateStyle", "ISO, MDY"},
		{"integer_datetimes", "on"}, {"TimeZone", "UTC"}} {
		be.Send(&pgproto3.ParameterStatus{Name: kv[0], Value: kv[1]})
	}
	be.Send(&pgproto3.BackendKeyData{ProcessID: pid, SecretKey: []byte{1, 2, 3, 4}})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := be.Flush(); err != nil {
		return err
	}
	for {
		msg, err := be.Receive()
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.Terminate:
			return nil
		case *pgproto3.Query:
			q := strings.TrimSuffix(strings.TrimSpace(strings.ToLower(m.String)), ";")
			switch {
			case strings.HasPrefix(q, "select pg_sleep(") && strings.HasSuffix(q, ")"):
				secs, _ := strconv.ParseFloat(q[len("select pg_sleep("):len(q)-1], 64)
				c := make(chan struct{})
				h.mu.Lock()
				h.cancelC[pid] = c
				h.mu.Unlock()
				select {
				case h.sleeping <- pid:
				default:
				}
				select {
				case <-c:
					be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "57014", Message: "canceling statement due to user request"})
				case <-time.After(time.Duration(secs * float64(time.Second))):
					be.Send(&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("pg_sleep"), DataTypeOID: 2278, DataTypeSize: 4, TypeModifier: -1}}})
					be.Send(&pgproto3.DataRow{Values: [][]byte{[]byte("")}})
					be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
				case <-ctx.Done():
					return ctx.Err()
				}
			case strings.HasPrefix(q, "select "):
				v := strings.TrimSpace(q[len("select "):])
				if _, err := strconv.Atoi(v); err != nil {
					be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42601", Message: "scripted server only knows select <n>"})
					break
				}
				be.Send(&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("?column?"), DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1}}})
				be.Send(&pgproto3.DataRow{Values: [][]byte{[]byte(v)}})
				be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
			default:
				be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42601", Message: "scripted server only knows select <n>"})
			}
			be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
			if err := be.Flush(); err != nil {
				return err
			}
		default:
			be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "08P01", Message: "scripted server only speaks simple query"})
			_ = be.Flush()
			return errors.New("unsupported message")
		}
	}
}

// echoHandler copies the stream back to itself until EOF.
type echoHandler struct{}

func (echoHandler) Serve(_ context.Context, rwc io.ReadWriteCloser, _ front.Peer) error {
	defer rwc.Close()
	_, err := io.Copy(rwc, rwc)
	return err
}

type testServer struct {
	*Server
	reg      *prometheus.Registry
	done     chan error
	stopOnce sync.Once
}

// startServer starts a server on a free loopback port (or cfg.Addr) and
// shuts it down at cleanup.
func startServer(t testing.TB, cfg ServerConfig, h front.Handler) *testServer {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	reg := prometheus.NewRegistry()
	s, err := NewServer(cfg, h, testLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ts := &testServer{Server: s, reg: reg, done: make(chan error, 1)}
	go func() { ts.done <- s.Serve(context.Background()) }()
	t.Cleanup(func() { ts.stop(t) })
	return ts
}

func (ts *testServer) stop(t testing.TB) {
	ts.stopOnce.Do(func() { ts.stopNow(t) })
}

func (ts *testServer) stopNow(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = ts.Shutdown(ctx)
	select {
	case <-ts.done:
	case <-time.After(10 * time.Second):
		t.Error("Serve did not return after Shutdown")
	}
}

func newTestDialer(t testing.TB, cfg DialerConfig) *Dialer {
	t.Helper()
	d, err := NewDialer(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// pgConfig returns a pgconn config that runs over d, as the README shows.
func pgConfig(t testing.TB, d *Dialer) *pgconn.Config {
	t.Helper()
	cfg, err := pgconn.ParseConfig("postgres://u@quic/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = d.DialFunc()
	cfg.LookupFunc = func(_ context.Context, host string) ([]string, error) { return []string{host}, nil }
	return cfg
}

func queryInt(ctx context.Context, c *pgconn.PgConn, n int) (string, error) {
	res, err := c.Exec(ctx, "select "+strconv.Itoa(n)).ReadAll()
	if err != nil {
		return "", err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return "", errors.New("unexpected result shape")
	}
	return string(res[0].Rows[0][0]), nil
}

// gaugeValue reads a gauge or counter by name from the registry.
func gaugeValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			sum += metricValue(m)
		}
		return sum
	}
	return 0
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	return 0
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startupBytes is a well-formed StartupMessage, enough for the server's
// startup wait; the echo handler returns it unchanged.
func startupBytes() []byte {
	b, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": "u", "database": "db"}}).Encode(nil)
	return b
}

// testLogger logs to the test when QUICFRONT_DEBUG is set, else discards.
func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("QUICFRONT_DEBUG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func mustUDP(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
