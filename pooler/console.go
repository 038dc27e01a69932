package pooler

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/wire"
	"github.com/pgquic/pgquic/pooler/startup"
)

// The admin console hook: a client whose StartupMessage names one of the
// console's virtual databases is authenticated like any other client, then
// handed to the Console instead of a server pool. The console itself lives
// in package admin; this file only routes sessions to it.

// consoleMaxMessage bounds one message from a console client. Console
// commands are a few words; PgBouncer reads at most a few hundred bytes.
const consoleMaxMessage = 64 << 10

// Console serves the admin console's virtual databases. Package admin
// implements it; the pooler calls it for sessions whose database it claims.
type Console interface {
	// IsConsole reports whether a client asking for database wants the
	// console rather than a server pool.
	IsConsole(database string) bool
	// Allowed reports whether user, already authenticated, may use the
	// console. Others are refused as PgBouncer refuses them.
	Allowed(user string) bool
	// Serve runs the console for one client until it leaves or the session
	// ends, reading its messages and answering them through conn. The
	// greeting (AuthenticationOk to ReadyForQuery) has been sent already.
	Serve(ctx context.Context, conn *ConsoleConn) error
}

// consoleHolder lets SetConsole swap the console atomically.
type consoleHolder struct{ c Console }

// SetConsole routes sessions for c's virtual databases to c. Call it before
// the fronts start serving; nil removes the console, and then those
// databases are looked up like any other.
func (p *Pooler) SetConsole(c Console) {
	if c == nil {
		p.consoleRef.Store(nil)
		return
	}
	p.consoleRef.Store(&consoleHolder{c: c})
}

// console returns the Pooler's console, or nil.
func (p *Pooler) console() Console {
	if h := p.consoleRef.Load(); h != nil {
		return h.c
	}
	return nil
}

// ConsoleConn is a console session's connection to its client: it reads
// whole messages and writes frames. It is used by the session's own
// goroutine only.
type ConsoleConn struct {
	s *session
}

// User returns the authenticated user name.
func (c *ConsoleConn) User() string { return c.s.user }

// Database returns the virtual database the client asked for.
func (c *ConsoleConn) Database() string { return c.s.database }

// ID returns the session's identifier, the id column of SHOW CLIENTS.
func (c *ConsoleConn) ID() uint64 { return c.s.id }

// Next reads the next client message and returns its type and body. The
// body is valid until the next call. A message longer than 64 KiB, or a
// malformed length, is an error wrapping ErrProtocol.
func (c *ConsoleConn) Next() (typ byte, body []byte, err error) {
	typ, _, err = c.s.cr.Next()
	if err != nil {
		if errors.Is(err, wire.ErrBadLength) || errors.Is(err, wire.ErrMessageTooLarge) {
			return 0, nil, fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		if c.s.isKilled() {
			return 0, nil, ErrShuttingDown
		}
		return 0, nil, err
	}
	body, err = c.s.cr.Body()
	return typ, body, err
}

// Write writes frames to the client and flushes them.
func (c *ConsoleConn) Write(b []byte) error { return c.s.writeRaw(b) }

// ErrProtocol reports a message from a console client that breaks the
// protocol's framing.
var ErrProtocol = errors.New("protocol violation")

// loginConsole finishes the login of a client that asked for the console:
// it refuses users the console does not allow, with PgBouncer's FATAL 08P01
// "not allowed", and greets the others.
func (s *session) loginConsole(c Console, sp *startup.Params) error {
	if !c.Allowed(sp.User) {
		s.log.Info("admin console refused: user not in admin_users")
		pe := fatal(pgproto.CodeProtocolViolation, "not allowed", nil)
		pe.Detail = fmt.Sprintf("User %q may not use the admin console database %q.", sp.User, sp.Database)
		pe.Hint = "Add the user to admin_users (--admin-users)."
		return s.fail(pe)
	}
	s.cr.SetMaxLen(consoleMaxMessage)
	s.console = c
	s.appName = sp.Settings["application_name"]
	s.listed.Store(true)
	msgs := []pgproto3.BackendMessage{&pgproto3.AuthenticationOk{}}
	for _, kv := range consoleParams {
		msgs = append(msgs, &pgproto3.ParameterStatus{Name: kv[0], Value: kv[1]})
	}
	msgs = append(msgs,
		&pgproto3.BackendKeyData{ProcessID: s.pid, SecretKey: s.secret[:]},
		&pgproto3.ReadyForQuery{TxStatus: 'I'})
	s.loggedIn = true
	return s.send(msgs...)
}

// consoleParams are the ParameterStatus values a console client gets,
// those PgBouncer sends to its admin clients; server_version is the
// PostgreSQL release the pooler is tested with, so psql accepts it.
var consoleParams = [][2]string{
	{"server_version", "15.0"},
	{"server_encoding", "UTF8"},
	{"client_encoding", "UTF8"},
	{"DateStyle", "ISO"},
	{"TimeZone", "UTC"},
	{"standard_conforming_strings", "on"},
	{"integer_datetimes", "on"},
}

// serveConsole runs the console for a session that logged in to it.
func (s *session) serveConsole(ctx context.Context) error {
	err := s.console.Serve(ctx, &ConsoleConn{s: s})
	if errors.Is(err, ErrProtocol) {
		return s.fail(fatal(pgproto.CodeProtocolViolation, "invalid message length", err))
	}
	return s.clientGone(err)
}
