// Package localstart answers a PostgreSQL client's startup on the client's
// side of a pgquic connection (the edge sidecar, or quicclient's DialFunc)
// so a new session reaches its first row in one round trip instead of two:
// the client gets AuthenticationOk, the ParameterStatus set the pooler sent
// last for the same user, database and startup parameters, a BackendKeyData
// of this side's own and ReadyForQuery at once, and its StartupMessage and
// first request leave for the pooler in one write. When the pooler's real
// greeting arrives, the parameters that differ from the cached ones reach
// the client as ParameterStatus before anything else the pooler sent (so
// before the first result), and a refusal reaches it as the error of its
// first request, after which the session ends. The first session for a
// user, database and parameter set takes the ordinary path (the pooler's
// greeting is passed on, and remembered).
//
// Local startup only makes sense where the pooler does not ask for a
// password: the caller has authenticated the client itself, and the pooler
// trusts this side's certificate as an edge (serve --edge-trust) or trusts
// everyone. A pooler that asks for a password is treated as a refusal
// (FATAL 28000), never passed on to a client already told it is in.
//
// It depends on the standard library and stdlib-only internal packages, so
// quicclient, which applications import, can use it (see the dependency
// test there).
package localstart

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/wire"
)

// maxGreetingMessage bounds one message of the pooler's greeting; a
// ParameterStatus or ErrorResponse is far smaller.
const maxGreetingMessage = 1 << 20

// firstChunk is the most read from the client as its first request before
// the startup goes out; the rest follows as the client sends it.
const firstChunk = 32 << 10

// Startup is a parsed StartupMessage.
type Startup struct {
	// Packet is the whole packet, length word included, as the client sent it.
	Packet []byte
	// User and Database are the names asked for (Database defaults to User).
	User, Database string
	// Local reports that the startup can be answered locally: protocol 3.0,
	// no _pq_ protocol options and no replication. Others take the
	// ordinary path, where the pooler negotiates.
	Local bool
	key   string
}

// ParseStartup decodes a StartupMessage packet (length word included). It
// returns an error when the packet is malformed or names no user; the
// caller then lets the pooler answer it (its reply is PostgreSQL's).
func ParseStartup(pkt []byte) (*Startup, error) {
	if len(pkt) < 8 || int(binary.BigEndian.Uint32(pkt)) != len(pkt) {
		return nil, errors.New("localstart: bad startup packet length")
	}
	code := binary.BigEndian.Uint32(pkt[4:8])
	st := &Startup{Packet: pkt, Local: code == pgproto.ProtocolMajor<<16}
	if code>>16 != pgproto.ProtocolMajor {
		return nil, fmt.Errorf("localstart: protocol %d.%d", code>>16, code&0xffff)
	}
	b := pkt[8:]
	var pairs []string
	for {
		name, rest, ok := wire.CString(b)
		if !ok {
			return nil, errors.New("localstart: startup packet lacks its terminator")
		}
		if len(name) == 0 {
			if len(rest) != 0 {
				return nil, errors.New("localstart: bytes after the startup packet's terminator")
			}
			break
		}
		val, rest2, ok := wire.CString(rest)
		if !ok {
			return nil, errors.New("localstart: startup parameter without a value")
		}
		b = rest2
		k, v := string(name), string(val)
		switch {
		case k == "user":
			st.User = v
		case k == "database":
			st.Database = v
		case k == "replication" || strings.HasPrefix(k, "_pq_."):
			st.Local = false
		}
		pairs = append(pairs, k+"\x00"+v)
	}
	if st.User == "" {
		return nil, errors.New("localstart: no user in the startup packet")
	}
	if st.Database == "" {
		st.Database = st.User
	}
	// The greeting depends on the user, the database and every startup
	// parameter (the pooler reports the client's own values back), so all
	// of them key the cache, in a canonical order.
	slices.Sort(pairs)
	st.key = strings.Join(pairs, "\x00\x00")
	return st, nil
}

// param is one ParameterStatus, in the pooler's order.
type param struct{ name, value string }

// Config configures a Server.
type Config struct {
	// Dial opens a new stream to the pooler. Required.
	Dial func(ctx context.Context) (net.Conn, error)
	// Timeout bounds opening a stream and waiting for the pooler's
	// greeting. Default 10s.
	Timeout time.Duration
	// Ordinary, when set, never answers a startup locally: every session
	// takes the ordinary path (the caller still authenticates its clients
	// and hands out its own BackendKeyData). Default false.
	Ordinary bool
	// MaxCached bounds the greetings kept (one per user, database and
	// startup parameter set); beyond it the oldest half is dropped.
	// Default 1024.
	MaxCached int
	// Greetings, when set, seeds the cache at New and keeps every
	// greeting learned or changed, for the next process. Default nil.
	Greetings GreetingStore
}

// Server answers startups locally for many sessions: it holds the cache of
// greetings and the map from its own BackendKeyData to each session's key
// at the pooler, for cancels. It is safe for concurrent use.
type Server struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	cache map[string][]param
	order []string            // cache keys, oldest first
	keys  map[uint32]*session // by the pid this side handed out
}

// session is one client's entry in the cancel map.
type session struct {
	secret [4]byte
	ready  chan struct{} // closed once poolerKey is known, or the session ended
	once   sync.Once
	// poolerKey is the pooler's CancelRequest body after the code (pid and
	// secret); written before ready is closed, read after.
	poolerKey []byte
}

// New validates cfg. logger nil discards logs.
func New(cfg Config, logger *slog.Logger) (*Server, error) {
	if cfg.Dial == nil {
		return nil, errors.New("localstart: Config.Dial is required")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.MaxCached == 0 {
		cfg.MaxCached = 1024
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: logger, cache: map[string][]param{}, keys: map[uint32]*session{}}
	s.seed()
	return s, nil
}

// Cached reports whether a greeting is cached for st, so its session
// would start locally.
func (s *Server) Cached(st *Startup) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.cache[st.key]
	return ok
}

// ErrRefused wraps the pooler's refusal of a session, or its asking for a
// password (it does not trust this side).
var ErrRefused = errors.New("localstart: the pooler refused the session")

// Serve runs the session of client, whose StartupMessage st the caller
// has read and whose identity it has verified (the pooler will be told
// st.User, and only that). It answers the startup locally when a greeting
// is cached, and otherwise passes the pooler's on; then it relays the
// session until either side ends it. The client connection is not closed.
func (s *Server) Serve(ctx context.Context, client net.Conn, st *Startup) error {
	sess := &session{ready: make(chan struct{})}
	pid, err := s.register(sess)
	if err != nil {
		return err
	}
	defer s.unregister(pid, sess)

	s.mu.Lock()
	cached, hit := s.cache[st.key]
	s.mu.Unlock()
	hit = hit && st.Local && !s.cfg.Ordinary

	var first []byte
	if hit {
		// The local greeting, then the client's first request.
		var buf []byte
		buf = append(buf, authenticationOk...)
		for _, p := range cached {
			buf = appendParameterStatus(buf, p.name, p.value)
		}
		buf = appendBackendKeyData(buf, pid, sess.secret[:])
		buf = append(buf, 'Z', 0, 0, 0, 5, 'I')
		if _, err := client.Write(buf); err != nil {
			return fmt.Errorf("localstart: greeting the client: %w", err)
		}
		first = make([]byte, firstChunk)
		n, err := client.Read(first)
		if n == 0 {
			// Nothing to run (the client left or sent only EOF): the
			// pooler never hears of the session.
			return err
		}
		first = first[:n]
		if first[0] == 'X' && n == 5 {
			return nil // Terminate right away
		}
	}

	dctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	str, err := s.cfg.Dial(dctx)
	cancel()
	if err != nil {
		if hit {
			_, _ = client.Write(errorResponse("FATAL", pgproto.CodeConnectionFailure, "pgquic: cannot reach the pooler: "+err.Error()))
		}
		return fmt.Errorf("localstart: open a stream: %w", err)
	}
	defer str.Close()
	// Cancelling ctx cuts the session: both ends are unblocked.
	stop := context.AfterFunc(ctx, func() {
		abort(str)
		_ = client.SetDeadline(time.Now())
	})
	defer stop()
	flight := append(slices.Clip(st.Packet), first...)
	if _, err := str.Write(flight); err != nil {
		if hit {
			_, _ = client.Write(errorResponse("FATAL", pgproto.CodeConnectionFailure, "pgquic: lost the stream to the pooler: "+err.Error()))
		}
		return fmt.Errorf("localstart: send the startup: %w", err)
	}

	// On the local path the client's further messages go on as it sends
	// them, while the pooler's greeting is read.
	errc := make(chan error, 2)
	if hit {
		go func() { errc <- copyHalf(str, client) }()
	}
	br := bufio.NewReaderSize(str, 16<<10)
	_ = str.SetReadDeadline(time.Now().Add(s.cfg.Timeout))
	got, key, toClient, err := s.readGreeting(br, hit, pid, sess.secret[:])
	_ = str.SetReadDeadline(time.Time{})
	if err == nil {
		sess.poolerKey = key
		sess.once.Do(func() { close(sess.ready) })
		if hit {
			// What changed since the cached greeting reaches the client
			// before anything else the pooler sends (its first result).
			for _, p := range diff(cached, got) {
				toClient = appendParameterStatus(toClient, p.name, p.value)
			}
		}
		s.store(st.key, got)
	}
	if len(toClient) > 0 {
		if _, werr := client.Write(toClient); werr != nil && err == nil {
			err = fmt.Errorf("localstart: write to the client: %w", werr)
		}
	}
	if err != nil {
		// Refused or lost: the client's request never ran; the session
		// ends.
		abort(str)
		_ = client.SetDeadline(time.Now())
		if hit {
			<-errc
		}
		return err
	}
	if !hit {
		go func() { errc <- copyHalf(str, client) }()
	}
	go func() { errc <- copyHalf(client, br) }()
	// An error in either direction ends both.
	var failed error
	for range 2 {
		if err := <-errc; err != nil && failed == nil {
			failed = err
			abort(str)
			_ = client.SetDeadline(time.Now())
		}
	}
	return failed
}

// readGreeting reads the pooler's greeting up to its ReadyForQuery. It
// returns the ParameterStatus set, the pooler's cancel key, and the bytes
// to send the client: on the ordinary path (!hit) the greeting with this
// side's BackendKeyData in place of the pooler's; on the local path only
// notices, since the client had its greeting. A refusal (an ErrorResponse,
// or an authentication request: the pooler does not trust this side)
// returns an error and, in toClient, the error the client is to see.
func (s *Server) readGreeting(br *bufio.Reader, hit bool, pid uint32, secret []byte) (params []param, key []byte, toClient []byte, err error) {
	for {
		typ, body, err := readMessage(br)
		if err != nil {
			msg := "pgquic: the pooler's reply to the startup was lost: " + err.Error()
			return nil, nil, errorResponse("FATAL", pgproto.CodeConnectionFailure, msg), fmt.Errorf("localstart: read the greeting: %w", err)
		}
		switch typ {
		case 'R':
			if len(body) < 4 || binary.BigEndian.Uint32(body) != 0 {
				msg := "pgquic: the pooler asked for a password: it does not trust this edge's certificate for this user and database (serve --edge-trust)"
				return nil, nil, errorResponse("FATAL", pgproto.CodeInvalidAuthSpec, msg), fmt.Errorf("%w: it asked for a password", ErrRefused)
			}
			if !hit {
				toClient = appendMessage(toClient, typ, body)
			}
		case 'S':
			name, rest, ok1 := wire.CString(body)
			val, _, ok2 := wire.CString(rest)
			if ok1 && ok2 {
				params = append(params, param{string(name), string(val)})
			}
			if !hit {
				toClient = appendMessage(toClient, typ, body)
			}
		case 'K':
			key = bytes.Clone(body)
			if !hit {
				toClient = appendBackendKeyData(toClient, pid, secret)
			}
		case 'E':
			// PostgreSQL's refusal, FATAL: the error of the client's
			// first request on the local path, of its startup otherwise.
			return nil, nil, appendMessage(toClient, typ, body), fmt.Errorf("%w: %s", ErrRefused, errorText(body))
		case 'Z':
			if !hit {
				toClient = appendMessage(toClient, typ, body)
			}
			return params, key, toClient, nil
		default:
			// NoticeResponse, NegotiateProtocolVersion (ordinary path only):
			// the client's to see.
			if hit && typ != 'N' {
				continue
			}
			toClient = appendMessage(toClient, typ, body)
		}
	}
}

// diff returns the parameters of got whose value is not the one cached.
func diff(cached, got []param) []param {
	var out []param
	for _, g := range got {
		i := slices.IndexFunc(cached, func(c param) bool { return c.name == g.name })
		if i < 0 || cached[i].value != g.value {
			out = append(out, g)
		}
	}
	return out
}

// store remembers a greeting's parameters for the next session with key.
func (s *Server) store(key string, params []param) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.cache[key]
	defer s.persist(key, old, had, params)
	if !had {
		if len(s.order) >= s.cfg.MaxCached {
			drop := len(s.order) / 2
			for _, k := range s.order[:drop] {
				delete(s.cache, k)
			}
			s.order = slices.Delete(s.order, 0, drop)
		}
		s.order = append(s.order, key)
	}
	s.cache[key] = params
}

// register gives sess a BackendKeyData of this side's own: a pid not in
// use and a random secret.
func (s *Server) register(sess *session) (uint32, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("localstart: cancel key: %w", err)
		}
		pid := binary.BigEndian.Uint32(b[:4]) & 0x7fffffff
		copy(sess.secret[:], b[4:])
		s.mu.Lock()
		if _, taken := s.keys[pid]; !taken && pid != 0 {
			s.keys[pid] = sess
			s.mu.Unlock()
			return pid, nil
		}
		s.mu.Unlock()
	}
}

// unregister drops sess from the cancel map.
func (s *Server) unregister(pid uint32, sess *session) {
	s.mu.Lock()
	if s.keys[pid] == sess {
		delete(s.keys, pid)
	}
	s.mu.Unlock()
	sess.once.Do(func() { close(sess.ready) })
}

// Cancel handles a CancelRequest packet (16 bytes, length word included)
// a client sent with a key this side handed out: it is sent, on a fresh
// stream, with the session's key at the pooler, once that is known. A key
// this side did not hand out is dropped, as PostgreSQL ignores a wrong one.
// It reports whether the request was forwarded.
func (s *Server) Cancel(ctx context.Context, pkt []byte) (bool, error) {
	if len(pkt) != 16 {
		return false, nil
	}
	pid := binary.BigEndian.Uint32(pkt[8:12])
	s.mu.Lock()
	sess := s.keys[pid]
	s.mu.Unlock()
	if sess == nil || subtle.ConstantTimeCompare(sess.secret[:], pkt[12:16]) != 1 {
		s.log.Debug("localstart: cancel request with an unknown key dropped", "pid", pid)
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	select {
	case <-sess.ready:
	case <-ctx.Done():
		return false, fmt.Errorf("localstart: cancel: waiting for the pooler's key: %w", ctx.Err())
	}
	if sess.poolerKey == nil {
		return false, nil // the session ended before the pooler answered
	}
	str, err := s.cfg.Dial(ctx)
	if err != nil {
		return false, fmt.Errorf("localstart: cancel: %w", err)
	}
	defer str.Close()
	req := binary.BigEndian.AppendUint32(nil, uint32(8+len(sess.poolerKey)))
	req = binary.BigEndian.AppendUint32(req, pgproto.CancelRequestCode)
	req = append(req, sess.poolerKey...)
	if _, err := str.Write(req); err != nil {
		return false, fmt.Errorf("localstart: cancel: %w", err)
	}
	if cw, ok := str.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	// The pooler closes the stream once it handled the request.
	_ = str.SetReadDeadline(time.Now().Add(s.cfg.Timeout))
	_, _ = io.Copy(io.Discard, str)
	return true, nil
}

// copyHalf copies src to dst and passes a clean end on as a half-close.
func copyHalf(dst net.Conn, src io.Reader) error {
	_, err := io.Copy(dst, src)
	if err == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			err = cw.CloseWrite()
		}
	}
	return err
}

// abort ends a stream without a clean FIN when it can (quicwire.Conn's
// Abort resets both halves), else closes it.
func abort(c net.Conn) {
	if a, ok := c.(interface{ Abort(pgproto.QUICErrorCode) }); ok {
		a.Abort(pgproto.QUICAborted)
		return
	}
	_ = c.Close()
}

// readMessage reads one backend message.
func readMessage(br *bufio.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[1:]))
	if n < 4 || n > maxGreetingMessage {
		return 0, nil, fmt.Errorf("message %q of length %d", hdr[0], n)
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(br, body); err != nil {
		return 0, nil, err
	}
	return hdr[0], body, nil
}

// authenticationOk is the AuthenticationOk message.
var authenticationOk = []byte{'R', 0, 0, 0, 8, 0, 0, 0, 0}

func appendMessage(dst []byte, typ byte, body []byte) []byte {
	dst = append(dst, typ)
	dst = binary.BigEndian.AppendUint32(dst, uint32(4+len(body)))
	return append(dst, body...)
}

func appendParameterStatus(dst []byte, name, value string) []byte {
	dst = append(dst, 'S')
	dst = binary.BigEndian.AppendUint32(dst, uint32(4+len(name)+1+len(value)+1))
	dst = append(dst, name...)
	dst = append(dst, 0)
	dst = append(dst, value...)
	return append(dst, 0)
}

func appendBackendKeyData(dst []byte, pid uint32, secret []byte) []byte {
	dst = append(dst, 'K')
	dst = binary.BigEndian.AppendUint32(dst, uint32(8+len(secret)))
	dst = binary.BigEndian.AppendUint32(dst, pid)
	return append(dst, secret...)
}

// errorResponse encodes an ErrorResponse.
func errorResponse(severity, code, msg string) []byte {
	var body []byte
	for _, f := range []struct {
		t byte
		v string
	}{{'S', severity}, {'V', severity}, {'C', code}, {'M', msg}} {
		body = append(body, f.t)
		body = append(body, f.v...)
		body = append(body, 0)
	}
	body = append(body, 0)
	return appendMessage(nil, 'E', body)
}

// ErrorResponse encodes an ErrorResponse with severity, SQLSTATE code and
// message, for callers that refuse a client before Serve (a wrong local
// password).
func ErrorResponse(severity, code, msg string) []byte { return errorResponse(severity, code, msg) }

// errorText returns an ErrorResponse body's SQLSTATE and message, for logs.
func errorText(body []byte) string {
	var code, msg string
	for len(body) > 1 {
		t := body[0]
		v, rest, ok := wire.CString(body[1:])
		if !ok {
			break
		}
		switch t {
		case 'C':
			code = string(v)
		case 'M':
			msg = string(v)
		}
		body = rest
	}
	return code + " " + msg
}

// ReadFirst reads a client's first packet within timeout, answering
// SSLRequest and GSSENCRequest with 'N' (the path beyond is QUIC, already
// encrypted, and the local hop is loopback or in-process), and returns the
// packet (length word included) and its request code: a StartupMessage's
// protocol version or pgproto.CancelRequestCode.
func ReadFirst(c net.Conn, timeout time.Duration) ([]byte, uint32, error) {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, 0, err
	}
	// A client may try GSSENCRequest, then SSLRequest, then start up.
	for range 3 {
		pkt, err := readStartupPacket(c)
		if err != nil {
			return nil, 0, err
		}
		code := binary.BigEndian.Uint32(pkt[4:8])
		if code == pgproto.SSLRequestCode || code == pgproto.GSSEncRequestCode {
			if _, err := c.Write([]byte{'N'}); err != nil {
				return nil, 0, fmt.Errorf("answer encryption request: %w", err)
			}
			continue
		}
		if err := c.SetReadDeadline(time.Time{}); err != nil {
			return nil, 0, err
		}
		return pkt, code, nil
	}
	return nil, 0, errors.New("too many encryption requests")
}

// readStartupPacket reads one length-prefixed startup-phase packet.
func readStartupPacket(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, fmt.Errorf("read startup packet length: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 8 || n > wire.MaxStartupLen {
		return nil, fmt.Errorf("invalid startup packet length %d", n)
	}
	pkt := make([]byte, n)
	copy(pkt, hdr[:])
	if _, err := io.ReadFull(r, pkt[4:]); err != nil {
		return nil, fmt.Errorf("read startup packet: %w", err)
	}
	return pkt, nil
}
