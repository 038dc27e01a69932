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
	"fmt"

	"github.com/quic-go/quic-go"
)

// ErrorCode is an application error code sent in QUIC CONNECTION_CLOSE,
// RESET_STREAM and STOP_SENDING frames. Peers see the number, so the values
// are part of the wire contract and never change meaning; README.md lists them.
type ErrorCode uint64

const (
	// ErrCodeNoError closes a stream direction or a connection that is simply
	// done: a session ended normally, or a Dialer was closed.
	ErrCodeNoError ErrorCode = 0
	// ErrCodeInternal reports a failure inside pgquic that is not the peer's fault.
	ErrCodeInternal ErrorCode = 1
	// ErrCodeServerShutdown closes connections, and refuses new streams, while
	// the server shuts down. Clients should re-dial, possibly to another server.
	ErrCodeServerShutdown ErrorCode = 2
	// ErrCodeTooManyConns refuses a QUIC connection beyond the server's
	// MaxConns bound. Clients should share fewer connections or retry later.
	ErrCodeTooManyConns ErrorCode = 3
	// ErrCodeStartupTimeout resets a stream whose startup packet did not arrive
	// within the server's StreamStartupTimeout, so idle streams cannot pin credit.
	ErrCodeStartupTimeout ErrorCode = 4
	// ErrCodeAborted resets a stream direction that ends without a clean FIN:
	// the other side reset the stream first, or the stream was closed while a
	// write was still in progress.
	ErrCodeAborted ErrorCode = 5
	// ErrCodeTooManyStreams resets, on both halves, a stream opened while
	// the server already runs MaxStreams sessions and is busy answering
	// other streams beyond it. Clients should retry later or use fewer
	// sessions.
	ErrCodeTooManyStreams ErrorCode = 6
)

// String names the code for logs.
func (c ErrorCode) String() string {
	switch c {
	case ErrCodeNoError:
		return "no_error"
	case ErrCodeInternal:
		return "internal"
	case ErrCodeServerShutdown:
		return "server_shutdown"
	case ErrCodeTooManyConns:
		return "too_many_conns"
	case ErrCodeStartupTimeout:
		return "startup_timeout"
	case ErrCodeAborted:
		return "aborted"
	case ErrCodeTooManyStreams:
		return "too_many_streams"
	default:
		return fmt.Sprintf("error_code_%d", uint64(c))
	}
}

func (c ErrorCode) stream() quic.StreamErrorCode   { return quic.StreamErrorCode(c) }
func (c ErrorCode) app() quic.ApplicationErrorCode { return quic.ApplicationErrorCode(c) }

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
