// Package pgproto holds the wire-level facts every part of pgquic shares, so
// each is written down once: the request codes and protocol version of the
// PostgreSQL startup packet, the SQLSTATEs pgquic raises itself, and the
// constants of pgquic's QUIC wire contract (its ALPN and application error
// codes). It needs nothing beyond the standard library, so the QUIC client
// package can use it without dragging the server in.
package pgproto

import "fmt"

// Codes sent in place of a protocol version in the first packet of a
// connection, from "Message Formats" in the PostgreSQL documentation
// (https://www.postgresql.org/docs/current/protocol-message-formats.html).
const (
	// CancelRequestCode starts a CancelRequest: the process ID and secret
	// key of the session whose query is to be canceled follow.
	CancelRequestCode = 80877102
	// SSLRequestCode asks the server to start TLS; it answers 'S' or 'N'.
	SSLRequestCode = 80877103
	// GSSEncRequestCode asks for GSSAPI encryption; pgquic always answers 'N'.
	GSSEncRequestCode = 80877104
)

// The protocol version pgquic speaks. A StartupMessage carries the major
// version in the high 16 bits of its version word and the minor in the low
// 16; a client asking for a newer minor (3.2) or for _pq_ options is answered
// with NegotiateProtocolVersion naming ProtocolMinor.
const (
	ProtocolMajor   = 3
	ProtocolMinor   = 0
	ProtocolVersion = ProtocolMajor<<16 | ProtocolMinor
)

// SQLSTATE codes pgquic sends in ErrorResponses of its own, from "Appendix A.
// PostgreSQL Error Codes" (https://www.postgresql.org/docs/current/errcodes-appendix.html).
const (
	CodeConnectionFailure     = "08006"
	CodeProtocolViolation     = "08P01"
	CodeFeatureNotSupported   = "0A000"
	CodeUndefinedPStatement   = "26000"
	CodeInvalidAuthSpec       = "28000"
	CodeInvalidPassword       = "28P01"
	CodeInvalidCatalogName    = "3D000"
	CodeSyntaxError           = "42601"
	CodeInsufficientPrivilege = "42501"
	CodeDuplicatePStatement   = "42P05"
	CodeOutOfMemory           = "53200"
	CodeTooManyConnections    = "53300"
	CodeInsufficientResource  = "53400"
	CodeProgramLimitExceeded  = "54000"
	CodeQueryCanceled         = "57014"
	CodeAdminShutdown         = "57P01"
	// CodeIdleSessionTimeout ends a session idle longer than
	// client_idle_timeout, as PostgreSQL's idle_session_timeout does.
	CodeIdleSessionTimeout = "57P05"
	// CodeIdleInTransactionTimeout ends a session idle inside a transaction
	// longer than idle_transaction_timeout, as PostgreSQL's
	// idle_in_transaction_session_timeout does.
	CodeIdleInTransactionTimeout = "25P03"
)

// ALPN is the TLS application protocol of the QUIC wire contract, version 1.
// Client and server must agree on it; both take it as their default.
const ALPN = "pgquic/1"

// QUICErrorCode is an application error code sent in QUIC CONNECTION_CLOSE,
// RESET_STREAM and STOP_SENDING frames. Peers see the number, so the values
// are part of the wire contract and never change meaning; the server front's
// README (quicfront/README.md) lists them.
type QUICErrorCode uint64

const (
	// QUICNoError closes a stream direction or a connection that is simply
	// done: a session ended normally, or a client was closed.
	QUICNoError QUICErrorCode = 0
	// QUICInternal reports a failure inside pgquic that is not the peer's fault.
	QUICInternal QUICErrorCode = 1
	// QUICServerShutdown closes connections, and refuses new streams, while
	// the server shuts down. Clients should re-dial, possibly to another server.
	QUICServerShutdown QUICErrorCode = 2
	// QUICTooManyConns refuses a QUIC connection beyond the server's
	// connection bound, in all or for the client's source (its IPv4
	// address or IPv6 /64). Clients should share fewer connections or
	// retry later.
	QUICTooManyConns QUICErrorCode = 3
	// QUICStartupTimeout resets a stream whose startup packet did not arrive
	// in time, so idle streams cannot pin credit.
	QUICStartupTimeout QUICErrorCode = 4
	// QUICAborted resets a stream direction that ends without a clean FIN:
	// the other side reset the stream first, or the stream was closed while a
	// write was still in progress.
	QUICAborted QUICErrorCode = 5
	// QUICTooManyStreams resets, on both halves, a stream opened while the
	// server already runs its bound of sessions and is busy answering other
	// streams beyond it. Clients should retry later or use fewer sessions.
	QUICTooManyStreams QUICErrorCode = 6
	// QUICNoStreamTimeout closes a connection that opened no stream within
	// the server's startup timeout after its handshake, so connections
	// kept alive without ever starting a session cannot hold the server's
	// connection slots. Clients should open a stream soon after dialing.
	QUICNoStreamTimeout QUICErrorCode = 7
)

// String names the code for logs.
func (c QUICErrorCode) String() string {
	switch c {
	case QUICNoError:
		return "no_error"
	case QUICInternal:
		return "internal"
	case QUICServerShutdown:
		return "server_shutdown"
	case QUICTooManyConns:
		return "too_many_conns"
	case QUICStartupTimeout:
		return "startup_timeout"
	case QUICAborted:
		return "aborted"
	case QUICTooManyStreams:
		return "too_many_streams"
	case QUICNoStreamTimeout:
		return "no_stream_timeout"
	default:
		return fmt.Sprintf("error_code_%d", uint64(c))
	}
}
