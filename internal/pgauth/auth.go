// Package pgauth authenticates PostgreSQL clients for the pgquic pooler and
// for the edge sidecar, which authenticates its local clients itself before
// it answers their startup (local startup). It depends on neither, so both
// can import it without the edge reaching the pooler.
//
// It implements the pooler's Authenticator with the password methods PostgreSQL
// offers (trust, scram-sha-256, md5 and password) against a PgBouncer-style
// userlist, following the server's own rules from src/backend/libpq/auth.c
// and auth-scram.c: md5 falls back to SCRAM for users stored with a SCRAM
// verifier, unknown users go through a mock exchange so their absence is not
// revealed, and failures read "password authentication failed for user".
// The wire exchanges follow "Message Flow: Start-up" and "SASL
// Authentication" in the PostgreSQL protocol documentation
// (https://www.postgresql.org/docs/current/sasl-authentication.html).
package pgauth

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/pgproto"
)

// Method names a client authentication method. The spellings are those of
// pg_hba.conf and PgBouncer's auth_type.
type Method string

const (
	// MethodTrust accepts every client without a password, optionally only
	// from loopback addresses (Config.TrustLoopbackOnly).
	MethodTrust Method = "trust"
	// MethodSCRAM runs SCRAM-SHA-256 (RFC 7677) without channel binding. It
	// is the default and the only method where neither the password nor a
	// replayable hash crosses the wire.
	MethodSCRAM Method = "scram-sha-256"
	// MethodMD5 runs PostgreSQL's salted md5 challenge, switching to SCRAM for
	// users whose secret is a SCRAM verifier, as PostgreSQL does.
	MethodMD5 Method = "md5"
	// MethodPassword asks for the cleartext password; use it only on an
	// encrypted transport (QUIC, or TCP with TLS).
	MethodPassword Method = "password"
)

// ParseMethod turns a configuration string into a Method. It accepts the
// constants' spellings in any case, plus PgBouncer's "plain" for
// MethodPassword, so a PgBouncer auth_type carries over.
func ParseMethod(s string) (Method, error) {
	switch m := Method(strings.ToLower(strings.TrimSpace(s))); m {
	case MethodTrust, MethodSCRAM, MethodMD5, MethodPassword:
		return m, nil
	case "plain":
		return MethodPassword, nil
	default:
		return "", fmt.Errorf("unknown auth method %q (want trust, scram-sha-256, md5 or password)", s)
	}
}

// Bounds on a client's authentication messages, PostgreSQL's own, counting
// the 4-byte length word as pq_getmessage does. A password packet (cleartext
// or md5) is read with PG_MAX_AUTH_TOKEN_LENGTH, 65535 bytes
// (recv_password_packet in src/backend/libpq/auth.c; older releases read it
// with a limit of 1000); a SASLInitialResponse or SASLResponse with
// PG_MAX_SASL_MESSAGE_LENGTH, 1024 bytes (CheckSASLAuth in
// src/backend/libpq/auth-sasl.c). Until a client has authenticated nothing
// larger is read from it; the pooler's MaxMessageLen applies only afterwards.
const (
	MaxPasswordPacketLen = 65535
	MaxSASLMessageLen    = 1024
)

// ErrProtocol reports a client message that breaks the authentication
// protocol (a malformed SASL message, a wrong mechanism, a request for
// channel binding). The pooler should answer it with SQLSTATE 08P01, as
// PostgreSQL does, rather than 28P01.
var ErrProtocol = errors.New("authentication protocol violation")

// Error is what Authenticate returns when a client is refused. Its Error
// text is safe to send to the client; Detail, which can say why (for example
// that the user is not in the userlist), is meant for server logs only, the
// same split PostgreSQL makes between the client message and the log.
type Error struct {
	// Kind is ErrAuthFailed (wrong credentials, SQLSTATE 28P01) or
	// ErrProtocol (malformed client messages, SQLSTATE 08P01).
	Kind error
	// User is the user name from the StartupMessage.
	User string
	// Message is the client-facing text.
	Message string
	// Detail explains the failure for the server log.
	Detail string
	// Err is the underlying cause, if any.
	Err error
}

// Error returns the client-facing message.
func (e *Error) Error() string { return e.Message }

// Unwrap exposes both the kind and the cause to errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

// SQLState returns the SQLSTATE a server sends for this failure: 28P01 for
// wrong credentials and 08P01 for protocol violations. The pooler can find it
// with errors.As against an interface{ SQLState() string } without importing
// this package.
func (e *Error) SQLState() string {
	if errors.Is(e.Kind, ErrProtocol) {
		return pgproto.CodeProtocolViolation
	}
	return pgproto.CodeInvalidPassword
}

// LogValue includes the detail and cause when the error is logged with slog.
func (e *Error) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("msg", e.Message), slog.String("user", e.User)}
	if e.Detail != "" {
		attrs = append(attrs, slog.String("detail", e.Detail))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("cause", e.Err.Error()))
	}
	return slog.GroupValue(attrs...)
}

// authFailed builds the error for wrong or missing credentials, with the
// message PostgreSQL sends whatever the real reason.
func authFailed(user, detail string) error {
	return &Error{
		Kind:    ErrAuthFailed,
		User:    user,
		Message: fmt.Sprintf("password authentication failed for user %q", user),
		Detail:  detail,
	}
}

// protocolError builds the error for a malformed client message.
func protocolError(user, msg string, cause error) error {
	return &Error{Kind: ErrProtocol, User: user, Message: msg, Detail: msg, Err: cause}
}

// Config selects how clients authenticate.
type Config struct {
	// Method is the authentication method. The zero value means MethodSCRAM.
	Method Method
	// Users holds the secrets. It is required by every method except
	// MethodTrust, which ignores it. There is no default.
	Users *Userlist
	// TrustLoopbackOnly limits MethodTrust to clients on loopback addresses
	// (and to peers with no IP address, such as Unix sockets). Default false:
	// trust accepts every client.
	TrustLoopbackOnly bool
}

// Authenticator checks clients against a Config. It implements
// the pooler's Authenticator and is safe for concurrent use by many sessions.
type Authenticator struct {
	method       Method
	users        *Userlist
	loopbackOnly bool

	// mockKey seeds the fake verifiers used for unknown users, so one user
	// name always gets the same fake salt within a process, as PostgreSQL's
	// mock authentication does.
	mockKey []byte

	mu sync.Mutex
	// plainSCRAM caches verifiers derived from plaintext secrets, keyed by
	// user: PBKDF2 is deliberately slow and the result never changes.
	plainSCRAM map[string]cachedKeys
}

// cachedKeys remembers which plaintext password a cached verifier was made
// from, so a different Secret for the same user is never served stale keys.
type cachedKeys struct {
	plain string
	keys  scramKeys
}

// Exchange is the part of a session an Authenticator uses: send
// authentication requests and read the client's password-type ('p')
// replies. The pooler's sessions and the edge's local sessions implement it;
// pooler.AuthExchange is this type.
type Exchange interface {
	// Send writes and flushes the messages.
	Send(msgs ...pgproto3.BackendMessage) error
	// ReceivePassword reads the next client message, which must be of type
	// 'p' (PasswordMessage, SASLInitialResponse or SASLResponse), and returns
	// its body. The slice is valid until the next call.
	ReceivePassword(ctx context.Context) ([]byte, error)
}

// ErrAuthFailed reports wrong or missing credentials. Sessions that fail
// with it get SQLSTATE 28P01, as PostgreSQL sends for a bad password;
// pooler.ErrAuthFailed is this value.
var ErrAuthFailed = errors.New("authentication failed")

// New validates cfg and returns an Authenticator. Every method except trust
// needs Users.
func New(cfg Config) (*Authenticator, error) {
	if cfg.Method == "" {
		cfg.Method = MethodSCRAM
	}
	if _, err := ParseMethod(string(cfg.Method)); err != nil || Method(strings.ToLower(string(cfg.Method))) != cfg.Method {
		return nil, fmt.Errorf("auth: unknown method %q", cfg.Method)
	}
	if cfg.Method != MethodTrust && cfg.Users == nil {
		return nil, fmt.Errorf("auth: method %s needs a userlist", cfg.Method)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("auth: mock key: %w", err)
	}
	return &Authenticator{
		method:       cfg.Method,
		users:        cfg.Users,
		loopbackOnly: cfg.TrustLoopbackOnly,
		mockKey:      key,
		plainSCRAM:   make(map[string]cachedKeys),
	}, nil
}

// Method reports the configured method, for logs.
func (a *Authenticator) Method() Method { return a.method }

// Authenticate runs the configured method for user over ex. It returns nil
// when the client proved its identity (the caller then sends
// AuthenticationOk), an error wrapping ErrAuthFailed for wrong
// credentials, an error wrapping ErrProtocol for malformed client messages,
// and the transport's or ctx's error when the exchange could not finish.
func (a *Authenticator) Authenticate(ctx context.Context, ex Exchange, user string, peer net.Addr) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if a.method == MethodTrust {
		if a.loopbackOnly && !isLocalPeer(peer) {
			return &Error{
				Kind:    ErrAuthFailed,
				User:    user,
				Message: fmt.Sprintf("trust authentication failed for user %q: only loopback clients are trusted", user),
				Detail:  fmt.Sprintf("peer %s is not a loopback address", peer),
			}
		}
		return nil
	}

	secret, found := a.users.Lookup(user)
	switch a.method {
	case MethodSCRAM:
		return a.scramAuth(ctx, ex, user, secret, found)
	case MethodMD5:
		if found && secret.kind == SecretSCRAM {
			// PostgreSQL: "If 'md5' authentication is allowed, decide whether
			// to perform 'md5' or 'scram-sha-256' authentication based on the
			// type of password the user has."
			return a.scramAuth(ctx, ex, user, secret, found)
		}
		return a.md5Auth(ctx, ex, user, secret, found)
	case MethodPassword:
		return a.passwordAuth(ctx, ex, user, secret, found)
	default:
		return fmt.Errorf("auth: unknown method %q", a.method)
	}
}

// isLocalPeer reports whether peer is a loopback IP, or carries no IP at all
// (nil, Unix sockets, in-process pipes), which counts as local.
func isLocalPeer(peer net.Addr) bool {
	switch p := peer.(type) {
	case nil:
		return true
	case *net.TCPAddr:
		return p == nil || p.IP.IsLoopback()
	case *net.UDPAddr:
		return p == nil || p.IP.IsLoopback()
	case *net.IPAddr:
		return p == nil || p.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	}
	s := peer.String()
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().IsLoopback()
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip.Unmap().IsLoopback()
	}
	return true
}
