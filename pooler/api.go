package pooler

import (
	"context"
	"net"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgauth"
)

// PoolSource finds the server pool for a client's database and user. The
// backend package's Manager implements it; tests may supply their own.
type PoolSource interface {
	// Pool returns the pool serving database and user, or an error wrapping
	// backend.ErrNoRoute when no route matches.
	Pool(ctx context.Context, database, user string) (*backend.Pool, error)
}

// Authenticator verifies a client's identity during startup. The pooler
// calls it after reading the StartupMessage and before sending
// AuthenticationOk.
type Authenticator interface {
	// Authenticate runs the exchange for user over ex. It returns an error
	// wrapping ErrAuthFailed when the credentials are wrong.
	Authenticate(ctx context.Context, ex AuthExchange, user string, peer net.Addr) error
}

// AuthExchange is the part of a session an Authenticator may use: send
// authentication requests and read the client's password-type ('p') replies.
// It is pgauth.Exchange, so the methods of internal/pgauth serve the pooler's
// sessions and the edge's local ones alike.
type AuthExchange = pgauth.Exchange
