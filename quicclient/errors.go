package quicclient

import (
	"errors"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/pgproto"
)

// ErrorCode is an application error code of pgquic's QUIC wire contract,
// sent in CONNECTION_CLOSE, RESET_STREAM and STOP_SENDING frames. Its String
// method names it for logs. The server front's README (quicfront) lists
// when the server sends each one.
type ErrorCode = pgproto.QUICErrorCode

// The codes a client may see. The numbers are part of the wire contract and
// never change meaning.
const (
	// ErrCodeNoError (0): a session or connection simply ended.
	ErrCodeNoError = pgproto.QUICNoError
	// ErrCodeInternal (1): a failure inside pgquic.
	ErrCodeInternal = pgproto.QUICInternal
	// ErrCodeServerShutdown (2): the server is shutting down; re-dial.
	ErrCodeServerShutdown = pgproto.QUICServerShutdown
	// ErrCodeTooManyConns (3): the server refused the connection at its
	// bound, in all or for this client's source.
	ErrCodeTooManyConns = pgproto.QUICTooManyConns
	// ErrCodeStartupTimeout (4): the startup packet did not arrive in time.
	ErrCodeStartupTimeout = pgproto.QUICStartupTimeout
	// ErrCodeAborted (5): the stream ended without a clean FIN.
	ErrCodeAborted = pgproto.QUICAborted
	// ErrCodeTooManyStreams (6): the server runs its bound of sessions;
	// retry later or use fewer sessions.
	ErrCodeTooManyStreams = pgproto.QUICTooManyStreams
	// ErrCodeNoStreamTimeout (7): the connection opened no stream within the
	// server's startup timeout; the Dialer opens one as soon as it dials.
	ErrCodeNoStreamTimeout = pgproto.QUICNoStreamTimeout
)

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
var ErrDialerClosed = errors.New("quicclient: dialer closed")
