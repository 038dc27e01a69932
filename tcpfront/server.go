// Package tcpfront accepts PostgreSQL clients over plain TCP and hands each
// connection to a session handler (the pooler) as an io.ReadWriteCloser plus
// peer facts.
//
// The front owns only what is specific to TCP: the listener, keep-alive,
// the connection limit, and the TLS upgrade that follows an SSLRequest
// (PostgreSQL protocol "SSL Session Encryption",
// https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-SSL).
// The handler reads the startup packet itself and calls Peer.StartTLS when it
// answered 'S'; the front never parses protocol messages of admitted clients.
package tcpfront

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/defaults"
	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/rawsock"
)

// Default values used when a Config field is zero.
const (
	// DefaultMaxConns is the connection limit when Config.MaxConns is zero:
	// the pooler's default client limit, so the front holds no connection
	// the pooler would refuse anyway.
	DefaultMaxConns = defaults.MaxClients
	// DefaultKeepAlive is the TCP keep-alive period when Config.KeepAlive is
	// zero; short enough to notice dead clients well before pooled backends
	// are wasted on them for long.
	DefaultKeepAlive = 15 * time.Second
)

// Config tunes a Server. The zero value of each field means its documented
// default.
type Config struct {
	// Addr is the TCP address to listen on, for example "127.0.0.1:6432".
	// Port 0 picks a free port (see Server.Addr). Required.
	Addr string

	// TLSConfig enables TLS after an SSLRequest. Nil means no TLS: the
	// handler answers SSLRequest with 'N'. It must hold a certificate.
	TLSConfig *tls.Config

	// RequireTLS asks the handler to refuse clients that start a session
	// without TLS (SQLSTATE 28000). It needs TLSConfig. Default: false.
	RequireTLS bool

	// MaxConns bounds concurrent connections held by this front. A
	// connection beyond it is accepted, its first startup packet read, and
	// it is answered with an ErrorResponse SQLSTATE 53300 "too many
	// connections" and closed, as PostgreSQL does; a CancelRequest is still
	// served. Default: 10000.
	MaxConns int

	// KeepAlive is the TCP keep-alive period; negative disables keep-alive.
	// Default: 15s.
	KeepAlive time.Duration
}

// refuseTimeout bounds how long a refused connection may take to send its
// startup packet before it is dropped without an answer.
const refuseTimeout = 5 * time.Second

// Server is a TCP front. Create it with New, then call Listen, Serve and
// finally Shutdown. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config
	handler front.Handler
	logger  *slog.Logger
	m       metrics

	// baseCtx is the context handed to handlers. It is cancelled only when
	// Shutdown gives up waiting, so that stopping the accept loop never
	// interrupts running sessions; draining them is the handler's job.
	baseCtx    context.Context
	cancelBase context.CancelFunc

	mu       sync.Mutex
	ln       net.Listener
	conns    map[net.Conn]struct{} // admitted and refused connections alive
	active   int                   // admitted connections, compared with MaxConns
	closing  bool
	serving  bool
	wg       sync.WaitGroup // one per connection goroutine
	serveEnd chan struct{}  // closed when Serve's accept loop returns
}

// New checks cfg, fills defaults and registers the front's metrics with reg
// (nil means no registration). A nil logger discards logs.
func New(cfg Config, h front.Handler, logger *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if h == nil {
		return nil, errors.New("tcpfront: nil handler")
	}
	if cfg.Addr == "" {
		return nil, errors.New("tcpfront: empty listen address")
	}
	if cfg.MaxConns < 0 {
		return nil, fmt.Errorf("tcpfront: negative max connections %d", cfg.MaxConns)
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.RequireTLS && cfg.TLSConfig == nil {
		return nil, errors.New("tcpfront: require TLS needs a TLS configuration")
	}
	if cfg.TLSConfig != nil && len(cfg.TLSConfig.Certificates) == 0 && cfg.TLSConfig.GetCertificate == nil && cfg.TLSConfig.GetConfigForClient == nil {
		return nil, errors.New("tcpfront: TLS configuration has no certificate")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m := newMetrics()
	if reg != nil {
		if err := m.register(reg); err != nil {
			return nil, fmt.Errorf("tcpfront: register metrics: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		cfg:        cfg,
		handler:    h,
		logger:     logger,
		m:          m,
		baseCtx:    ctx,
		cancelBase: cancel,
		conns:      make(map[net.Conn]struct{}),
		serveEnd:   make(chan struct{}),
	}, nil
}

// Listen opens the listening socket, so that the address is known (and
// clients can connect) before Serve runs.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return net.ErrClosed
	}
	if s.ln != nil {
		return errors.New("tcpfront: already listening")
	}
	lc := net.ListenConfig{KeepAlive: s.cfg.KeepAlive}
	ln, err := lc.Listen(context.Background(), "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("tcpfront: listen %s: %w", s.cfg.Addr, err)
	}
	s.ln = ln
	return nil
}

// Addr returns the listening address, or nil before Listen.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Serve accepts connections until ctx is cancelled or Shutdown is called,
// and returns nil in both cases. Sessions already running are not affected
// by ctx; Shutdown drains them. Serve must be called once, after Listen.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	ln := s.ln
	closing := s.closing
	serving := s.serving
	if ln != nil && !closing && !serving {
		s.serving = true
	}
	s.mu.Unlock()
	switch {
	case closing:
		return nil
	case ln == nil:
		return errors.New("tcpfront: Serve called before Listen")
	case serving:
		return errors.New("tcpfront: Serve called twice")
	}
	defer close(s.serveEnd)

	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()

	var backoff time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || s.isClosing() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Resource exhaustion (EMFILE, ENFILE, ENOBUFS) is usually
			// transient: back off instead of spinning or giving up.
			if backoff == 0 {
				backoff = 5 * time.Millisecond
			} else {
				backoff = min(2*backoff, time.Second)
			}
			s.logger.Warn("tcp accept failed; retrying", "err", err, "delay", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
			continue
		}
		backoff = 0
		s.m.accepted.Inc()
		s.admit(conn)
	}
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// admit starts the goroutine for a newly accepted connection: a session if
// there is room, a refusal otherwise.
func (s *Server) admit(conn net.Conn) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = conn.Close()
		return
	}
	refuse := s.active >= s.cfg.MaxConns
	if !refuse {
		s.active++
		s.m.connections.Inc()
	}
	s.conns[conn] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()

	if refuse {
		go s.refuse(conn)
		return
	}
	go s.session(conn)
}

// release forgets conn and closes it.
func (s *Server) release(conn net.Conn, admitted bool) {
	_ = conn.Close()
	s.mu.Lock()
	delete(s.conns, conn)
	if admitted {
		s.active--
		s.m.connections.Dec()
	}
	s.mu.Unlock()
	s.wg.Done()
}

func (s *Server) session(conn net.Conn) {
	defer s.release(conn, true)
	peer := front.Peer{
		Addr:       conn.RemoteAddr(),
		Transport:  "tcp",
		RequireTLS: s.cfg.RequireTLS,
		Probe:      newProbe(conn),
	}
	// The session's own reads and writes (under TLS too) are raw system
	// calls: see internal/rawsock. An idle session waits for its client
	// without a read buffer (withWait).
	stream := withWait(rawsock.Wrap(conn), conn)
	if s.cfg.TLSConfig != nil {
		tlsCfg := s.cfg.TLSConfig
		peer.StartTLS = func(ctx context.Context) (io.ReadWriteCloser, error) {
			tc := tls.Server(stream, tlsCfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				return nil, fmt.Errorf("tcpfront: TLS handshake with %s: %w", conn.RemoteAddr(), err)
			}
			return tc, nil
		}
	}
	if err := s.handler.Serve(s.baseCtx, stream, peer); err != nil && !isQuietEnd(err) {
		s.logger.Debug("tcp session ended", "remote", conn.RemoteAddr(), "err", err)
	}
}

// isQuietEnd reports errors that are an ordinary way for a session to end
// and not worth a log line.
func isQuietEnd(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, context.Canceled)
}

// refuse answers a connection beyond MaxConns the way PostgreSQL answers one
// beyond max_connections: it reads the startup packet (answering an
// SSLRequest with the TLS handshake when TLS is configured, 'N' otherwise,
// and a GSSENCRequest with 'N'), then sends a FATAL ErrorResponse with
// SQLSTATE 53300. Reading first matters: closing a socket with unread input
// makes the kernel send a reset, which can destroy the error before the
// client reads it.
//
// A CancelRequest is served instead, as PostgreSQL serves one whatever its
// connection count: it is short-lived, and a client whose own session fills
// the last slot must still be able to cancel that session's query. The
// packet is handed to the handler, which forwards it and closes the
// connection.
func (s *Server) refuse(conn net.Conn) {
	defer s.release(conn, false)
	_ = conn.SetDeadline(time.Now().Add(refuseTimeout))
	ctx, cancel := context.WithTimeout(s.baseCtx, refuseTimeout)
	stream, cancelReq, err := limitStartup(ctx, conn, s.cfg.TLSConfig)
	cancel()
	if err == nil && cancelReq != nil {
		s.m.cancelsAtLimit.Inc()
		peer := front.Peer{Addr: conn.RemoteAddr(), Transport: "tcp", Secure: stream != conn}
		if err := s.handler.Serve(s.baseCtx, newReplayConn(stream, cancelReq), peer); err != nil && !isQuietEnd(err) {
			s.logger.Debug("cancel request at the connection limit", "remote", conn.RemoteAddr(), "err", err)
		}
		return
	}
	s.m.refused.Inc()
	if err == nil {
		_, err = stream.Write(tooManyResponse)
	}
	if err != nil {
		s.logger.Debug("refusing tcp connection", "remote", conn.RemoteAddr(), "err", err)
		return
	}
	// Wait (bounded by the deadline) for the client to close first, so our
	// close does not reset a connection whose error is still unread.
	if tc, ok := stream.(*tls.Conn); ok {
		_ = tc.CloseWrite() // close_notify
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(stream, 1<<16))
}

// Shutdown stops accepting, then waits until every connection's handler has
// returned or ctx expires. On expiry it cancels the handlers' context, closes
// the remaining connections, waits for their handlers to return, and reports
// ctx's error. Shutdown does not ask sessions to end by itself: drain them
// through the handler (pooler.Shutdown) concurrently or beforehand.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	ln := s.ln
	serving := s.serving
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	if serving {
		// admit checks closing under the lock, so no connection starts
		// after this; waiting for the loop just makes Serve's return
		// happen before Shutdown's.
		select {
		case <-s.serveEnd:
		case <-ctx.Done():
		}
	}

	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		s.cancelBase()
		return nil
	case <-ctx.Done():
		select {
		case <-done: // finished just as the grace period ended
			s.cancelBase()
			return nil
		default:
		}
	}

	s.cancelBase()
	s.mu.Lock()
	n := len(s.conns)
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.logger.Warn("tcp front shutdown grace expired; closed connections", "conns", n)
	<-done
	return ctx.Err()
}
