// Package quicfront carries PostgreSQL sessions over QUIC: every client-initiated
// bidirectional stream is one PostgreSQL session, byte for byte as on TCP.
//
// It holds both ends of the QUIC wire contract (version 1, see DESIGN.md): the
// Server, which accepts QUIC connections and hands each stream to a Handler
// (the pooler), the Dialer, which opens streams over a few shared QUIC
// connections and plugs into pgx as a DialFunc, and the Edge, a sidecar that
// turns local TCP connections from any libpq client into streams.
package quicfront

import (
	"errors"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/pgproto"
)

// ErrorCode is an application error code sent in QUIC CONNECTION_CLOSE,
// RESET_STREAM and STOP_SENDING frames. Peers see the number, so the values
// are part of the wire contract and never change meaning; README.md lists
// them. They are defined once, in internal/pgproto, which the client shares.
type ErrorCode = pgproto.QUICErrorCode

// The application error codes of the wire contract; see internal/pgproto for
// what each means.
const (
	ErrCodeNoError        = pgproto.QUICNoError
	ErrCodeInternal       = pgproto.QUICInternal
	ErrCodeServerShutdown = pgproto.QUICServerShutdown
	ErrCodeTooManyConns   = pgproto.QUICTooManyConns
	ErrCodeStartupTimeout = pgproto.QUICStartupTimeout
	ErrCodeAborted        = pgproto.QUICAborted
	ErrCodeTooManyStreams = pgproto.QUICTooManyStreams
)

func streamCode(c ErrorCode) quic.StreamErrorCode   { return quic.StreamErrorCode(c) }
func appCode(c ErrorCode) quic.ApplicationErrorCode { return quic.ApplicationErrorCode(c) }

// RemoteErrorCode extracts the application error code the peer sent when it
// reset a stream or closed the connection. It lets callers tell a server
// shutdown (worth a retry on a fresh connection) from other failures.
func RemoteErrorCode(err error) (ErrorCode, bool) {
	var se *quic.StreamError
	if errors.As(err, &se) && se.Remote {
		return ErrorCode(se.ErrorCode), true
	}
	var ae *quic.ApplicationError
	if errors.As(err, &ae) && ae.Remote {
		return ErrorCode(ae.ErrorCode), true
	}
	return 0, false
}

// ErrDialerClosed is returned by Dial after Close.
var ErrDialerClosed = errors.New("quicfront: dialer closed")

// ErrServerClosed is returned by Listen or Serve once the server was shut down.
var ErrServerClosed = errors.New("quicfront: server closed")
