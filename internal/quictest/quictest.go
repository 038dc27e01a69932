// Package quictest holds what the tests of the QUIC packages (quicfront,
// quicclient, edge) share: a scripted PostgreSQL server and an echo handler
// to run behind a QUIC server, a helper that runs such a server for the
// length of a test, and small polling and metric helpers. Only tests import
// it. It imports neither the server front nor the client, so the tests of
// both can use it.
package quictest

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

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/pgproto"
)

// ScriptedPG speaks just enough of the PostgreSQL protocol for pgconn and
// libpq to connect and run "select <n>" and "select pg_sleep(<s>)" simple
// queries; a CancelRequest interrupts the matching session's sleep.
type ScriptedPG struct {
	// Sessions counts sessions started, Cancels CancelRequests received.
	Sessions atomic.Int64
	Cancels  atomic.Int64
	// Sleeping receives a session's process ID when it starts sleeping.
	Sleeping chan uint32

	nextPID atomic.Uint32

	mu      sync.Mutex
	cancelC map[uint32]chan struct{}
	peers   []front.Peer
}

// NewScriptedPG returns a ScriptedPG with no session yet.
func NewScriptedPG() *ScriptedPG {
	return &ScriptedPG{cancelC: map[uint32]chan struct{}{}, Sleeping: make(chan uint32, 16)}
}

// Peers returns the peer of every session served so far, in order.
func (h *ScriptedPG) Peers() []front.Peer {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]front.Peer(nil), h.peers...)
}

// Serve implements front.Handler.
func (h *ScriptedPG) Serve(ctx context.Context, rwc io.ReadWriteCloser, peer front.Peer) error {
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
			h.Cancels.Add(1)
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
	h.Sessions.Add(1)
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
				case h.Sleeping <- pid:
				default:
				}
				select {
				case <-c:
					be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: pgproto.CodeQueryCanceled, Message: "canceling statement due to user request"})
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
			be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: pgproto.CodeProtocolViolation, Message: "scripted server only speaks simple query"})
			_ = be.Flush()
			return errors.New("unsupported message")
		}
	}
}

// Echo is a front.Handler that copies the stream back to itself until EOF.
type Echo struct{}

// Serve implements front.Handler.
func (Echo) Serve(_ context.Context, rwc io.ReadWriteCloser, _ front.Peer) error {
	defer rwc.Close()
	_, err := io.Copy(rwc, rwc)
	return err
}

// Server is what the QUIC server front and the edge sidecar offer;
// *quicfront.Server and *edge.Edge implement it.
type Server interface {
	Listen() error
	Serve(ctx context.Context) error
	Shutdown(ctx context.Context) error
}

// Running is a server Run started.
type Running struct {
	s        Server
	done     chan struct{}
	err      error // Serve's result, once done is closed
	stopOnce sync.Once
}

// Run listens and serves s until Stop is called or the test ends.
func Run(t testing.TB, s Server) *Running {
	t.Helper()
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	r := &Running{s: s, done: make(chan struct{})}
	go func() {
		r.err = s.Serve(context.Background())
		close(r.done)
	}()
	t.Cleanup(func() { r.Stop(t) })
	return r
}

// Wait waits for Serve to return and returns its error.
func (r *Running) Wait() error {
	<-r.done
	return r.err
}

// Stop shuts the server down (a grace period of 10 s) and waits for Serve to
// return. Calling it again does nothing.
func (r *Running) Stop(t testing.TB) {
	r.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.s.Shutdown(ctx)
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after Shutdown")
		}
	})
}

// Dialer is what quicclient.Dialer offers pgconn; this package does not
// import the client, so the client's own tests can use it.
type Dialer interface {
	DialFunc() func(ctx context.Context, network, addr string) (net.Conn, error)
	LookupFunc() func(ctx context.Context, host string) ([]string, error)
}

// PgConfig returns a pgconn config that runs over d, as the client's README
// shows.
func PgConfig(t testing.TB, d Dialer) *pgconn.Config {
	t.Helper()
	return PgConfigURL(t, d, "postgres://u@quic/db?sslmode=disable")
}

// PgConfigURL is PgConfig for the connection string url (its user,
// database, password and parameters; the host is only a name, since every
// session is a stream to d's pooler).
func PgConfigURL(t testing.TB, d Dialer, url string) *pgconn.Config {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = d.DialFunc()
	cfg.LookupFunc = d.LookupFunc()
	return cfg
}

// QueryInt runs "select n" and returns the text of the one value.
func QueryInt(ctx context.Context, c *pgconn.PgConn, n int) (string, error) {
	res, err := c.Exec(ctx, "select "+strconv.Itoa(n)).ReadAll()
	if err != nil {
		return "", err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return "", errors.New("unexpected result shape")
	}
	return string(res[0].Rows[0][0]), nil
}

// GaugeValue reads a gauge or counter by name from the registry, summed
// over its label values.
func GaugeValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
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

// Eventually polls cond until it holds, or fails the test when the timeout
// passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StartupBytes is a well-formed StartupMessage, enough for the server's
// startup wait; Echo returns it unchanged.
func StartupBytes() []byte {
	b, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": "u", "database": "db"}}).Encode(nil)
	return b
}

// Logger logs to the test when QUICFRONT_DEBUG is set; otherwise it returns
// nil, which the QUIC packages take as "discard".
func Logger(t testing.TB) *slog.Logger {
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

// MustUDP binds a loopback UDP socket.
func MustUDP(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// StartServer builds a server with newServer (given the test's logger and a
// fresh registry), runs it on until the test ends, and returns it with its
// registry and its Running, to stop it earlier.
func StartServer[S Server](t testing.TB, newServer func(*slog.Logger, prometheus.Registerer) (S, error)) (S, *prometheus.Registry, *Running) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := newServer(Logger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	return s, reg, Run(t, s)
}

// Closing fails the test on err and otherwise closes c when the test ends.
func Closing[C io.Closer](t testing.TB, c C, err error) C {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Connect opens a pgconn session over d, closed when the test ends.
func Connect(t testing.TB, ctx context.Context, d Dialer) *pgconn.PgConn {
	t.Helper()
	c, err := pgconn.ConnectConfig(ctx, PgConfig(t, d))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// CancelSleep runs "select pg_sleep(60)" on c, a session of h, sends a
// CancelRequest once h reports the sleep started, and fails the test unless
// the query ends with SQLSTATE 57014.
func CancelSleep(t testing.TB, ctx context.Context, h *ScriptedPG, c *pgconn.PgConn) {
	t.Helper()
	go func() {
		select {
		case <-h.Sleeping:
			_ = c.CancelRequest(ctx)
		case <-ctx.Done():
		}
	}()
	_, err := c.Exec(ctx, "select pg_sleep(60)").ReadAll()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgproto.CodeQueryCanceled {
		t.Fatalf("want query_canceled, got %v", err)
	}
}
