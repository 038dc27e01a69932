package pooler

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/wire"
	"github.com/pgquic/pgquic/pooler/startup"
)

// Bounds on a client's authentication messages: PostgreSQL's own, defined
// once in pgauth (the edge's local authentication applies them too). Until
// a client has authenticated nothing larger is read from it; MaxMessageLen
// applies only afterwards.
const (
	maxPasswordPacketLen = pgauth.MaxPasswordPacketLen
	maxSASLMessageLen    = pgauth.MaxSASLMessageLen
)

// errCancelHandled ends a session that only carried a CancelRequest.
var errCancelHandled = errors.New("cancel request handled")

// errTooManyStarting is the cause of a session refused because too many
// sessions (in all, or from its source) were still authenticating.
var errTooManyStarting = errors.New("too many sessions still authenticating")

// StartingSessions reports how many sessions have begun but not finished
// authenticating, the number MaxStartingClients bounds. Fronts and tests use
// it to see unauthenticated load.
func (p *Pooler) StartingSessions() int { return p.starting.Count() }

// startup runs the startup phase up to and including ReadyForQuery, or
// returns the error that ended it (already reported to the client).
//
// From its first read until the client has authenticated, the session holds
// a slot of MaxStartingClients and MaxStartingPerSource. Without one it is
// refused at once, before anything is read, so clients that connect and
// stay silent cannot pile up beyond those limits.
func (s *session) startup(ctx context.Context) error {
	src := front.Source(s.peer.Addr) // IPv6 clients by their /64
	if msg, ok := s.p.starting.Acquire(src, s.p.cfg.MaxStartingClients, s.p.cfg.MaxStartingPerSource); !ok {
		s.log.Info("refusing a session: too many still authenticating", "source", src)
		return s.fail(fatal(pgproto.CodeTooManyConnections, msg, errTooManyStarting))
	}
	held := true
	authenticated := func() {
		if held {
			held = false
			s.p.starting.Release(src)
		}
	}
	defer authenticated()
	sp, err := s.readStartup(ctx)
	if err != nil {
		return err
	}
	return s.login(ctx, sp, authenticated)
}

// readStartup reads the startup phase's packets until the StartupMessage,
// answering SSLRequest and GSSENCRequest and routing a CancelRequest, and
// decodes it (startup.Parse).
func (s *session) readStartup(ctx context.Context) (*startup.Params, error) {
	for {
		body, err := s.cr.ReadStartup()
		if err != nil {
			return nil, s.badStartup(err)
		}
		code := binary.BigEndian.Uint32(body)
		switch code {
		case pgproto.SSLRequestCode:
			answer := byte('S')
			if s.peer.StartTLS == nil || s.secure {
				answer = 'N'
			}
			if s.cr.Buffered() > 0 {
				// Bytes after an SSLRequest would be read as if encrypted
				// (CVE-2021-23214); PostgreSQL refuses them too, after
				// its answer.
				_ = s.writeRaw([]byte{answer})
				return nil, s.fail(fatal(pgproto.CodeProtocolViolation, "received unencrypted data after SSL request", nil))
			}
			if err := s.writeRaw([]byte{answer}); err != nil {
				return nil, err
			}
			if answer == 'N' {
				continue
			}
			rwc, err := s.peer.StartTLS(ctx)
			if err != nil {
				return nil, fmt.Errorf("TLS handshake: %w", err)
			}
			s.setStream(rwc)
			s.secure = true
			continue
		case pgproto.GSSEncRequestCode:
			if s.cr.Buffered() > 0 {
				_ = s.writeRaw([]byte{'N'})
				return nil, s.fail(fatal(pgproto.CodeProtocolViolation, "received unencrypted data after GSSAPI encryption request", nil))
			}
			if err := s.writeRaw([]byte{'N'}); err != nil {
				return nil, err
			}
			continue
		case pgproto.CancelRequestCode:
			if len(body) < 8 || len(body) > 4+4+256 {
				return nil, errCancelHandled
			}
			pid := binary.BigEndian.Uint32(body[4:8])
			key := bytes.Clone(body[8:])
			if s.peer.HandshakeConfirmed != nil { // a replayed cancel would cancel again
				if err := s.awaitConfirmed(ctx); err != nil {
					return nil, errCancelHandled
				}
			}
			s.p.cancel(ctx, pid, key)
			return nil, errCancelHandled
		}
		major, minor := code>>16, uint16(code&0xffff)
		if major != pgproto.ProtocolMajor {
			msg := fmt.Sprintf("unsupported frontend protocol %d.%d: server supports %d.0 to %d.%d", major, minor,
				pgproto.ProtocolMajor, pgproto.ProtocolMajor, pgproto.ProtocolMinor)
			if major < pgproto.ProtocolMajor {
				// A client speaking protocol 2 or older reads errors in
				// that protocol's format, which is how PostgreSQL answers.
				s.log.Info("refusing an old protocol version", "protocol", fmt.Sprintf("%d.%d", major, minor))
				s.p.m.errors.WithLabelValues(pgproto.CodeFeatureNotSupported).Inc()
				_ = s.writeRaw(startup.AppendV2Error(nil, msg))
				return nil, fatal(pgproto.CodeFeatureNotSupported, msg, nil)
			}
			return nil, s.fail(fatal(pgproto.CodeFeatureNotSupported, msg, nil))
		}
		sp, perr := startup.Parse(body[4:])
		if perr != nil {
			return nil, s.fail(fatal(perr.Code, perr.Message, nil))
		}
		sp.Minor = minor
		return sp, nil
	}
}

// errBadStartup ends a session whose first packet is not a startup packet
// (an impossible length) or that ended before sending a whole one.
var errBadStartup = errors.New("bad startup packet")

// badStartup handles a failed read of a startup-phase packet the way
// PostgreSQL does (ProcessStartupPacket in src/backend/postmaster): an
// impossible length ("invalid length of startup packet", also what a
// Terminate or stray bytes before any startup packet look like) or a packet
// cut short ("incomplete startup packet") is logged and the connection
// closed without a reply, and a client that connects and closes without
// sending anything is not even logged. The client is not told: nothing it
// sent so far says it speaks the protocol.
func (s *session) badStartup(err error) error {
	switch {
	case errors.Is(err, wire.ErrBadLength), errors.Is(err, wire.ErrMessageTooLarge):
		s.log.Info("invalid length of startup packet", "err", err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		s.log.Info("incomplete startup packet")
	case errors.Is(err, io.EOF):
		s.log.Debug("client closed before sending a startup packet")
	default:
		return fmt.Errorf("reading startup packet: %w", err)
	}
	return fmt.Errorf("%w: %w", errBadStartup, err)
}

// login authenticates the client, finds its pool and sends the greeting:
// AuthenticationOk, ParameterStatus, BackendKeyData and ReadyForQuery.
// authenticated is called once the client has proved its identity.
func (s *session) login(ctx context.Context, sp *startup.Params, authenticated func()) error {
	if err := s.admit(sp); err != nil {
		return err
	}
	s.user, s.database = sp.User, sp.Database
	s.log = s.logger(true)
	if err := s.authenticate(ctx, sp); err != nil {
		return err
	}
	authenticated()
	if c := s.p.console(); c != nil && c.IsConsole(sp.Database) {
		return s.loginConsole(c, sp)
	}
	s.cr.SetMaxLen(s.p.cfg.MaxMessageLen)
	// AuthenticationOk goes out with whatever comes next, the greeting or
	// an error: PostgreSQL too says a client is authenticated before it
	// checks the database and applies the startup parameters.
	if err := s.writeClient(authenticationOk); err != nil {
		return err
	}
	if err := s.choosePool(ctx, sp); err != nil {
		return err
	}
	defaults, err := s.serverDefaults(ctx, sp)
	if err != nil {
		return err
	}
	if s.desired == nil {
		// Transaction mode: the greeting reports the client's values in the
		// server's spelling (see greeting.go).
		if err := s.canonicalStartup(ctx, defaults, sp); err != nil {
			return s.fail(asFatal(err))
		}
	}
	return s.greet(defaults, sp)
}

// admit counts the client against the pooler's limits (TLS required,
// max_clients) and tells it which protocol options it does not know. A
// refusal has been written to the client when it returns an error.
func (s *session) admit(sp *startup.Params) error {
	p := s.p
	if s.peer.RequireTLS && !s.secure {
		return s.fail(fatal(pgproto.CodeInvalidAuthSpec, "TLS is required: connect with sslmode=require", nil))
	}
	if n := p.active.Add(1); n > int64(p.cfg.MaxClients) {
		p.active.Add(-1)
		return s.fail(fatal(pgproto.CodeTooManyConnections, "sorry, too many clients already", nil))
	}
	s.counted = true
	p.m.clients.Inc()
	p.m.sessions.WithLabelValues(s.peer.Transport).Inc()
	if sp.Minor > pgproto.ProtocolMinor || len(sp.Unknown) > 0 {
		return s.send(&pgproto3.NegotiateProtocolVersion{NewestMinorProtocol: pgproto.ProtocolMinor, UnrecognizedOptions: sp.Unknown})
	}
	return nil
}

// authenticate has the client prove its identity: a trusted edge's word
// for it (edgetrust.go), or the configured authenticator's exchange. The
// error the client is shown never says whether the user exists.
func (s *session) authenticate(ctx context.Context, sp *startup.Params) error {
	trusted, refusal := s.edgeLogin(sp)
	if refusal != nil {
		return s.fail(refusal)
	}
	auth := s.p.cfg.Auth
	if trusted || auth == nil {
		return nil
	}
	err := auth.Authenticate(ctx, s, sp.User, s.peer.Addr)
	if err == nil {
		return nil
	}
	var pe *PGError
	var coded interface{ SQLState() string }
	switch {
	case errors.As(err, &pe):
		return s.fail(pe)
	case errors.As(err, &coded):
		// The authenticator's error text is written to be shown to
		// the client (it never says whether the user exists).
		s.log.Info("authentication failed", "err", err)
		return s.fail(fatal(coded.SQLState(), err.Error(), err))
	case errors.Is(err, ErrAuthFailed):
		return s.fail(fatal(pgproto.CodeInvalidPassword, fmt.Sprintf("password authentication failed for user %q", sp.User), err))
	case ctx.Err() != nil:
		return err
	}
	return s.fail(fatal(pgproto.CodeProtocolViolation, "authentication exchange failed", err))
}

// choosePool finds the pool of the client's database and user, or refuses
// the client.
func (s *session) choosePool(ctx context.Context, sp *startup.Params) error {
	pool, err := s.p.pools.Pool(ctx, sp.Database, sp.User)
	if errors.Is(err, backend.ErrTooManyPools) {
		return s.fail(fatal(pgproto.CodeTooManyConnections, fmt.Sprintf("sorry, too many pools already: no pool for database %q user %q (max_pools)", sp.Database, sp.User), err))
	}
	if err != nil {
		return s.fail(fatal(pgproto.CodeInvalidCatalogName, fmt.Sprintf("database %q does not exist for user %q in the pooler", sp.Database, sp.User), err))
	}
	s.pool = pool
	return nil
}

// serverDefaults returns the server's parameters the greeting reports, as
// a connection of the pool got them at login: the newest one's, or, when
// the pool has no connection, those of one opened now (in session mode
// the client's own server connection, kept for the whole session, which
// it attaches). Nothing is cached beyond the connection it came from, so
// a changed database default reaches new clients once the old
// connections are gone.
func (s *session) serverDefaults(ctx context.Context, sp *startup.Params) (map[string]string, error) {
	p := s.p
	defaults := s.pool.ServerParams()
	if defaults != nil && p.cfg.Mode != ModeSession {
		return defaults, nil
	}
	conn, _, err := s.acquireConn(ctx, pipeBatch{})
	if err != nil {
		return nil, s.fail(asFatal(err))
	}
	defaults = conn.ServerDefaults
	if p.cfg.Mode != ModeSession {
		if !p.learnOn(ctx, conn) {
			conn.Destroy()
		} else {
			conn.Release()
		}
		return defaults, nil
	}
	s.initDesired(defaults, sp.Settings)
	if _, err := s.syncParams(ctx, conn); err != nil {
		conn.Release()
		return nil, s.fail(asFatal(err))
	}
	// The client holds this server for its whole session, so it gets
	// the server's own process ID: pg_terminate_backend and
	// pg_stat_activity then mean what the client expects.
	p.rekey(s, conn.PID)
	s.mu.Lock()
	s.startAttachmentLocked(conn, nil)
	s.lastRequest = time.Now() // until the first request stamps it
	s.mu.Unlock()
	return defaults, nil
}

// greet writes the greeting, the server's parameters, the client's cancel
// key and ReadyForQuery, in one write, and marks the session logged in.
func (s *session) greet(defaults map[string]string, sp *startup.Params) error {
	buf := s.appendGreeting(s.scratch[:0], defaults)
	bkd := pgproto3.BackendKeyData{ProcessID: s.pid, SecretKey: s.secret[:]}
	buf, err := bkd.Encode(buf)
	if err != nil {
		return fmt.Errorf("encoding BackendKeyData: %w", err)
	}
	buf = append(buf, 'Z', 0, 0, 0, 5, 'I')
	s.loggedIn = true
	s.authed.Store(true)
	s.appName = sp.Settings["application_name"]
	s.ctr.Logins.Add(1)
	s.listed.Store(true)
	s.scratch = buf[:0]
	return s.writeRaw(buf)
}

// authenticationOk is the AuthenticationOk message.
var authenticationOk = []byte{'R', 0, 0, 0, 8, 0, 0, 0, 0}

// asFatal turns an error from acquiring a server connection into what the
// client is told during startup.
func asFatal(err error) *PGError {
	var pe *PGError
	if errors.As(err, &pe) {
		c := *pe
		c.Severity = "FATAL"
		return &c
	}
	return fatal(pgproto.CodeConnectionFailure, "could not get a server connection", err)
}
