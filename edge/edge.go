// Package edge is pgquic's edge sidecar: it lets any libpq client (psql,
// pgbench, an application in another language) use the QUIC transport. Every
// TCP connection accepted on a local port becomes one stream to the pooler,
// opened by a quicclient.Dialer; SSLRequest and GSSENCRequest are answered
// 'N' locally, since QUIC already encrypts the path and the local hop is
// loopback. `pgquic edge` runs it.
package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/defaults"
	"github.com/pgquic/pgquic/internal/localstart"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/quicwire"
	"github.com/pgquic/pgquic/internal/rawsock"
	"github.com/pgquic/pgquic/quicclient"
)

// DefaultStartupTimeout (10 s) bounds how long a local client may take to
// send its startup packet.
const DefaultStartupTimeout = defaults.EdgeStartupTimeout

// Config configures the edge sidecar.
type Config struct {
	// Listen is the local TCP address, e.g. 127.0.0.1:5433. Required.
	Listen string
	// Dialer carries the sessions to the pooler. Required; the edge does not
	// close it.
	Dialer *quicclient.Dialer
	// StartupTimeout bounds how long a local client may take to send its
	// startup packet, and then how long opening its stream may take.
	// Default 10s.
	StartupTimeout time.Duration
	// LocalAuth, when set, makes the edge authenticate its local clients
	// itself, with pgauth's methods and userlist as serve does, before it
	// opens a stream: a wrong password gets 28P01 here and the pooler hears
	// nothing. The pooler must then trust the Dialer's certificate as an
	// edge for those users (serve --edge-trust); a pooler that asks for a
	// password refuses the session (28000). The edge hands out its own
	// BackendKeyData and routes cancels with it. Default nil: every byte is
	// passed through and the pooler authenticates.
	LocalAuth *pgauth.Authenticator
	// LocalStartup (with LocalAuth) answers a startup locally once a
	// greeting for the same user, database and startup parameters was
	// seen, and sends the StartupMessage and the first request to the
	// pooler in one flight (internal/localstart): a new session's first row
	// one round trip away. Default false.
	LocalStartup bool
}

// Edge is the sidecar: a local TCP listener whose every connection becomes
// one stream to the pooler. Create it with New, then call Listen, Serve and
// finally Shutdown.
type Edge struct {
	cfg Config
	log *slog.Logger

	sessions      prometheus.Gauge
	sessionsTotal prometheus.Counter
	dialErrors    prometheus.Counter

	local         *localstart.Server // nil without LocalAuth
	authFailures  prometheus.Counter
	localStartups prometheus.Counter

	baseCtx    context.Context
	baseCancel context.CancelFunc

	mu       sync.Mutex
	ln       net.Listener
	active   map[*edgeSession]struct{}
	draining bool
	stopped  chan struct{}
	wg       sync.WaitGroup
}

// edgeSession is one proxied client: its TCP connection and, once dialed,
// its stream.
type edgeSession struct {
	tcp net.Conn
	str *quicwire.Conn // guarded by Edge.mu
}

// New validates cfg. logger nil discards logs; reg nil skips metric
// registration.
func New(cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Edge, error) {
	if cfg.Listen == "" {
		return nil, errors.New("edge: Config.Listen is required")
	}
	if cfg.Dialer == nil {
		return nil, errors.New("edge: Config.Dialer is required")
	}
	if cfg.StartupTimeout == 0 {
		cfg.StartupTimeout = DefaultStartupTimeout
	}
	if cfg.LocalAuth == nil && cfg.Dialer.CertFingerprint() != "" {
		// A pooler that trusts the certificate asks no password: passing
		// local clients through would let anyone who reaches Listen in.
		return nil, errors.New("edge: the Dialer presents a client certificate, so LocalAuth is required: the edge must authenticate the clients the pooler will trust")
	}
	if cfg.LocalStartup && cfg.LocalAuth == nil {
		return nil, errors.New("edge: LocalStartup needs LocalAuth: the edge answers only clients it authenticated")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	e := &Edge{
		cfg: cfg, log: logger,
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "pgquic", Subsystem: "edge",
			Name: "sessions", Help: "Local client connections currently proxied over QUIC."}),
		sessionsTotal: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "pgquic", Subsystem: "edge",
			Name: "sessions_total", Help: "Local client connections accepted."}),
		dialErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "pgquic", Subsystem: "edge",
			Name: "dial_errors_total", Help: "Sessions that could not open a stream to the pooler."}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "pgquic", Subsystem: "edge",
			Name: "auth_failures_total", Help: "Local clients refused by the edge's own authentication (LocalAuth)."}),
		localStartups: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "pgquic", Subsystem: "edge",
			Name: "local_startups_total", Help: "Sessions whose startup the edge answered locally (LocalStartup)."}),
		active:  map[*edgeSession]struct{}{},
		stopped: make(chan struct{}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{e.sessions, e.sessionsTotal, e.dialErrors, e.authFailures, e.localStartups} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("edge: register metrics: %w", err)
			}
		}
	}
	e.baseCtx, e.baseCancel = context.WithCancel(context.Background())
	if cfg.LocalAuth != nil {
		var err error
		e.local, err = localstart.New(localstart.Config{Dial: cfg.Dialer.Dial, Timeout: cfg.StartupTimeout,
			Ordinary: !cfg.LocalStartup, Greetings: cfg.Dialer.GreetingStore()}, logger)
		if err != nil {
			return nil, fmt.Errorf("edge: %w", err)
		}
	}
	return e, nil
}

// ErrClosed is returned by Listen once the edge was shut down.
var ErrClosed = errors.New("edge: closed")

// Listen binds the local TCP listener.
func (e *Edge) Listen() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.draining {
		return ErrClosed
	}
	if e.ln != nil {
		return errors.New("edge: Listen called twice")
	}
	ln, err := net.Listen("tcp", e.cfg.Listen)
	if err != nil {
		return fmt.Errorf("edge: listen %s: %w", e.cfg.Listen, err)
	}
	e.ln = ln
	e.log.Info("edge listening", "addr", ln.Addr().String(), "pooler", e.cfg.Dialer.Addr())
	return nil
}

// Addr returns the bound TCP address, or nil before Listen.
func (e *Edge) Addr() net.Addr {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ln == nil {
		return nil
	}
	return e.ln.Addr()
}

// Serve accepts local clients until ctx ends or Shutdown is called. When ctx
// ends, every session is cut and Serve returns after their goroutines ended;
// after Shutdown it returns at once and Shutdown drains.
func (e *Edge) Serve(ctx context.Context) error {
	e.mu.Lock()
	ln := e.ln
	e.mu.Unlock()
	if ln == nil {
		return errors.New("edge: Serve called before Listen")
	}
	watchDone := make(chan struct{})
	defer close(watchDone)
	go func() {
		select {
		case <-ctx.Done():
			_ = ln.Close()
		case <-e.stopped:
		case <-watchDone:
		}
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				e.stop()
				e.cutAll()
				e.wg.Wait()
				return nil
			}
			select {
			case <-e.stopped:
				return nil
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			e.stop()
			e.cutAll()
			e.wg.Wait()
			return fmt.Errorf("edge: accept: %w", err)
		}
		s := &edgeSession{tcp: c}
		e.mu.Lock()
		if e.draining {
			e.mu.Unlock()
			_ = c.Close()
			continue
		}
		e.active[s] = struct{}{}
		e.wg.Add(1)
		e.mu.Unlock()
		e.sessions.Inc()
		e.sessionsTotal.Inc()
		go e.run(s)
	}
}

// run proxies one local client.
func (e *Edge) run(s *edgeSession) {
	defer func() {
		e.mu.Lock()
		delete(e.active, s)
		e.mu.Unlock()
		e.sessions.Dec()
		e.wg.Done()
	}()
	defer s.tcp.Close()
	log := e.log.With("client", s.tcp.RemoteAddr().String())
	if e.local != nil {
		e.runLocal(s, log)
		return
	}

	packets, code, err := localstart.ReadFirst(s.tcp, e.cfg.StartupTimeout)
	if err != nil {
		log.Debug("edge: no usable startup packet", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(e.baseCtx, e.cfg.StartupTimeout)
	nc, err := e.cfg.Dialer.Dial(ctx)
	cancel()
	if err != nil {
		e.dialErrors.Inc()
		log.Warn("edge: cannot open a stream to the pooler", "err", err)
		if code != pgproto.CancelRequestCode {
			e.sendError(s.tcp, err)
		}
		return
	}
	str := nc.(*quicwire.Conn)
	e.mu.Lock()
	s.str = str
	cut := e.baseCtx.Err() != nil
	e.mu.Unlock()
	if cut {
		str.Abort(pgproto.QUICAborted)
		return
	}
	if _, err := str.Write(packets); err != nil {
		str.Abort(pgproto.QUICAborted)
		log.Debug("edge: forwarding startup packet failed", "err", err)
		return
	}
	e.pipe(s.tcp, str)
}

// pipe copies both ways until both directions ended. A clean end of one
// direction is passed on as a half-close (TCP EOF becomes the stream's FIN,
// the stream's EOF becomes TCP's FIN); an error in either direction aborts
// both.
//
// The local socket is read and written with raw system calls
// (internal/rawsock): each query and each reply crosses it once, and a
// net.Conn read or write there would wake the runtime's monitor thread
// whenever the edge was idle just before, as it is between queries at a
// moderate rate.
func (e *Edge) pipe(tcp net.Conn, str *quicwire.Conn) {
	local := rawsock.Wrap(tcp)
	errc := make(chan error, 2)
	go func() {
		_, err := io.Copy(str, local)
		if err == nil {
			err = str.CloseWrite()
		}
		errc <- err
	}()
	go func() {
		_, err := io.Copy(local, str)
		if err == nil {
			if cw, ok := tcp.(interface{ CloseWrite() error }); ok {
				err = cw.CloseWrite()
			}
		}
		errc <- err
	}()
	var failed error
	for range 2 {
		if err := <-errc; err != nil && failed == nil {
			failed = err
			// Abort both sides so the other copy ends too.
			str.Abort(pgproto.QUICAborted)
			_ = tcp.Close()
		}
	}
	if failed == nil {
		_ = str.Close()
	} else {
		e.log.Debug("edge: session aborted", "err", failed)
	}
}

// sendError tells a libpq client why its session cannot start, as a FATAL
// ErrorResponse with SQLSTATE 08006 (connection failure).
func (e *Edge) sendError(c net.Conn, cause error) {
	msg := &pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: pgproto.CodeConnectionFailure,
		Message: "pgquic edge: cannot reach the pooler over QUIC: " + cause.Error()}
	buf, err := msg.Encode(nil)
	if err != nil {
		return
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(buf)
}

// stop marks the edge draining and closes the listener.
func (e *Edge) stop() {
	e.mu.Lock()
	if !e.draining {
		e.draining = true
		close(e.stopped)
	}
	ln := e.ln
	e.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
}

// cutAll aborts every running session.
func (e *Edge) cutAll() {
	e.baseCancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	for s := range e.active {
		_ = s.tcp.Close()
		if s.str != nil {
			s.str.Abort(pgproto.QUICAborted)
		}
	}
}

// Shutdown stops accepting local clients and waits for running sessions to
// end. When ctx expires first, the remaining sessions are cut and Shutdown
// returns ctx's error after their goroutines ended.
func (e *Edge) Shutdown(ctx context.Context) error {
	e.stop()
	done := make(chan struct{})
	go func() {
		e.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		e.baseCancel()
		return nil
	case <-ctx.Done():
		e.cutAll()
		<-done
		return fmt.Errorf("edge: shutdown grace period over: %w", ctx.Err())
	}
}
