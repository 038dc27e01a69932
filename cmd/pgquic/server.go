package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/quic-go/quic-go"
	"golang.org/x/sync/errgroup"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/internal/pgcluster"
	"github.com/pgquic/pgquic/pooler"
	"github.com/pgquic/pgquic/quicfront"
	"github.com/pgquic/pgquic/tcpfront"
)

// embeddedStartTimeout bounds initdb plus the first start of the throwaway
// PostgreSQL used when no backend is configured.
const embeddedStartTimeout = 2 * time.Minute

// frontGraceExtra is how much longer the fronts wait for their handlers than
// the pooler waits for open transactions: the pooler cuts sessions off at
// the grace period, and the fronts then only need to see the handlers return.
const frontGraceExtra = 5 * time.Second

// server is a running `pgquic serve`: every component built from one
// config.Config, listening and ready to serve.
type server struct {
	cfg    *config.Config
	logger *slog.Logger
	reg    *prometheus.Registry

	cluster *pgcluster.Cluster // throwaway PostgreSQL, nil when a backend is configured
	pooler  *pooler.Pooler
	tcp     *tcpfront.Server  // nil when disabled
	quic    *quicfront.Server // nil when disabled
	metrics *metricsServer    // nil when disabled
	health  *health

	// shutdownReq is closed by the admin console's SHUTDOWN, which Run
	// treats as it treats SIGTERM.
	shutdownReq  chan struct{}
	shutdownOnce sync.Once
	serveArgs    serveArgsRef // the serve command line, for the console's RELOAD; nil in tests

	bmetrics *backend.Metrics // shared by every Manager the server has had
	retiring sync.WaitGroup   // Managers a reload replaced, still closing

	force     chan struct{} // closed by Force
	forceOnce sync.Once

	live reloadable // what a configuration reload replaces (reload.go)

	tcpTLS *tls.Config // the TCP front's TLS configuration, nil without TLS
}

// errForced is Run's result when Force cut the drain short.
var errForced = errors.New("shutdown forced before open transactions finished")

// Force cuts a shutdown short: sessions still open are ended at once, the
// requests they were running cancelled on the server, and their server
// connections closed. runServe calls it on a second SIGINT or SIGTERM.
func (s *server) Force() {
	s.forceOnce.Do(func() {
		s.logger.Warn("second signal: forcing shutdown, open transactions are cut off")
		close(s.force)
	})
}

// startServer builds every component from cfg (which must be valid, with
// defaults applied), opens all listeners and logs the one "ready" line. On
// error everything built so far is torn down. ctx bounds the start only.
func startServer(ctx context.Context, cfg *config.Config, logger *slog.Logger) (_ *server, err error) {
	s := &server{cfg: cfg, logger: logger, reg: prometheus.NewRegistry(), shutdownReq: make(chan struct{}), force: make(chan struct{})}
	defer func() {
		if err != nil {
			s.closeBackends()
		}
	}()
	s.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)

	routes, err := s.routes(ctx)
	if err != nil {
		return nil, err
	}
	tlsConf, err := loadTLS(cfg)
	if err != nil {
		return nil, err
	}
	authn, err := newAuthenticator(cfg)
	if err != nil {
		return nil, err
	}
	edges, err := loadEdgeTrust(cfg)
	if err != nil {
		return nil, err
	}
	s.live.cfg.Store(cfg)
	s.live.authn.Store(authn)
	s.live.edges.Store(edges)
	if tlsConf != nil {
		s.live.cert.Store(&tlsConf.Certificates[0])
	}

	s.bmetrics = backend.NewMetrics(s.reg)
	mgr, err := s.newManager(ctx, cfg, routes)
	if err != nil {
		return nil, err
	}
	s.live.manager.Store(mgr)
	s.pooler, err = pooler.New(pooler.Config{
		Mode:                   pooler.Mode(cfg.Mode),
		MaxClients:             cfg.MaxClientConn,
		MaxStartingClients:     cfg.MaxStartingClients,
		MaxStartingPerSource:   cfg.MaxStartingPerSource,
		MaxMessageLen:          cfg.MaxMessageBytes,
		StartupTimeout:         cfg.StartupTimeout,
		AcquireTimeout:         cfg.AcquireTimeout,
		IdleTransactionTimeout: cfg.IdleTransactionTimeout,
		ClientIdleTimeout:      cfg.ClientIdleTimeout,
		QueryTimeout:           cfg.QueryTimeout,
		StatementCacheSize:     cfg.StatementCacheSize,
		PipelineDepth:          cfg.PipelineDepth,
		PipelineFastThreshold:  cfg.PipelineFastThreshold,
		CatalogRefresh:         cfg.CatalogRefresh,
		PipelineBusyOnly:       cfg.PipelineWhen == "busy",
		ClientStatementBytes:   cfg.ClientStatementBytes,
		RoleChanges:            pooler.RoleChangePolicy(cfg.RoleChanges),
		SessionState:           pooler.SessionStatePolicy(cfg.SessionState),
		Auth:                   &s.live,
		EdgeTrust:              &s.live,
		ZeroRTT:                &s.live,
	}, &s.live, logger.With("component", "pooler"), s.reg)
	if err != nil {
		return nil, fmt.Errorf("pooler: %w", err)
	}
	s.pooler.SetConsole(s.newConsole())

	if cfg.TCPListen != "" {
		var ttls *tls.Config
		if tlsConf != nil {
			// The TCP front takes the certificate a reload last loaded.
			// Clone keeps the session-ticket keys shared by replicas.
			ttls = tlsConf.Clone()
			ttls.Certificates = nil
			ttls.GetCertificate = s.live.certificate
			s.tcpTLS = ttls // a reload rotates its ticket keys
		}
		s.tcp, err = tcpfront.New(tcpfront.Config{
			Addr:       cfg.TCPListen,
			TLSConfig:  ttls,
			RequireTLS: cfg.RequireTLS,
			MaxConns:   cfg.MaxClientConn,
		}, s.pooler, logger.With("component", "tcp"), s.reg)
		if err != nil {
			return nil, err
		}
	}
	if cfg.QUICListen != "" {
		var qtls *tls.Config
		if tlsConf != nil {
			qtls = tlsConf.Clone()
		}
		var resetKey *quic.StatelessResetKey
		if cfg.QUICStatelessResetKeyFile != "" {
			if resetKey, err = loadResetKey(cfg.QUICStatelessResetKeyFile); err != nil {
				return nil, err
			}
		}
		s.quic, err = quicfront.NewServer(quicfront.ServerConfig{
			Addr:               cfg.QUICListen,
			TLSConfig:          qtls,
			ALPN:               cfg.ALPN,
			MaxConns:           cfg.QUICMaxConns,
			MaxConnsPerSource:  cfg.QUICMaxConnsPerSource,
			FirstStreamTimeout: cfg.StartupTimeout,
			MaxStreamsPerConn:  cfg.QUICMaxStreams,
			StatelessResetKey:  resetKey,
			ServerID:           cfg.QUICServerID,
			Allow0RTT:          cfg.AnyZeroRTT(),
		}, s.pooler, logger.With("component", "quic"), s.reg)
		if err != nil {
			return nil, err
		}
	}
	var backendURLs []string
	for _, r := range routes {
		backendURLs = append(backendURLs, r.ConnString)
	}
	if s.health, err = newHealth(backendURLs); err != nil {
		return nil, err
	}
	if cfg.MetricsListen != "" {
		s.metrics = newMetricsServer(s.reg, s.health)
	}

	// Listen last, so a configuration error never leaves a half-open port.
	if s.tcp != nil {
		if err := s.tcp.Listen(); err != nil {
			return nil, err
		}
	}
	if s.quic != nil {
		if err := s.quic.Listen(); err != nil {
			s.closeListeners()
			return nil, err
		}
	}
	if s.metrics != nil {
		if err := s.metrics.Listen(cfg.MetricsListen); err != nil {
			if cfg.Explicit.MetricsListen {
				s.closeListeners()
				return nil, fmt.Errorf("%w: pass --metrics-listen (metrics_listen) a free address, or --metrics-listen '' to run without metrics", err)
			}
			// The default address is a convenience, not something an
			// operator asked for: a second instance on the host should
			// still serve clients.
			logger.Warn("metrics disabled: the default metrics address cannot be bound (another pgquic serve on this host?); "+
				"pass --metrics-listen with a free address to serve them, or --metrics-listen '' to silence this",
				"addr", cfg.MetricsListen, "err", err)
			s.metrics = nil
		}
	}
	s.logReady()
	return s, nil
}

// routes turns the configured databases and wildcard backend into backend
// routes, starting a throwaway PostgreSQL when neither is configured.
func (s *server) routes(ctx context.Context) ([]backend.Route, error) {
	cfg := s.cfg
	if cfg.Backend == "" && len(cfg.Databases) == 0 {
		startCtx, cancel := context.WithTimeout(ctx, embeddedStartTimeout)
		defer cancel()
		s.logger.Info("no backend configured; starting a throwaway PostgreSQL")
		c, err := pgcluster.Start(startCtx, pgcluster.Options{Logger: s.logger.With("component", "pgcluster")})
		if err != nil {
			return nil, fmt.Errorf("start throwaway PostgreSQL (pass --backend to use your own): %w", err)
		}
		s.cluster = c
		s.logger.Info("throwaway PostgreSQL running; it is deleted at exit", "url", config.RedactConnString(c.SuperURL("postgres")), "data_dir", c.DataDir)
	}
	return s.routesFor(cfg), nil
}

// routesFor turns cfg's databases and wildcard backend into backend routes;
// with neither, the wildcard route goes to the throwaway PostgreSQL.
func (s *server) routesFor(cfg *config.Config) []backend.Route {
	var routes []backend.Route
	for _, d := range cfg.Databases {
		routes = append(routes, backend.Route{
			Database: d.Name,
			User:     d.User,
			PoolConfig: backend.PoolConfig{
				ConnString: d.Backend,
				PoolSize:   d.EffectivePoolSize(cfg),
				MinPool:    d.EffectiveMinPool(cfg),
			},
		})
	}
	wildcard := cfg.Backend
	if wildcard == "" && len(cfg.Databases) == 0 && s.cluster != nil {
		wildcard = s.cluster.SuperURL("postgres")
	}
	if wildcard != "" {
		routes = append(routes, backend.Route{
			Database: "*",
			PoolConfig: backend.PoolConfig{
				ConnString: wildcard,
				PoolSize:   cfg.PoolSize,
			},
		})
	}
	return routes
}

// newManager opens the server pools of cfg's routes, with the server's
// shared backend metrics.
func (s *server) newManager(ctx context.Context, cfg *config.Config, routes []backend.Route) (*backend.Manager, error) {
	m, err := backend.NewManager(ctx, backend.ManagerConfig{
		Routes: routes,
		Defaults: backend.PoolConfig{
			PoolSize:          cfg.PoolSize,
			ConnectTimeout:    cfg.ServerConnectTimeout,
			ServerLifetime:    cfg.ServerLifetime,
			ServerIdleTimeout: cfg.ServerIdleTimeout,
		},
		MaxPools:        cfg.MaxPools,
		PoolIdleTimeout: cfg.PoolIdleTimeout,
		Metrics:         s.bmetrics,
	}, s.logger.With("component", "backend"), nil)
	if err != nil {
		return nil, fmt.Errorf("backend: %w", err)
	}
	return m, nil
}

// loadTLS reads the certificate pair, or returns nil when none is
// configured (TCP then answers SSLRequest with 'N' and QUIC generates its
// own certificate).
func loadTLS(cfg *config.Config) (*tls.Config, error) {
	if cfg.TLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if cfg.TLSSessionTicketKeysFile != "" {
		keys, err := loadTicketKeys(cfg.TLSSessionTicketKeysFile)
		if err != nil {
			return nil, err
		}
		// Clone keeps the keys, so the QUIC front's copy uses them too.
		tc.SetSessionTicketKeys(keys)
	}
	return tc, nil
}

// newAuthenticator builds the client authenticator, reading the userlist
// when the method needs one.
func newAuthenticator(cfg *config.Config) (*pgauth.Authenticator, error) {
	method, err := pgauth.ParseMethod(cfg.Auth.Method)
	if err != nil {
		return nil, err
	}
	ac := pgauth.Config{Method: method, TrustLoopbackOnly: cfg.Auth.TrustLoopbackOnly}
	if cfg.Auth.File != "" {
		if ac.Users, err = pgauth.LoadUserlist(cfg.Auth.File); err != nil {
			return nil, fmt.Errorf("auth file: %w", err)
		}
	}
	a, err := pgauth.New(ac)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// loadEdgeTrust reads the edge_trust file, nil when none is configured
// (no certificate is trusted).
func loadEdgeTrust(cfg *config.Config) (*pgauth.EdgeTrust, error) {
	if cfg.EdgeTrust == "" {
		return nil, nil
	}
	return pgauth.LoadEdgeTrust(cfg.EdgeTrust)
}

func (s *server) logReady() {
	attrs := []any{"mode", s.cfg.Mode, "auth", s.cfg.Auth.Method}
	if s.tcp != nil {
		attrs = append(attrs, "tcp", s.tcp.Addr().String(), "tcp_tls", s.cfg.TLSCert != "")
	} else {
		attrs = append(attrs, "tcp", "disabled")
	}
	if s.quic != nil {
		attrs = append(attrs, "quic", s.quic.Addr().String(), "alpn", s.cfg.ALPN)
		if fp := s.quic.Fingerprint(); fp != "" {
			attrs = append(attrs, "quic_fingerprint", fp)
		}
	} else {
		attrs = append(attrs, "quic", "disabled")
	}
	if n := s.live.edges.Load().Len(); n > 0 {
		attrs = append(attrs, "trusted_edges", n)
	}
	if s.metrics != nil {
		attrs = append(attrs, "metrics", "http://"+s.metrics.Addr().String()+"/metrics")
	} else {
		attrs = append(attrs, "metrics", "disabled")
	}
	s.logger.Info("pgquic ready", attrs...)
}

// Run serves until ctx is done or a component fails, then shuts down:
// the fronts stop accepting, the pooler drains (idle sessions close at once,
// open transactions get cfg.ShutdownGrace to finish), the backend pools and
// any throwaway PostgreSQL are closed. It returns nil after a shutdown
// caused by ctx and the first component error otherwise.
func (s *server) Run(ctx context.Context) error {
	// serveCtx is never the signal context: quicfront cuts sessions hard
	// when its Serve context ends, and draining must come first.
	serveCtx, cancelServe := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelServe()
	failed := make(chan error, 3)
	stopping := make(chan struct{})

	var g errgroup.Group
	actor := func(name string, serve func() error) {
		g.Go(func() error {
			err := serve()
			select {
			case <-stopping:
				return nil // an expected end during shutdown
			default:
			}
			if err == nil {
				err = errors.New("stopped unexpectedly")
			}
			err = fmt.Errorf("%s: %w", name, err)
			failed <- err
			return err
		})
	}
	if s.tcp != nil {
		actor("tcp front", func() error { return s.tcp.Serve(serveCtx) })
	}
	if s.quic != nil {
		actor("quic front", func() error { return s.quic.Serve(serveCtx) })
	}
	if s.metrics != nil {
		actor("metrics server", s.metrics.Serve)
	}
	s.health.serving.Store(true)

	var failure error
	select {
	case <-ctx.Done():
		s.logger.Info("shutting down", "grace", s.live.cfg.Load().ShutdownGrace)
	case <-s.shutdownReq:
		s.logger.Info("shutting down: SHUTDOWN from the admin console", "grace", s.live.cfg.Load().ShutdownGrace)
	case failure = <-failed:
		s.logger.Error("shutting down after a failure", "err", failure)
	}
	close(stopping)
	s.health.draining.Store(true)
	s.shutdown()
	cancelServe()
	_ = g.Wait() // failures after stopping began are expected and not reported
	if failure == nil {
		select {
		case <-s.force:
			failure = errForced
		default:
		}
	}
	return failure
}

// shutdown drains and closes every component, within the grace period.
func (s *server) shutdown() {
	start := time.Now()
	grace := s.live.cfg.Load().ShutdownGrace
	poolCtx, cancelPool := context.WithTimeout(context.Background(), grace)
	defer cancelPool()
	frontCtx, cancelFront := context.WithTimeout(context.Background(), grace+frontGraceExtra)
	defer cancelFront()
	drained := make(chan struct{})
	defer close(drained)
	go func() {
		select {
		case <-s.force:
			cancelPool()
			cancelFront()
		case <-drained:
		}
	}()

	var g errgroup.Group
	if s.tcp != nil {
		g.Go(func() error { return s.tcp.Shutdown(frontCtx) })
	}
	if s.quic != nil {
		g.Go(func() error { return s.quic.Shutdown(frontCtx) })
	}
	g.Go(func() error { return s.pooler.Shutdown(poolCtx) })
	if err := g.Wait(); err != nil {
		s.logger.Warn("sessions cut off at the end of the grace period", "err", err)
	}
	if s.metrics != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.metrics.Shutdown(ctx)
		cancel()
	}
	s.closeBackends()
	s.logger.Info("shutdown complete", "took", time.Since(start).Round(time.Millisecond))
}

// closeListeners releases listeners opened by a start that then failed.
func (s *server) closeListeners() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing is being served yet: close at once
	if s.tcp != nil {
		_ = s.tcp.Shutdown(ctx)
	}
	if s.quic != nil {
		_ = s.quic.Shutdown(ctx)
	}
	if s.metrics != nil {
		s.metrics.Shutdown(ctx)
	}
}

// closeBackends closes the server pools (those a reload replaced too) and
// stops a throwaway PostgreSQL.
func (s *server) closeBackends() {
	s.live.mu.Lock()
	s.live.closed = true
	s.live.mu.Unlock()
	if m := s.live.manager.Swap(nil); m != nil {
		m.Close()
	}
	s.retiring.Wait()
	if s.cluster != nil {
		if err := s.cluster.Stop(); err != nil {
			s.logger.Warn("stopping throwaway PostgreSQL", "err", err)
		}
		s.cluster = nil
	}
}

// metricsServer serves the Prometheus registry at /metrics and, for `pgquic
// serve`, the health endpoints /healthz and /readyz (h nil: none).
type metricsServer struct {
	srv *http.Server
	ln  net.Listener
}

func newMetricsServer(reg *prometheus.Registry, h *health) *metricsServer {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if h != nil {
		h.register(mux)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "pgquic: metrics at /metrics, liveness at /healthz, readiness at /readyz")
	})
	return &metricsServer{srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
	}}
}

// Listen binds addr.
func (m *metricsServer) Listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: cannot listen on %s: %w", addr, err)
	}
	m.ln = ln
	return nil
}

// Addr returns the bound address.
func (m *metricsServer) Addr() net.Addr { return m.ln.Addr() }

// Serve serves until Shutdown and then returns nil.
func (m *metricsServer) Serve() error {
	if err := m.srv.Serve(m.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops the HTTP server, closing the listener even if Serve never
// ran.
func (m *metricsServer) Shutdown(ctx context.Context) {
	if err := m.srv.Shutdown(ctx); err != nil {
		_ = m.srv.Close()
	}
	if m.ln != nil {
		_ = m.ln.Close()
	}
}
