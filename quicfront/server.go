package quicfront

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/defaults"
	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/quicwire"
	"github.com/pgquic/pgquic/internal/wire"
)

// Defaults of ServerConfig, applied to zero fields.
const (
	DefaultMaxConns             = defaults.QUICMaxConns
	DefaultMaxStreamsPerConn    = defaults.QUICMaxStreamsPerConn
	DefaultMaxStreams           = defaults.MaxClients
	DefaultStreamStartupTimeout = defaults.QUICStreamStartupTimeout
	DefaultFirstStreamTimeout   = defaults.StartupTimeout
	DefaultIdleTimeout          = defaults.QUICIdleTimeout
	DefaultKeepAlivePeriod      = defaults.QUICKeepAlivePeriod
)

// connIDLen is the length of the connection IDs the server issues: the
// longest QUIC allows (RFC 9000 §17.2) rather than quic-go's default of 4.
// A stateless reset only answers a packet longer than 42 bytes (quic-go's
// MinStatelessResetSize, as RFC 9000 §10.3 wants a reset smaller than its
// trigger), and the client's short-header packets carry this ID: with 4
// bytes a packet holding a small query ("SELECT 1" is 14 bytes) stays
// under the limit, so a client whose replica vanished got no reset from
// the replica taking over and waited for its idle timeout (measured: 60–70
// s); with 20 bytes every packet carrying a query or an ACK is long enough.
// The cost is 16 bytes per packet.
const connIDLen = 20

// minStreamsPerConn is the least stream credit a server grants: clients
// multiplex hundreds of sessions over a few connections, and quic-go's
// default of 100 would make them queue in OpenStreamSync.
const minStreamsPerConn = 1000

// limitSlots bounds the streams beyond MaxStreams whose first packet the
// server still reads (to serve a CancelRequest or answer 53300); further
// streams beyond the limit are reset at once. limitTimeout bounds how long
// such a stream may take to deliver that packet.
const (
	limitSlots   = 64
	limitTimeout = 5 * time.Second
)

// ServerConfig configures the QUIC front end. Zero values take the defaults
// named on each field.
type ServerConfig struct {
	// Addr is the UDP listen address, e.g. 127.0.0.1:6432. Required.
	Addr string
	// TLSConfig holds the server certificate. Nil generates a self-signed
	// ECDSA certificate at start and logs its SHA-256 fingerprint, which
	// clients pin. MinVersion is raised to TLS 1.3 and NextProtos set to ALPN.
	TLSConfig *tls.Config
	// ALPN is the application protocol clients must offer. Default "pgquic/1"
	// (DefaultALPN).
	ALPN string
	// MaxConns bounds concurrent QUIC connections; extra ones are closed with
	// error code too_many_conns (3). Default 1000.
	MaxConns int
	// MaxConnsPerSource bounds the concurrent QUIC connections of one
	// source, as front.Source keys the client's address (an IPv4 address,
	// an IPv6 /64), so one client cannot hold every MaxConns slot; extra
	// ones are closed with error code too_many_conns (3). Default: a
	// quarter of MaxConns, at least 1 (250 with the default MaxConns).
	MaxConnsPerSource int
	// MaxStreamsPerConn is the concurrent stream credit per connection
	// (quic MaxIncomingStreams). Default 1000; smaller values are refused.
	MaxStreamsPerConn int
	// MaxStreams bounds concurrent sessions (streams) across all
	// connections, so MaxConns × MaxStreamsPerConn streams cannot each cost
	// a goroutine, a reader and a session before the pooler's own client
	// limit applies. A stream beyond it does not start a session: its first
	// packet is read (bounded by 5 s and by 64 such streams at a time), a
	// CancelRequest is served, anything else is answered with FATAL 53300
	// "too many connections"; when those 64 slots are busy the stream is
	// reset with error code too_many_streams (6) at once. Default 10000,
	// the pooler's default MaxClients.
	MaxStreams int
	// StreamStartupTimeout is how long a new stream may take to deliver its
	// whole first packet (startup packet); after it the stream is reset with
	// error code startup_timeout (4). Default 10s.
	StreamStartupTimeout time.Duration
	// FirstStreamTimeout is how long an accepted connection may take to
	// open its first stream; a connection that opened none by then is
	// closed with error code no_stream_timeout (7). Keep-alives keep an
	// idle connection from timing out, so without it connections that
	// never start a session would hold their MaxConns slots for good.
	// Default 15s, the pooler's startup timeout (cmd/pgquic passes
	// startup_timeout).
	FirstStreamTimeout time.Duration
	// IdleTimeout is quic MaxIdleTimeout: a connection without any packet for
	// this long is dead. Default 60s.
	IdleTimeout time.Duration
	// KeepAlivePeriod sends a keep-alive when the connection is quiet for this
	// long, well under IdleTimeout and typical UDP NAT timeouts. Default 15s;
	// negative disables keep-alives.
	KeepAlivePeriod time.Duration
	// StatelessResetKey keys the stateless resets the server sends for
	// packets of connections it does not know (RFC 9000, section 10.3).
	// Replicas behind one address must share it: a client whose replica
	// went away then learns so from the first packet another replica (or
	// the restarted one) receives, instead of waiting for IdleTimeout.
	// Default nil: derived from the certificate's private key, so replicas
	// sharing a certificate share it too; with a generated certificate each
	// start has its own key and resets are useless across restarts.
	StatelessResetKey *quic.StatelessResetKey
	// ServerID, 1 to 65535, puts this replica's ID in every connection ID
	// it issues (internal/quiclb's format, after the QUIC-LB draft's
	// plaintext mode), so a balancer that routes by connection ID keeps a
	// connection on its replica after the client's address changed. The
	// ID is visible on the path: an observer learns which replica serves a
	// connection. Default 0: random connection IDs.
	ServerID int
	// Allow0RTT accepts 0-RTT connections. Default false. When on, a
	// stream's session starts as soon as its startup packet arrived, before
	// the handshake completed, with the Peer's HandshakeConfirmed set until
	// it has: the handler decides what may run on replayable data.
	Allow0RTT bool
}

func (c *ServerConfig) populate() error {
	if c.Addr == "" {
		return errors.New("quicfront: ServerConfig.Addr is required")
	}
	if c.ALPN == "" {
		c.ALPN = DefaultALPN
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.MaxConns < 0 {
		return fmt.Errorf("quicfront: MaxConns %d must be positive", c.MaxConns)
	}
	if c.MaxConnsPerSource == 0 {
		c.MaxConnsPerSource = max(1, c.MaxConns/4)
	}
	if c.MaxConnsPerSource < 0 {
		return fmt.Errorf("quicfront: MaxConnsPerSource %d must be positive", c.MaxConnsPerSource)
	}
	if c.MaxStreamsPerConn == 0 {
		c.MaxStreamsPerConn = DefaultMaxStreamsPerConn
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = DefaultMaxStreams
	}
	if c.MaxStreams < 0 {
		return fmt.Errorf("quicfront: MaxStreams %d must be positive", c.MaxStreams)
	}
	if c.MaxStreamsPerConn < minStreamsPerConn {
		return fmt.Errorf("quicfront: MaxStreamsPerConn %d must be at least %d", c.MaxStreamsPerConn, minStreamsPerConn)
	}
	if c.StreamStartupTimeout == 0 {
		c.StreamStartupTimeout = DefaultStreamStartupTimeout
	}
	if c.FirstStreamTimeout == 0 {
		c.FirstStreamTimeout = DefaultFirstStreamTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.KeepAlivePeriod == 0 {
		c.KeepAlivePeriod = DefaultKeepAlivePeriod
	}
	if c.KeepAlivePeriod < 0 {
		c.KeepAlivePeriod = 0
	}
	if c.StreamStartupTimeout < 0 || c.IdleTimeout < 0 || c.FirstStreamTimeout < 0 {
		return errors.New("quicfront: timeouts must not be negative")
	}
	return c.validateServerID()
}

// serverMetrics are the pgquic_quic_* series.
type serverMetrics struct {
	conns        prometheus.Gauge
	streams      prometheus.Gauge
	streamsTotal prometheus.Counter
	connsRefused prometheus.Counter
	// streamsRefused counts streams the server turned away (beyond
	// MaxStreams, or during shutdown); streamsAbandoned counts streams the
	// client gave up on before its session started. One counter for both
	// used to read as refusals when clients merely reset their streams.
	streamsRefused   *prometheus.CounterVec
	streamsAbandoned *prometheus.CounterVec
}

func newServerMetrics(reg prometheus.Registerer) (*serverMetrics, error) {
	m := &serverMetrics{
		conns: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "pgquic", Subsystem: "quic",
			Name: "connections", Help: "QUIC connections currently open."}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "pgquic", Subsystem: "quic",
			Name: "streams", Help: "QUIC streams (sessions) currently open."}),
		streamsTotal: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "pgquic", Subsystem: "quic",
			Name: "streams_total", Help: "QUIC streams accepted."}),
		connsRefused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "pgquic", Subsystem: "quic",
			Name: "connections_refused_total", Help: "QUIC connections refused because MaxConns or MaxConnsPerSource was reached or the server was shutting down."}),
		streamsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pgquic", Subsystem: "quic",
			Name: "streams_refused_total", Help: "QUIC streams the server refused before a session started, by reason: too_many_streams (beyond MaxStreams) or shutdown."}, []string{"reason"}),
		streamsAbandoned: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "pgquic", Subsystem: "quic",
			Name: "streams_abandoned_total", Help: "QUIC streams the client gave up on before a session started, by reason: startup_timeout (no startup packet in time), eof or reset."}, []string{"reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.conns, m.streams, m.streamsTotal, m.connsRefused, m.streamsRefused, m.streamsAbandoned} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("quicfront: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Server is the QUIC front end: it accepts QUIC connections and runs every
// client-initiated bidirectional stream as one PostgreSQL session through the
// Handler.
type Server struct {
	cfg     ServerConfig
	h       front.Handler
	log     *slog.Logger
	m       *serverMetrics
	tlsConf *tls.Config
	quicCfg *quic.Config
	fp      string
	srk     *quic.StatelessResetKey

	// baseCtx is handed to sessions; it is canceled when Serve's context ends
	// or Shutdown's grace period expires.
	baseCtx    context.Context
	baseCancel context.CancelFunc

	mu       sync.Mutex
	udp      *net.UDPConn
	tr       *quic.Transport
	ln       listener
	conns    map[*serverConn]struct{}
	bySource map[string]int // connections per front.Source, for MaxConnsPerSource
	draining bool
	closed   bool
	stopped  chan struct{} // closed when draining starts
	connWG   sync.WaitGroup
	sem      chan struct{}
	streams  chan struct{} // one token per session running (MaxStreams)
	limit    chan struct{} // one token per stream beyond MaxStreams being answered
	connSeq  uint64        // connections accepted, to name them in Peer.Conn; guarded by mu
}

// listener is what *quic.Listener and *quic.EarlyListener share.
type listener interface {
	Accept(context.Context) (*quic.Conn, error)
	Close() error
	Addr() net.Addr
}

// serverConn is the server's book-keeping for one QUIC connection.
type serverConn struct {
	conn   *quic.Conn
	peer   front.Peer // what the handler is told about each of its sessions
	source string     // front.Source of the peer, counted in Server.bySource
	active int        // sessions running; guarded by Server.mu

	certOnce sync.Once
	certs    []*x509.Certificate // the client's certificate chain, set once the handshake completed
}

// clientCerts returns the certificate chain the client presented, leaf
// first and unverified, nil for none. It is called once the handshake
// completed (streamReady), when quic-go knows the peer's certificates.
func (sc *serverConn) clientCerts() []*x509.Certificate {
	sc.certOnce.Do(func() {
		if certs := sc.conn.ConnectionState().TLS.PeerCertificates; len(certs) > 0 {
			sc.certs = certs
		}
	})
	return sc.certs
}

// NewServer validates cfg, fills its defaults and prepares TLS. logger nil
// discards logs; reg nil skips metric registration.
func NewServer(cfg ServerConfig, h front.Handler, logger *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if h == nil {
		return nil, errors.New("quicfront: nil Handler")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := cfg.populate(); err != nil {
		return nil, err
	}
	m, err := newServerMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, h: h, log: logger, m: m, conns: map[*serverConn]struct{}{}, bySource: map[string]int{},
		stopped: make(chan struct{}), sem: make(chan struct{}, cfg.MaxConns),
		streams: make(chan struct{}, cfg.MaxStreams), limit: make(chan struct{}, limitSlots)}
	s.baseCtx, s.baseCancel = context.WithCancel(context.Background())

	var tc *tls.Config
	if cfg.TLSConfig != nil {
		tc = cfg.TLSConfig.Clone()
	} else {
		host, _, _ := net.SplitHostPort(cfg.Addr)
		cert, err := GenerateSelfSigned(host)
		if err != nil {
			return nil, fmt.Errorf("quicfront: %w", err)
		}
		tc = &tls.Config{Certificates: []tls.Certificate{cert}}
		logger.Info("QUIC server uses a generated self-signed certificate; clients must pin it",
			"sha256", quicwire.Fingerprint(cert.Certificate[0]))
	}
	tc.MinVersion = tls.VersionTLS13
	tc.NextProtos = []string{cfg.ALPN}
	if tc.ClientAuth == tls.NoClientCert {
		// Ask every client for a certificate, verify none against a CA
		// here: the handshake still proves the client holds the key of
		// the one it sends, and the pooler decides from the chain
		// (Peer.ClientCerts: by fingerprint, or by verifying it against
		// a CA its edge-trust file names) whether it is a trusted edge. A client
		// without one answers with an empty list and is served as before.
		// Asking always lets a reload add edge trust without a restart.
		tc.ClientAuth = tls.RequestClientCert
	}
	if len(tc.Certificates) > 0 && len(tc.Certificates[0].Certificate) > 0 {
		s.fp = quicwire.Fingerprint(tc.Certificates[0].Certificate[0])
		s.srk = statelessResetKey(&tc.Certificates[0])
	} else if tc.GetCertificate == nil && tc.GetConfigForClient == nil {
		return nil, errors.New("quicfront: TLSConfig has no certificate")
	}
	if cfg.StatelessResetKey != nil {
		k := *cfg.StatelessResetKey
		s.srk = &k
	}
	s.tlsConf = tc
	s.quicCfg = &quic.Config{
		MaxIncomingStreams:    int64(cfg.MaxStreamsPerConn),
		MaxIncomingUniStreams: -1,
		KeepAlivePeriod:       cfg.KeepAlivePeriod,
		MaxIdleTimeout:        cfg.IdleTimeout,
		Allow0RTT:             cfg.Allow0RTT,
		EnableDatagrams:       false,
		Tracer:                quicwire.QlogTracer(),
	}
	return s, nil
}

// Fingerprint returns the hex SHA-256 of the server's leaf certificate, the
// value clients pin; it is empty when certificates come from a callback.
func (s *Server) Fingerprint() string { return s.fp }

// Listen binds the UDP socket, raises its buffers and starts the QUIC
// listener. Serve must be called afterwards to accept connections.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.draining {
		return ErrServerClosed
	}
	if s.ln != nil {
		return errors.New("quicfront: Listen called twice")
	}
	uaddr, err := net.ResolveUDPAddr("udp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("quicfront: resolve %s: %w", s.cfg.Addr, err)
	}
	udp, err := net.ListenUDP("udp", uaddr)
	if err != nil {
		return fmt.Errorf("quicfront: listen %s: %w", s.cfg.Addr, err)
	}
	quicwire.RaiseUDPBuffers(udp, s.log)
	tr := &quic.Transport{Conn: quicwire.PacketConn(udp), StatelessResetKey: s.srk, ConnectionIDLength: connIDLen,
		ConnectionIDGenerator: s.cfg.cidGenerator()}
	var ln listener
	if s.cfg.Allow0RTT {
		ln, err = tr.ListenEarly(s.tlsConf, s.quicCfg)
	} else {
		ln, err = tr.Listen(s.tlsConf, s.quicCfg)
	}
	if err != nil {
		_ = tr.Close()
		_ = udp.Close()
		return fmt.Errorf("quicfront: start QUIC listener: %w", err)
	}
	s.udp, s.tr, s.ln = udp, tr, ln
	s.log.Info("QUIC front listening", "addr", udp.LocalAddr().String(), "alpn", s.cfg.ALPN)
	return nil
}

// Addr returns the bound UDP address, or nil before Listen.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.udp == nil {
		return nil
	}
	return s.udp.LocalAddr()
}

// Serve accepts connections until ctx ends or Shutdown is called. On ctx end
// it stops hard: sessions' contexts are canceled, every connection is closed
// with error code server_shutdown (2) and Serve returns once all goroutines
// ended. After Shutdown it returns at once (nil) and Shutdown does the
// draining.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	ln := s.ln
	closed := s.closed || s.draining
	s.mu.Unlock()
	if ln == nil {
		return errors.New("quicfront: Serve called before Listen")
	}
	if closed {
		return ErrServerClosed
	}
	acceptCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.stopped:
			cancel()
		case <-acceptCtx.Done():
		}
	}()
	for {
		conn, err := ln.Accept(acceptCtx)
		if err != nil {
			if ctx.Err() != nil {
				s.forceClose()
				return nil
			}
			select {
			case <-s.stopped:
				return nil
			default:
			}
			s.forceClose()
			return fmt.Errorf("quicfront: accept: %w", err)
		}
		s.admit(conn)
	}
}

// admit registers conn or refuses it; it never blocks, so the accept queue
// (32 connections in quic-go) keeps moving.
func (s *Server) admit(conn *quic.Conn) {
	src := front.Source(conn.RemoteAddr())
	s.mu.Lock()
	if s.draining || s.closed {
		s.mu.Unlock()
		s.m.connsRefused.Inc()
		_ = conn.CloseWithError(quicwire.AppCode(pgproto.QUICServerShutdown), "server shutting down")
		return
	}
	if s.bySource[src] >= s.cfg.MaxConnsPerSource {
		s.resyncSources()
	}
	if s.bySource[src] >= s.cfg.MaxConnsPerSource {
		s.mu.Unlock()
		s.m.connsRefused.Inc()
		s.log.Warn("QUIC connection refused: MaxConnsPerSource reached", "remote", conn.RemoteAddr().String(),
			"source", src, "max_conns_per_source", s.cfg.MaxConnsPerSource)
		_ = conn.CloseWithError(quicwire.AppCode(pgproto.QUICTooManyConns), "too many connections from this source")
		return
	}
	select {
	case s.sem <- struct{}{}:
	default:
		s.mu.Unlock()
		s.m.connsRefused.Inc()
		s.log.Warn("QUIC connection refused: MaxConns reached", "remote", conn.RemoteAddr().String(), "max_conns", s.cfg.MaxConns)
		_ = conn.CloseWithError(quicwire.AppCode(pgproto.QUICTooManyConns), "too many connections")
		return
	}
	s.connSeq++
	// Peer.Conn names the connection ("quic-" and its sequence number).
	sc := &serverConn{conn: conn, source: src, peer: front.Peer{Addr: liveAddr{conn}, Transport: "quic",
		Conn: "quic-" + strconv.FormatUint(s.connSeq, 10), Secure: true}}
	s.conns[sc] = struct{}{}
	s.bySource[src]++
	s.connWG.Add(1)
	s.mu.Unlock()
	s.m.conns.Inc()
	go s.runConn(sc)
}

// runConn accepts the connection's streams until the connection ends, then
// waits for its sessions. It owns the connection's MaxConns and
// MaxConnsPerSource slots, and closes the connection with
// pgproto.QUICNoStreamTimeout if no stream arrives within
// FirstStreamTimeout.
func (s *Server) runConn(sc *serverConn) {
	var streamWG sync.WaitGroup
	defer func() {
		streamWG.Wait()
		s.mu.Lock()
		delete(s.conns, sc)
		if s.bySource[sc.source]--; s.bySource[sc.source] <= 0 {
			delete(s.bySource, sc.source) // the map holds only sources with connections
		}
		s.mu.Unlock()
		<-s.sem
		s.m.conns.Dec()
		s.connWG.Done()
	}()
	conn := sc.conn
	log := s.log.With("remote", conn.RemoteAddr().String())
	log.Debug("QUIC connection accepted")
	// first is 0 until the first stream arrives (1) or FirstStreamTimeout
	// passes (2), whichever comes first.
	var first atomic.Int32
	noStream := time.AfterFunc(s.cfg.FirstStreamTimeout, func() {
		if first.CompareAndSwap(0, 2) {
			log.Debug("QUIC connection closed: no stream opened in time", "timeout", s.cfg.FirstStreamTimeout)
			_ = conn.CloseWithError(quicwire.AppCode(pgproto.QUICNoStreamTimeout), "no stream opened in time")
		}
	})
	defer noStream.Stop()
	for {
		str, err := conn.AcceptStream(conn.Context())
		if err != nil {
			log.Debug("QUIC connection ended", "cause", context.Cause(conn.Context()))
			return
		}
		if first.CompareAndSwap(0, 1) {
			noStream.Stop()
		}
		sconn := quicwire.NewConn(str, conn, nil)
		s.mu.Lock()
		s.followSource(sc, log)
		if s.draining || s.closed {
			s.mu.Unlock()
			s.m.streamsRefused.WithLabelValues("shutdown").Inc()
			sconn.Abort(pgproto.QUICServerShutdown)
			continue
		}
		admitted := false
		select {
		case s.streams <- struct{}{}:
			admitted = true
			sc.active++
		default:
		}
		s.mu.Unlock()
		if !admitted {
			s.overLimit(sc, sconn, &streamWG, log)
			continue
		}
		s.m.streams.Inc()
		s.m.streamsTotal.Inc()
		streamWG.Add(1)
		go s.runStream(sc, sconn, log, &streamWG)
	}
}

// overLimit handles a stream beyond MaxStreams without starting a session:
// while fewer than limitSlots such streams are being answered, a goroutine
// reads its first packet (see refuseStream); otherwise the stream is reset
// with pgproto.QUICTooManyStreams at once, costing nothing more.
func (s *Server) overLimit(sc *serverConn, c *quicwire.Conn, wg *sync.WaitGroup, log *slog.Logger) {
	select {
	case s.limit <- struct{}{}:
	default:
		s.m.streamsRefused.WithLabelValues("too_many_streams").Inc()
		c.Abort(pgproto.QUICTooManyStreams)
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { <-s.limit }()
		s.refuseStream(sc, c, log)
	}()
}

// tooManyStreams is the FATAL error a stream beyond MaxStreams receives,
// with the SQLSTATE PostgreSQL uses for "sorry, too many clients already".
var tooManyStreams = func() []byte {
	b, err := (&pgproto3.ErrorResponse{
		Severity:            "FATAL",
		SeverityUnlocalized: "FATAL",
		Code:                pgproto.CodeTooManyConnections,
		Message:             "too many connections",
		Detail:              "The pgquic QUIC front is at its stream limit.",
	}).Encode(nil)
	if err != nil {
		panic(err) // static message; cannot fail
	}
	return b
}()

// refuseStream answers a stream beyond MaxStreams the way PostgreSQL answers
// a connection beyond max_connections, except for a CancelRequest, which is
// served as PostgreSQL serves it whatever its connection count: it is
// short-lived, and a client whose own sessions fill the limit must still be
// able to cancel their queries. It waits at most limitTimeout for the first
// packet.
func (s *Server) refuseStream(sc *serverConn, c *quicwire.Conn, log *slog.Logger) {
	code, err := s.awaitStartup(c, limitTimeout)
	if err != nil {
		s.m.streamsRefused.WithLabelValues("too_many_streams").Inc()
		c.Abort(pgproto.QUICTooManyStreams)
		return
	}
	if code == pgproto.CancelRequestCode {
		select {
		case <-sc.conn.HandshakeComplete():
		case <-sc.conn.Context().Done():
			_ = c.Close()
			return
		}
		if err := s.h.Serve(s.baseCtx, c, sc.peer); err != nil {
			log.Debug("QUIC cancel request at the stream limit", "stream", c.Stream().StreamID(), "err", err)
		}
		_ = c.Close()
		return
	}
	s.m.streamsRefused.WithLabelValues("too_many_streams").Inc()
	log.Debug("QUIC stream refused: MaxStreams reached", "stream", c.Stream().StreamID(), "max_streams", s.cfg.MaxStreams)
	_ = c.SetWriteDeadline(time.Now().Add(limitTimeout))
	_, _ = c.Write(tooManyStreams)
	_ = c.Close()
}

// runStream is a stream's goroutine: it waits for the startup packet, then
// runs the session. An idle session's goroutine waits for its client at the
// bottom of its stack, and the runtime halves a goroutine's stack at a GC
// only while less than a quarter of it is in use; so this frame, which
// stays under the session, holds only what the session needs: the work
// before and after it is done in functions that have returned by then
// (streamReady, sessionPeer, streamDone), and there is no defer.
//
// The session runs on the server's context, which ends only at a hard
// stop. A client that is gone for good while the session waits on the
// server is found by the pooler's watcher through the peer's Probe (see
// sessionPeer), which costs the session nothing while it is idle: a
// context of its own, cancelled from the stream's, cost about a kibibyte
// per session (a cancelCtx, an AfterFunc on the stream's context, the
// maps and channels both need).
func (s *Server) runStream(sc *serverConn, c *quicwire.Conn, log *slog.Logger, wg *sync.WaitGroup) {
	if s.streamReady(sc, c, log) {
		err := s.h.Serve(s.baseCtx, c, sessionPeer(sc, c))
		// The handler closes rwc; closing again is a no-op and guarantees
		// the stream's credit is released even if it did not.
		_ = c.Close()
		if err != nil {
			logSessionError(log, c, err)
		}
	}
	s.streamDone(sc, wg)
}

// streamDone releases a stream's MaxStreams slot and, while draining, closes
// its connection once its last session ended.
func (s *Server) streamDone(sc *serverConn, wg *sync.WaitGroup) {
	<-s.streams
	s.m.streams.Dec()
	s.mu.Lock()
	sc.active--
	closeNow := sc.active == 0 && (s.draining || s.closed)
	s.mu.Unlock()
	if closeNow {
		_ = sc.conn.CloseWithError(quicwire.AppCode(pgproto.QUICServerShutdown), "server shutting down")
	}
	wg.Done()
}

// streamReady waits for the stream's startup packet and, unless the server
// accepts 0-RTT, for the handshake to complete; it reports whether the
// session may start, and has closed or reset the stream when not. With
// Allow0RTT the session starts on 0-RTT data and its Peer's
// HandshakeConfirmed tells the handler when the data stopped being
// replayable.
func (s *Server) streamReady(sc *serverConn, c *quicwire.Conn, log *slog.Logger) bool {
	if _, err := s.awaitStartup(c, s.cfg.StreamStartupTimeout); err != nil {
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			s.m.streamsAbandoned.WithLabelValues("startup_timeout").Inc()
			log.Debug("QUIC stream reset: no startup packet in time", "stream", c.Stream().StreamID(), "timeout", s.cfg.StreamStartupTimeout)
			c.Abort(pgproto.QUICStartupTimeout)
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			s.m.streamsAbandoned.WithLabelValues("eof").Inc()
			_ = c.Close()
		default:
			s.m.streamsAbandoned.WithLabelValues("reset").Inc()
			_ = c.Close() // the peer reset or the connection died: Close cancels our write side too
		}
		return false
	}
	if s.cfg.Allow0RTT {
		return true // the session starts at once; sessionPeer tells it whether the data is still replayable
	}
	select {
	case <-sc.conn.HandshakeComplete():
		return true
	case <-sc.conn.Context().Done():
		_ = c.Close()
		return false
	}
}

// sessionPeer returns what the handler is told about c's session: its
// connection's Peer, with a Probe that reports the client gone for good
// once its QUIC connection died or it aborted the stream (STOP_SENDING
// with an error code). While a query runs the handler waits for the
// server, not for the client; without the probe a lost client would hold
// its server connection until the query finished.
func sessionPeer(sc *serverConn, c *quicwire.Conn) front.Peer {
	p := sc.peer
	p.Probe = func() error { return streamGone(c.Stream()) }
	select {
	case <-sc.conn.HandshakeComplete():
		p.ClientCerts = sc.clientCerts()
	default:
		// 0-RTT: a resumed session's certificates are those of the ticket,
		// known already; not cached, as the handshake has not completed.
		p.HandshakeConfirmed = sc.conn.HandshakeComplete()
		p.ClientCerts = sc.conn.ConnectionState().TLS.PeerCertificates
	}
	return p
}

// streamGone is a session's Probe: nil while the stream's send side is
// open or ended the session's own way, the cause when the client is gone
// (see clientGone). It neither reads nor waits.
func streamGone(str *quic.Stream) error {
	ctx := str.Context()
	if ctx.Err() == nil {
		return nil
	}
	if cause := context.Cause(ctx); clientGone(cause) {
		return fmt.Errorf("quicfront: client gone: %w", cause)
	}
	return nil
}

// logSessionError logs the error a session ended with (out of serveStream,
// whose frame stays under the session).
func logSessionError(log *slog.Logger, c *quicwire.Conn, err error) {
	log.Debug("QUIC session ended with error", "stream", c.Stream().StreamID(), "err", err)
}

// clientGone reports whether cause, the reason a stream's send side ended,
// means the client is gone: it sent STOP_SENDING with an error code, or the
// connection died (any connection-level error; quic-go ends the streams before
// it cancels the connection's own context, so the cause is what to look at).
// A STOP_SENDING with pgproto.QUICNoError is how a client's Close ends a finished
// session, and a local Close or reset is the session's own end; neither counts.
func clientGone(cause error) bool {
	if errors.Is(cause, quic.ErrStreamClosed) {
		return false
	}
	var se *quic.StreamError
	if errors.As(cause, &se) {
		return se.Remote && se.ErrorCode != quicwire.StreamCode(pgproto.QUICNoError)
	}
	return cause != nil
}

// awaitStartup blocks until the stream holds a whole first packet (or
// wire.MaxStartupLen bytes, PostgreSQL's cap: a longer packet is a protocol
// violation the handler reports), without consuming anything, or timeout
// passes.
// It returns the packet's code (protocol version or request code), 0 when
// the packet is too short to hold one.
func (s *Server) awaitStartup(c *quicwire.Conn, timeout time.Duration) (uint32, error) {
	if err := c.Stream().SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return 0, err
	}
	var hdr [4]byte
	if _, err := c.Stream().Peek(hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, io.ErrUnexpectedEOF
		}
		return 0, err
	}
	n := int(binary.BigEndian.Uint32(hdr[:]))
	var code uint32
	if n > 4 {
		if n > wire.MaxStartupLen {
			n = wire.MaxStartupLen // the handler rejects it; no need to wait for more
		}
		buf := make([]byte, n)
		if _, err := c.Stream().Peek(buf); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if n >= 8 {
			code = binary.BigEndian.Uint32(buf[4:8])
		}
	}
	return code, c.Stream().SetReadDeadline(time.Time{})
}

// Shutdown stops accepting connections and streams (new streams are reset
// with error code server_shutdown (2)), lets running sessions finish and
// closes each connection with that code once it has no session left. When
// ctx expires first, sessions' contexts are canceled and all connections
// closed; Shutdown then waits for the goroutines and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	if !s.draining {
		s.draining = true
		close(s.stopped)
	}
	ln := s.ln
	var idle []*quic.Conn
	for sc := range s.conns {
		if sc.active == 0 {
			idle = append(idle, sc.conn)
		}
	}
	n := len(s.conns)
	s.mu.Unlock()
	s.log.Info("QUIC front shutting down", "connections", n)
	if ln != nil {
		_ = ln.Close()
	}
	for _, c := range idle {
		_ = c.CloseWithError(quicwire.AppCode(pgproto.QUICServerShutdown), "server shutting down")
	}
	done := make(chan struct{})
	go func() {
		s.connWG.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("quicfront: shutdown grace period over, closing connections: %w", ctx.Err())
		s.log.Warn("QUIC front: grace period over, closing remaining connections")
		s.closeConns()
		<-done
	}
	s.closeTransport()
	return err
}

// forceClose ends everything now: used when Serve's context ends.
func (s *Server) forceClose() {
	s.mu.Lock()
	if !s.draining {
		s.draining = true
		close(s.stopped)
	}
	ln := s.ln
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	s.closeConns()
	s.connWG.Wait()
	s.closeTransport()
}

// closeConns cancels sessions and closes every connection.
func (s *Server) closeConns() {
	s.baseCancel()
	s.mu.Lock()
	conns := make([]*quic.Conn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc.conn)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { _ = c.CloseWithError(quicwire.AppCode(pgproto.QUICServerShutdown), "server shutting down") })
	}
	wg.Wait()
}

// closeTransport releases the UDP socket once; the server cannot be reused.
func (s *Server) closeTransport() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	tr, udp := s.tr, s.udp
	s.mu.Unlock()
	s.baseCancel()
	if tr != nil {
		_ = tr.Close()
	}
	if udp != nil {
		_ = udp.Close()
	}
}
