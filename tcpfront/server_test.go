package tcpfront

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/front"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testTimeout is generous: the test machine is small and noisy.
const testTimeout = 30 * time.Second

// fakeSession is a scripted PostgreSQL server for one session: it answers an
// SSLRequest ('S' with StartTLS when the peer offers it, else 'N'), accepts
// any StartupMessage, and answers each simple Query with an empty result.
// It exists to exercise the front without a pooler; it is not a database.
type fakeSession struct {
	started chan front.Peer // receives the peer when a session starts
	release chan struct{}   // when non-nil, the handler blocks until closed
	tlsUsed chan bool       // receives whether the session switched to TLS
}

func (f *fakeSession) Serve(ctx context.Context, rwc io.ReadWriteCloser, peer front.Peer) error {
	defer rwc.Close()
	if f.started != nil {
		select {
		case f.started <- peer:
		default: // a test that waits for one session ignores the rest
		}
	}
	if f.release != nil {
		select {
		case <-f.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var stream io.ReadWriteCloser = rwc
	be := pgproto3.NewBackend(stream, stream)
	secure := false
	for {
		msg, err := be.ReceiveStartupMessage()
		if err != nil {
			return err
		}
		if _, ok := msg.(*pgproto3.SSLRequest); ok {
			if peer.StartTLS == nil {
				if _, err := stream.Write([]byte{'N'}); err != nil {
					return err
				}
				continue
			}
			if _, err := stream.Write([]byte{'S'}); err != nil {
				return err
			}
			tc, err := peer.StartTLS(ctx)
			if err != nil {
				return err
			}
			defer tc.Close()
			stream = tc
			be = pgproto3.NewBackend(stream, stream)
			secure = true
			continue
		}
		if _, ok := msg.(*pgproto3.StartupMessage); !ok {
			return fmt.Errorf("unexpected startup packet %T", msg)
		}
		break
	}
	if f.tlsUsed != nil {
		select {
		case f.tlsUsed <- secure:
		default:
		}
	}
	be.Send(&pgproto3.AuthenticationOk{})
	be.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: "15.0"})
	be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := be.Flush(); err != nil {
		return err
	}
	for {
		msg, err := be.Receive()
		if err != nil {
			return err
		}
		switch msg.(type) {
		case *pgproto3.Terminate:
			return nil
		case *pgproto3.Query:
			be.Send(&pgproto3.EmptyQueryResponse{})
			be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
			if err := be.Flush(); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unexpected message %T", msg)
		}
	}
}

// startServer runs a front on a free loopback port and shuts it down at the
// end of the test.
func startServer(t *testing.T, cfg Config, h front.Handler, reg prometheus.Registerer) *Server {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	s, err := New(cfg, h, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

func connString(s *Server, sslmode string) string {
	return fmt.Sprintf("postgres://u@%s/db?sslmode=%s&connect_timeout=30", s.Addr(), sslmode)
}

func TestSessionPlain(t *testing.T) {
	h := &fakeSession{started: make(chan front.Peer, 1)}
	s := startServer(t, Config{}, h, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	// prefer: the SSLRequest is answered 'N' because the front has no TLS.
	conn, err := pgconn.Connect(ctx, connString(s, "prefer"))
	if err != nil {
		t.Fatal(err)
	}
	peer := <-h.started
	if peer.Transport != "tcp" || peer.StartTLS != nil || peer.RequireTLS || peer.Addr == nil {
		t.Errorf("peer = %+v, want tcp transport, no StartTLS, an address", peer)
	}
	if _, err := conn.Exec(ctx, "").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStartTLS(t *testing.T) {
	h := &fakeSession{started: make(chan front.Peer, 1), tlsUsed: make(chan bool, 1)}
	s := startServer(t, Config{TLSConfig: serverTLS(t), RequireTLS: true}, h, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	conn, err := pgconn.Connect(ctx, connString(s, "require"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	peer := <-h.started
	if peer.StartTLS == nil || !peer.RequireTLS {
		t.Errorf("peer = %+v, want StartTLS and RequireTLS", peer)
	}
	if !<-h.tlsUsed {
		t.Error("session did not switch to TLS")
	}
	if _, ok := conn.Conn().(*tls.Conn); !ok {
		t.Errorf("client conn is %T, want *tls.Conn", conn.Conn())
	}
	if _, err := conn.Exec(ctx, "").ReadAll(); err != nil {
		t.Fatal(err)
	}
}

func TestConnectionLimit(t *testing.T) {
	reg := prometheus.NewRegistry()
	release := make(chan struct{})
	h := &fakeSession{started: make(chan front.Peer, 1), release: release}
	s := startServer(t, Config{MaxConns: 1}, h, reg)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	// Occupy the only slot with a session that is still running.
	holder := make(chan error, 1)
	go func() {
		conn, err := pgconn.Connect(ctx, connString(s, "disable"))
		if err == nil {
			err = conn.Close(ctx)
		}
		holder <- err
	}()
	<-h.started

	for _, mode := range []string{"disable", "prefer"} {
		_, err := pgconn.Connect(ctx, connString(s, mode))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "53300" {
			t.Fatalf("sslmode=%s: Connect error = %v, want PgError 53300", mode, err)
		}
	}

	close(release)
	if err := <-holder; err != nil {
		t.Fatalf("holding session: %v", err)
	}
	// sslmode=prefer may cost pgconn two TCP connections (TLS refused,
	// then plain), so count at least one per attempt.
	refused := value(s.m.refused)
	if refused < 2 {
		t.Errorf("refused_total = %v, want >= 2", refused)
	}
	if got := value(s.m.accepted); got != refused+1 {
		t.Errorf("accepted_total = %v, want refused+1 = %v", got, refused+1)
	}
	// Once the holder left, a new client gets in (release is closed, so
	// the handler no longer blocks).
	waitFor(t, func() bool { return value(s.m.connections) == 0 })
	conn, err := pgconn.Connect(ctx, connString(s, "disable"))
	if err != nil {
		t.Fatal(err)
	}
	<-h.started
	if got := value(s.m.connections); got != 1 {
		t.Errorf("connections = %v, want 1", got)
	}
	conn.Close(ctx)
	if fams, err := reg.Gather(); err != nil || len(fams) != 4 {
		t.Errorf("registered families = %d (%v), want 4", len(fams), err)
	}
}

func TestShutdownWaitsForHandler(t *testing.T) {
	release := make(chan struct{})
	h := &fakeSession{started: make(chan front.Peer, 1), release: release}
	s, err := New(Config{Addr: "127.0.0.1:0"}, h, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	client := make(chan error, 1)
	go func() {
		conn, err := pgconn.Connect(ctx, connString(s, "disable"))
		if err == nil {
			_, err = conn.Exec(ctx, "").ReadAll()
			if cerr := conn.Close(ctx); err == nil {
				err = cerr
			}
		}
		client <- err
	}()
	<-h.started

	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	// New connections are refused at the socket level now.
	if c, err := net.Dial("tcp", s.Addr().String()); err == nil {
		c.Close()
		t.Error("dial after Shutdown succeeded")
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v while a handler was running", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-client; err != nil {
		t.Fatalf("client session: %v", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func TestShutdownForcesAfterGrace(t *testing.T) {
	// A handler that ignores everything but its connection.
	h := handlerFunc(func(ctx context.Context, rwc io.ReadWriteCloser, _ front.Peer) error {
		_, err := io.Copy(io.Discard, rwc)
		return err
	})
	s, err := New(Config{Addr: "127.0.0.1:0"}, h, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, func() bool { return value(s.m.connections) == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want deadline exceeded", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(testTimeout))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("client connection still open after forced shutdown")
	}
}

func TestServeStopsOnContext(t *testing.T) {
	s, err := New(Config{Addr: "127.0.0.1:0"}, &fakeSession{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v, want nil", err)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestNewRejects(t *testing.T) {
	h := &fakeSession{}
	for name, cfg := range map[string]Config{
		"no address":        {},
		"negative max":      {Addr: "127.0.0.1:0", MaxConns: -1},
		"require without":   {Addr: "127.0.0.1:0", RequireTLS: true},
		"tls without certs": {Addr: "127.0.0.1:0", TLSConfig: &tls.Config{}},
	} {
		if _, err := New(cfg, h, nil, nil); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
	if _, err := New(Config{Addr: "127.0.0.1:0"}, nil, nil, nil); err == nil {
		t.Error("nil handler: New succeeded")
	}
}

// value reads a gauge or counter without the testutil package.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}

type handlerFunc func(ctx context.Context, rwc io.ReadWriteCloser, peer front.Peer) error

func (f handlerFunc) Serve(ctx context.Context, rwc io.ReadWriteCloser, peer front.Peer) error {
	return f(ctx, rwc, peer)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var (
	certOnce sync.Once
	certVal  tls.Certificate
	certErr  error
)

// serverTLS returns a TLS config with a self-signed certificate for
// 127.0.0.1; the clients in these tests use sslmode=require, which does not
// verify it.
func serverTLS(t *testing.T) *tls.Config {
	t.Helper()
	certOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			certErr = err
			return
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1),
			Subject:      pkix.Name{CommonName: "pgquic test"},
			IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			certErr = err
			return
		}
		certVal = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	})
	if certErr != nil {
		t.Fatal(certErr)
	}
	return &tls.Config{Certificates: []tls.Certificate{certVal}, MinVersion: tls.VersionTLS12}
}
