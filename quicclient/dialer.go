// Package quicclient is the client of pgquic's QUIC transport, for programs
// that embed it: a Dialer opens one PostgreSQL session per QUIC stream over a
// few shared QUIC connections to a pgquic pooler, and plugs into pgx, pgxpool
// and database/sql (through pgx's stdlib) as their DialFunc. The server is
// verified by a CA file, a pinned SHA-256 certificate fingerprint, or, for
// development, not at all.
//
// The package depends on quic-go and the standard library only, never on the
// pooler or its server connection pools, so an application that imports it
// gets a dialer and nothing of the server.
package quicclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/defaults"
	"github.com/pgquic/pgquic/internal/localstart"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/quicwire"
)

// Defaults of DialerConfig, applied to zero fields.
const (
	// DefaultConns (4) is how many QUIC connections a Dialer keeps.
	DefaultConns = defaults.DialerConns
	// DefaultALPN ("pgquic/1") is the application protocol of the QUIC
	// wire contract, version 1; the server front offers the same by default.
	DefaultALPN = pgproto.ALPN
	// DefaultKeepAlivePeriod (15 s) sends a keep-alive on a quiet
	// connection, well under DefaultIdleTimeout and typical UDP NAT timeouts.
	DefaultKeepAlivePeriod = defaults.QUICKeepAlivePeriod
	// DefaultIdleTimeout (60 s) is quic MaxIdleTimeout.
	DefaultIdleTimeout = defaults.QUICIdleTimeout
	// DefaultMaxStreamsPerConn (1000) is the soft cap of streams per
	// connection, the stream credit the server front grants by default.
	DefaultMaxStreamsPerConn = defaults.QUICMaxStreamsPerConn
)

// DialerConfig configures the client side. Zero values take the defaults
// named on each field. Exactly one server verification mode must be chosen:
// CAFile, PinSHA256 or Insecure (TLSConfig alone also counts as one).
type DialerConfig struct {
	// Addr is the pooler's QUIC address, host:port. Required.
	Addr string
	// Conns is how many QUIC connections the dialer keeps. They are dialed
	// lazily (a new one when every live connection already carries a stream)
	// and re-dialed after loss. Default 4.
	Conns int
	// ALPN is the application protocol to offer. Default "pgquic/1".
	ALPN string
	// CAFile is a PEM file of CA certificates that sign the server's
	// certificate; the host part of Addr must match the certificate.
	CAFile string
	// PinSHA256 trusts exactly the server certificate with this SHA-256
	// fingerprint (hex; case, colons and a "sha256:" prefix are ignored).
	// It suits the server's generated self-signed certificate.
	PinSHA256 string
	// Insecure skips verification of the server. Development only.
	Insecure bool
	// CertFile and KeyFile, both or neither, are a PEM certificate and key
	// the client presents to the pooler (mutual TLS). A pooler started with
	// --edge-trust that lists the certificate's SHA-256 fingerprint trusts
	// the client as an edge: its sessions for the users and databases listed
	// start without a password exchange (what local startup needs). Other
	// poolers ignore it. Default: no client certificate.
	CertFile, KeyFile string
	// LocalStartup makes DialFunc answer each session's startup on the
	// client's side once a greeting for the same user, database and
	// startup parameters was seen, sending the StartupMessage and the first
	// request to the pooler in one flight (internal/localstart, the code
	// `pgquic edge --local-startup` runs): a new session's first row is one
	// round trip away. The application is the client here and is trusted
	// as itself: the pooler must not ask for a password, so give it a
	// certificate (CertFile) its --edge-trust file lists for the users and
	// databases the application uses, or the session is refused (28000).
	// Dial is unchanged. Default false.
	LocalStartup bool
	// TLSConfig, when set, is the base TLS configuration (cloned); ServerName,
	// NextProtos and MinVersion (TLS 1.3) are filled in when unset.
	TLSConfig *tls.Config
	// KeepAlivePeriod sends a keep-alive when a connection is quiet for this
	// long. Default 15s; negative disables keep-alives.
	KeepAlivePeriod time.Duration
	// IdleTimeout is quic MaxIdleTimeout. Default 60s.
	IdleTimeout time.Duration
	// MaxStreamsPerConn is the soft cap of open streams per connection used
	// when choosing one; above it on every connection, streams still open on
	// the least-loaded one (and may wait for the server's credit). Default 1000.
	MaxStreamsPerConn int
	// NoCoalescing hands every stream Write to quic-go at once. By default a
	// small Write (a query) is queued for one turn of the scheduler so that
	// the sessions sharing a connection send their messages in shared
	// packets (quicwire.Coalescer): fewer packets for the pooler to receive,
	// decrypt and acknowledge per query.
	NoCoalescing bool
	// SessionCacheFile keeps TLS session tickets in this file (SessionCache,
	// OpenSessionCache), so that a new process resumes the session an
	// earlier one established. The file lets whoever reads it resume as
	// this client: see SessionCache. Default "": no cache, every
	// connection makes a full handshake, as does a TLSConfig without
	// ClientSessionCache.
	SessionCacheFile string
	// SessionCache, instead of SessionCacheFile, is a cache shared with
	// other Dialers (NewSessionCache keeps it in memory). Either replaces
	// a TLSConfig's own ClientSessionCache. Default nil.
	SessionCache *SessionCache
	// ZeroRTT dials with 0-RTT when the session cache holds a ticket for
	// the pooler: the first streams' bytes (the StartupMessage and, with
	// LocalStartup, the first request) leave in the first flight instead
	// of after the handshake's round trip. A pooler whose database allows
	// it (zero_rtt: read-only) answers the startup at once and runs the
	// request when the handshake is confirmed; one that refuses 0-RTT
	// makes quic-go drop those bytes, and the Dialer sends them again in
	// 1-RTT (never twice: the server saw none). Stats().ZeroRTT counts
	// the connections whose 0-RTT the server accepted. Whoever captures
	// the first flight can replay it to the pooler: see the pooler's
	// zero_rtt. Needs SessionCacheFile or SessionCache. Default false.
	ZeroRTT bool
	// LocalAddr is the local UDP address to bind, e.g. one interface's
	// address; Migrate binds its new socket there too unless told another.
	// Default nil: any address, an ephemeral port.
	LocalAddr *net.UDPAddr
}

func (c *DialerConfig) populate() error {
	if c.Addr == "" {
		return errors.New("quicclient: DialerConfig.Addr is required")
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("quicclient: DialerConfig.Addr: %w", err)
	}
	if c.Conns == 0 {
		c.Conns = DefaultConns
	}
	if c.Conns < 0 {
		return fmt.Errorf("quicclient: Conns %d must be positive", c.Conns)
	}
	if c.ALPN == "" {
		c.ALPN = DefaultALPN
	}
	if c.KeepAlivePeriod == 0 {
		c.KeepAlivePeriod = DefaultKeepAlivePeriod
	}
	if c.KeepAlivePeriod < 0 {
		c.KeepAlivePeriod = 0
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxStreamsPerConn == 0 {
		c.MaxStreamsPerConn = DefaultMaxStreamsPerConn
	}
	if c.IdleTimeout < 0 || c.MaxStreamsPerConn < 0 {
		return errors.New("quicclient: IdleTimeout and MaxStreamsPerConn must not be negative")
	}
	return nil
}

// Dialer opens PostgreSQL sessions as streams over a few shared QUIC
// connections from a single UDP socket. It is safe for concurrent use.
type Dialer struct {
	cfg     DialerConfig
	log     *slog.Logger
	tlsConf *tls.Config
	cache   *SessionCache // nil without a session cache
	quicCfg *quic.Config

	mu      sync.Mutex
	udp     *net.UDPConn
	tr      *quic.Transport
	slots   []*clientConn   // nil: not dialed or lost
	dialing []chan struct{} // non-nil while slot i is being dialed
	closed  bool
	wg      sync.WaitGroup // connection watchers

	local     *localstart.Server // nil without LocalStartup
	localCtx  context.Context    // ends the local sessions at Close
	localStop context.CancelFunc
	localWG   sync.WaitGroup // local sessions' goroutines

	retired []retiredSocket // sockets Migrate moved away from; guarded by mu
	moves   moveCounters    // FollowRoute's moves
}

// clientConn is one QUIC connection and its count of open streams.
type clientConn struct {
	conn *quic.Conn
	co   *quicwire.Coalescer // nil with NoCoalescing
	slot int
	open int // streams open or being opened; guarded by Dialer.mu
	// resumed records whether the handshake resumed a TLS session. It is
	// read once, before the connection can migrate: quic-go's
	// ConnectionState reads the connection's socket, which a path switch
	// replaces on its own goroutine, so calling it later races.
	resumed bool
	// used0RTT records whether the server accepted the connection's 0-RTT
	// data; watch sets it under Dialer.mu once the handshake completed
	// (a connection cannot migrate before).
	used0RTT bool
	// early0RTT records that the dial returned before the handshake
	// completed: the connection sent 0-RTT data (DialerConfig.ZeroRTT).
	early0RTT bool
	// settled records that watch has read the handshake's outcome into
	// resumed and used0RTT. Until then an early connection counts as
	// neither accepted nor refused: its HandshakeComplete channel may be
	// closed already while watch has not run yet, and reading that as a
	// refusal is what made a loaded machine report refusals that never
	// happened.
	settled bool
}

// DialerStats is a snapshot of the dialer's connections.
type DialerStats struct {
	// Conns is the number of live QUIC connections.
	Conns int
	// Streams is the number of open streams over all of them.
	Streams int
	// PacketsSent and PacketsReceived are the QUIC packets the live
	// connections sent and received since they were dialed: divided by the
	// queries run, they tell how well packets carry several sessions'
	// messages, which is what a QUIC session costs the pooler per query.
	PacketsSent, PacketsReceived uint64
	// PacketsLost counts the packets the live connections declared lost
	// (quic-go's loss detection), the figure a lossy path raises.
	PacketsLost uint64
	// SmoothedRTT is the mean of the live connections' smoothed RTTs.
	SmoothedRTT time.Duration
	// Resumed counts the live connections whose TLS handshake resumed an
	// earlier session (SessionCacheFile, SessionCache).
	Resumed int
	// ZeroRTT counts the live connections whose 0-RTT data the server
	// accepted (DialerConfig.ZeroRTT); a rejected one counts in Resumed
	// only.
	ZeroRTT int
	// ZeroRTTRejected counts the live connections that sent 0-RTT data
	// the server refused (its streams' bytes were sent again in 1-RTT).
	// A connection that sent 0-RTT counts in Resumed, ZeroRTT or
	// ZeroRTTRejected only once its handshake's outcome is recorded,
	// just after the handshake completes; until then it counts in none.
	ZeroRTTRejected int
}

// NewDialer validates cfg and prepares TLS; it dials nothing yet. logger nil
// discards logs.
func NewDialer(cfg DialerConfig, logger *slog.Logger) (*Dialer, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := cfg.populate(); err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(cfg.Addr)
	tc, err := clientTLSConfig(cfg, host)
	if err != nil {
		return nil, err
	}
	cache, err := sessionCacheFor(cfg, logger)
	if err != nil {
		return nil, err
	}
	if cache != nil {
		tc.ClientSessionCache = cache
	}
	d := &Dialer{
		cfg:     cfg,
		log:     logger,
		tlsConf: tc,
		cache:   cache,
		quicCfg: &quic.Config{
			KeepAlivePeriod:       cfg.KeepAlivePeriod,
			MaxIdleTimeout:        cfg.IdleTimeout,
			MaxIncomingStreams:    -1, // the server never opens streams
			MaxIncomingUniStreams: -1,
			Tracer:                quicwire.QlogTracer(),
		},
		slots:   make([]*clientConn, cfg.Conns),
		dialing: make([]chan struct{}, cfg.Conns),
	}
	if cfg.LocalStartup {
		if d.local, err = localstart.New(localstart.Config{Dial: d.Dial, Greetings: d.GreetingStore()}, logger); err != nil {
			return nil, fmt.Errorf("quicclient: %w", err)
		}
		d.localCtx, d.localStop = context.WithCancel(context.Background())
	}
	return d, nil
}

// Dial opens a new session stream on the least-loaded live connection,
// dialing or re-dialing a connection when needed. If opening the stream fails
// because the connection just died, it retries once on a fresh connection.
// The returned net.Conn's Close sends FIN and cancels reading, releasing the
// stream's credit at once; it also has CloseWrite, which sends FIN only.
func (d *Dialer) Dial(ctx context.Context) (net.Conn, error) {
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		cc, err := d.pick(ctx)
		if err != nil {
			return nil, err
		}
		str, err := cc.conn.OpenStreamSync(ctx)
		if err == nil {
			release := func() { d.release(cc) }
			if d.cfg.ZeroRTT && !handshakeDone(cc.conn) {
				return newEarlyConn(cc.conn, str, func(str *quic.Stream) *quicwire.Conn { return d.wrapStream(cc, str, nil) }, release), nil
			}
			return d.wrapStream(cc, str, release), nil
		}
		d.release(cc)
		lastErr = fmt.Errorf("quicclient: open stream: %w", err)
		if ctx.Err() != nil || cc.conn.Context().Err() == nil {
			return nil, lastErr
		}
		d.forget(cc)
		d.log.Debug("QUIC connection lost while opening a stream; retrying on a fresh one", "err", err)
	}
	return nil, lastErr
}

// wrapStream is the net.Conn of a stream of cc; release, when not nil, runs
// once it is closed.
func (d *Dialer) wrapStream(cc *clientConn, str *quic.Stream, release func()) *quicwire.Conn {
	if cc.co != nil {
		return quicwire.NewCoalescingConn(str, cc.conn, cc.co, release)
	}
	return quicwire.NewConn(str, cc.conn, release)
}

// handshakeDone reports whether c's handshake completed.
func handshakeDone(c *quic.Conn) bool {
	select {
	case <-c.HandshakeComplete():
		return true
	default:
		return false
	}
}

// DialFunc adapts Dial to pgconn.Config.DialFunc (the type is the same
// function signature, so this package needs no pgx import). network and
// addr are ignored: every session, and pgx's CancelRequest, becomes a fresh
// stream to the configured pooler.
func (d *Dialer) DialFunc() func(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.local != nil {
		return d.dialLocal
	}
	return func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.Dial(ctx)
	}
}

// dialLocal is DialFunc with LocalStartup: the application gets one end of
// an in-process pipe, and a goroutine answers its startup (localstart) on
// the other, opening the stream to the pooler when the first request
// arrives. A CancelRequest on it is routed by the key handed out.
func (d *Dialer) dialLocal(ctx context.Context, _, _ string) (net.Conn, error) {
	d.mu.Lock()
	closed := d.closed
	if !closed {
		d.localWG.Add(1)
	}
	d.mu.Unlock()
	if closed {
		return nil, ErrDialerClosed
	}
	app, side := net.Pipe()
	go func() {
		defer d.localWG.Done()
		defer side.Close()
		// Close ends the session whatever it waits for.
		stop := context.AfterFunc(d.localCtx, func() { _ = side.Close() })
		defer stop()
		d.serveLocal(halfPipe{side})
	}()
	return app, nil
}

// serveLocal runs one local-startup session on the pipe end c.
func (d *Dialer) serveLocal(c net.Conn) {
	pkt, code, err := localstart.ReadFirst(c, defaults.EdgeStartupTimeout)
	if err != nil {
		d.log.Debug("quicclient: no usable startup packet", "err", err)
		return
	}
	if code == pgproto.CancelRequestCode {
		if _, err := d.local.Cancel(d.localCtx, pkt); err != nil {
			d.log.Warn("quicclient: cancel request not forwarded", "err", err)
		}
		return
	}
	st, err := localstart.ParseStartup(pkt)
	if err != nil {
		_, _ = c.Write(localstart.ErrorResponse("FATAL", pgproto.CodeProtocolViolation, "invalid startup packet: "+err.Error()))
		return
	}
	if err := d.local.Serve(d.localCtx, c, st); err != nil {
		d.log.Debug("quicclient: local-startup session ended", "err", err)
	}
}

// halfPipe is a net.Pipe end whose CloseWrite closes it: a pipe has no
// half-close, and once the pooler ended the session the application must
// see the end of its connection.
type halfPipe struct{ net.Conn }

// CloseWrite closes the pipe.
func (h halfPipe) CloseWrite() error { return h.Close() }

// LookupFunc is the pgconn.Config.LookupFunc to use with DialFunc: pgx
// resolves the host of its connection string before dialing, but the host
// is only a label here (the Dialer knows the pooler's address), so the
// function returns it unchanged and no DNS lookup happens.
func (d *Dialer) LookupFunc() func(ctx context.Context, host string) ([]string, error) {
	return func(_ context.Context, host string) ([]string, error) {
		return []string{host}, nil
	}
}

// Addr returns the pooler address the Dialer dials.
func (d *Dialer) Addr() string { return d.cfg.Addr }

// CertFingerprint returns the SHA-256 fingerprint of the client certificate
// the dialer presents (DialerConfig.CertFile), the value a pooler's
// edge-trust file lists, or "" when it presents none.
func (d *Dialer) CertFingerprint() string {
	if len(d.tlsConf.Certificates) == 0 || len(d.tlsConf.Certificates[0].Certificate) == 0 {
		return ""
	}
	return Fingerprint(d.tlsConf.Certificates[0].Certificate[0])
}

// Stats reports the live connections, their open streams and packets.
func (d *Dialer) Stats() DialerStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	var st DialerStats
	for _, cc := range d.slots {
		if cc != nil && cc.conn.Context().Err() == nil {
			st.Conns++
			st.Streams += cc.open
			cs := cc.conn.ConnectionStats()
			st.PacketsSent += cs.PacketsSent
			st.PacketsReceived += cs.PacketsReceived
			st.PacketsLost += cs.PacketsLost
			st.SmoothedRTT += cs.SmoothedRTT
			if cc.resumed {
				st.Resumed++
			}
			if cc.used0RTT {
				st.ZeroRTT++
			} else if cc.early0RTT && cc.settled {
				st.ZeroRTTRejected++
			}
		}
	}
	if st.Conns > 0 {
		st.SmoothedRTT /= time.Duration(st.Conns)
	}
	return st
}

// pick returns a live connection with one stream reserved on it.
func (d *Dialer) pick(ctx context.Context) (*clientConn, error) {
	for {
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			return nil, ErrDialerClosed
		}
		if err := d.ensureTransport(); err != nil {
			d.mu.Unlock()
			return nil, err
		}
		var best *clientConn
		empty, waitOn := -1, -1
		for i, cc := range d.slots {
			if cc != nil && cc.conn.Context().Err() != nil {
				d.slots[i] = nil
				cc = nil
			}
			switch {
			case cc != nil:
				if best == nil || cc.open < best.open {
					best = cc
				}
			case d.dialing[i] != nil:
				if waitOn < 0 {
					waitOn = i
				}
			default:
				if empty < 0 {
					empty = i
				}
			}
		}
		switch {
		case best != nil && best.open == 0,
			best != nil && empty < 0 && waitOn < 0,
			best != nil && empty < 0 && best.open < d.cfg.MaxStreamsPerConn:
			best.open++
			d.mu.Unlock()
			return best, nil
		case empty >= 0:
			cc, err := d.dialSlot(ctx, empty) // unlocks d.mu
			if err != nil {
				return nil, err
			}
			return cc, nil
		default:
			ch := d.dialing[waitOn]
			d.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, fmt.Errorf("quicclient: waiting for a QUIC connection: %w", ctx.Err())
			}
		}
	}
}

// dialSlot dials a connection for slot i. It is called with d.mu held and
// returns with it released.
func (d *Dialer) dialSlot(ctx context.Context, i int) (*clientConn, error) {
	ch := make(chan struct{})
	d.dialing[i] = ch
	tr := d.tr
	d.mu.Unlock()

	conn, err := d.dialConn(ctx, tr)

	d.mu.Lock()
	defer d.mu.Unlock()
	d.dialing[i] = nil
	close(ch)
	if err != nil {
		return nil, err
	}
	if d.closed {
		_ = conn.CloseWithError(quicwire.AppCode(ErrCodeNoError), "dialer closed")
		return nil, ErrDialerClosed
	}
	// An early connection's state is read once its handshake completed
	// (watch): before that, quic-go's ConnectionState reads the peer's
	// transport parameters while the connection's goroutine writes them.
	cc := &clientConn{conn: conn, slot: i, open: 1, early0RTT: !handshakeDone(conn)}
	if !cc.early0RTT {
		cc.resumed = conn.ConnectionState().TLS.DidResume
	}
	if !d.cfg.NoCoalescing {
		cc.co = quicwire.NewCoalescer(conn.Context())
	}
	d.slots[i] = cc
	d.wg.Add(1)
	go d.watch(cc)
	return cc, nil
}

func (d *Dialer) dialConn(ctx context.Context, tr *quic.Transport) (*quic.Conn, error) {
	raddr, err := net.ResolveUDPAddr("udp", d.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("quicclient: resolve %s: %w", d.cfg.Addr, err)
	}
	var conn *quic.Conn
	if d.cfg.ZeroRTT {
		conn, err = tr.DialEarly(ctx, raddr, d.tlsConf, d.quicCfg)
	} else {
		conn, err = tr.Dial(ctx, raddr, d.tlsConf, d.quicCfg)
	}
	if err != nil {
		return nil, fmt.Errorf("quicclient: dial %s: %w", d.cfg.Addr, err)
	}
	if handshakeDone(conn) {
		d.log.Debug("QUIC connection established", "addr", raddr.String(), "handshake_done", true,
			"resumed", conn.ConnectionState().TLS.DidResume)
	} else {
		// An early connection's state is read once its handshake completed
		// (watch logs it then): see dialSlot.
		d.log.Debug("QUIC connection established", "addr", raddr.String(), "handshake_done", false)
	}
	return conn, nil
}

// ensureTransport binds the dialer's single UDP socket on first use; called
// with d.mu held.
func (d *Dialer) ensureTransport() error {
	if d.tr != nil {
		return nil
	}
	udp, err := d.bindUDP(d.cfg.LocalAddr)
	if err != nil {
		return err
	}
	d.udp = udp
	d.tr = &quic.Transport{Conn: quicwire.PacketConn(udp)}
	return nil
}

// bindUDP binds a UDP socket on local (nil: any address, an ephemeral
// port), of the pooler address's family.
func (d *Dialer) bindUDP(local *net.UDPAddr) (*net.UDPConn, error) {
	network := "udp"
	host, _, _ := net.SplitHostPort(d.cfg.Addr)
	if ip := net.ParseIP(host); ip != nil {
		if ip.To4() != nil {
			network = "udp4"
		} else {
			network = "udp6"
		}
	}
	udp, err := net.ListenUDP(network, local)
	if err != nil {
		return nil, fmt.Errorf("quicclient: bind UDP socket: %w", err)
	}
	quicwire.RaiseUDPBuffers(udp, d.log)
	return udp, nil
}

// watch forgets a connection as soon as it dies, so the next Dial re-dials.
func (d *Dialer) watch(cc *clientConn) {
	defer d.wg.Done()
	if d.cfg.ZeroRTT {
		select {
		case <-cc.conn.HandshakeComplete():
			cs := cc.conn.ConnectionState()
			d.mu.Lock()
			cc.used0RTT, cc.resumed, cc.settled = cs.Used0RTT, cs.TLS.DidResume, true
			d.mu.Unlock()
			d.log.Debug("QUIC handshake completed", "addr", d.cfg.Addr, "resumed", cs.TLS.DidResume, "used_0rtt", cs.Used0RTT)
			if cc.early0RTT && !cs.Used0RTT {
				d.log.Debug("the pooler refused the connection's 0-RTT data; its sessions send it again in 1-RTT", "addr", d.cfg.Addr)
			}
		case <-cc.conn.Context().Done():
		}
	}
	<-cc.conn.Context().Done()
	d.forget(cc)
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if !closed {
		d.log.Info("QUIC connection to pooler lost; it will be re-dialed on demand",
			"addr", d.cfg.Addr, "cause", context.Cause(cc.conn.Context()))
	}
}

func (d *Dialer) forget(cc *clientConn) {
	d.mu.Lock()
	if d.slots[cc.slot] == cc {
		d.slots[cc.slot] = nil
	}
	d.mu.Unlock()
}

func (d *Dialer) release(cc *clientConn) {
	d.mu.Lock()
	cc.open--
	d.mu.Unlock()
}

// Close closes every connection (streams on them fail) and the UDP socket.
// Dial fails with ErrDialerClosed afterwards.
func (d *Dialer) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	var conns []*quic.Conn
	for _, cc := range d.slots {
		if cc != nil {
			conns = append(conns, cc.conn)
		}
	}
	d.mu.Unlock()
	for _, c := range conns {
		_ = c.CloseWithError(quicwire.AppCode(ErrCodeNoError), "client closed")
	}
	d.wg.Wait()
	if d.localStop != nil {
		d.localStop()
		d.localWG.Wait()
	}
	// No new transport can appear: ensureTransport runs under d.mu and checks closed first.
	d.mu.Lock()
	tr, udp := d.tr, d.udp
	d.mu.Unlock()
	if tr != nil {
		_ = tr.Close()
	}
	d.closeRetired()
	if d.cache != nil {
		d.cache.Flush()
	}
	if udp != nil {
		return udp.Close()
	}
	return nil
}
