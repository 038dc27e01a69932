// Package front is the contract between a front end that accepts clients
// (the TCP and QUIC fronts, a test's net.Pipe) and the session handler that
// runs them (the pooler). A front moves bytes and describes the peer; the
// handler never learns which transport carries the bytes. Both sides import
// this package, so neither imports the other.
package front

import (
	"context"
	"crypto/x509"
	"io"
	"net"
)

// Handler runs one PostgreSQL session to completion and closes rwc.
// *pooler.Pooler implements it. A front calls Serve once per session, from
// that session's own goroutine, so it must be safe for concurrent use; Serve
// returns when the session ends. The fronts close the connection again
// afterwards, so a handler that forgets to is still safe.
type Handler interface {
	Serve(ctx context.Context, rwc io.ReadWriteCloser, peer Peer) error
}

// Peer describes the client end of a session as the front end that accepted
// it knows it. The handler never learns which transport carries the bytes; it
// only needs the facts below to decide about TLS, authentication and logging.
type Peer struct {
	// Addr is the client's address, used for logs and to recognise loopback
	// clients for trust authentication. It may be nil.
	Addr net.Addr

	// Transport names the front end ("tcp", "quic") in logs and metrics.
	Transport string

	// Conn identifies the transport connection carrying the session when
	// one connection carries several sessions: the QUIC front names each
	// connection ("quic-1", "quic-2"...), so the admin console's SHOW
	// CLIENTS can tell which streams share one. Empty for TCP, where each
	// session is its own connection.
	Conn string

	// Secure reports that the transport is already encrypted (a QUIC stream,
	// or a TCP connection after TLS). An SSLRequest on a secure transport is
	// answered 'N' and the session continues in the clear inside it.
	Secure bool

	// ClientCerts is the certificate chain the client presented in its TLS
	// handshake, leaf first, as sent and not verified against any CA; nil
	// when it presented none. The TLS handshake proved the client holds
	// the leaf's key, so the leaf identifies the client as a password
	// would; the handler decides whether it trusts it (the pooler's edge
	// trust, by the leaf's Fingerprint or by verifying the chain against
	// a CA it names). The QUIC front fills it in, the same slice for every
	// session of a connection, so the handler must not modify it; a
	// session resumed from a TLS ticket carries the chain of the handshake
	// that issued the ticket.
	ClientCerts []*x509.Certificate

	// StartTLS, when non-nil, is called after the handler answered 'S' to an
	// SSLRequest. It performs the TLS handshake on the underlying connection
	// and returns the encrypted stream that replaces the session's one. When
	// nil, SSLRequest is answered 'N'.
	StartTLS func(ctx context.Context) (io.ReadWriteCloser, error)

	// RequireTLS makes the handler refuse a StartupMessage that arrives
	// without TLS on a transport that is not Secure (SQLSTATE 28000).
	RequireTLS bool

	// Probe, when non-nil, tells whether the client is still connected
	// without reading from the connection or waiting: nil means it may still
	// be there, an error that it is gone for good (the peer closed or reset
	// its end). While the session's goroutine waits on the server (reading a
	// query's replies, or waiting for a server connection) it does not read
	// the client and cannot see it leave; the pooler's watcher calls Probe,
	// from its own goroutine and concurrently with the session, for
	// sessions that have been waiting that way for at least a quarter of a
	// second, and cancels the request of a client that is gone so its server
	// connection is freed at once instead of when the query ends. The TCP
	// front peeks at the socket; the QUIC front looks at the stream's
	// context, which quic-go ends when the connection dies or the client
	// aborts the stream.
	Probe func() error

	// HandshakeConfirmed, when non-nil, is closed once the transport's
	// handshake is confirmed: until then the bytes of the session may be
	// 0-RTT data, which an attacker who captured them can send again, to
	// this server or to another replica sharing its ticket keys. If the
	// connection dies first it is never closed (Probe then reports the
	// client gone). nil means the data is not replayable (TCP, a QUIC
	// connection whose handshake completed before the session started).
	// The QUIC front fills it in only when it accepts 0-RTT; the handler
	// runs a request received before it is closed only if replaying that
	// request is harmless.
	HandshakeConfirmed <-chan struct{}
}

// ReadWaiter is implemented by client streams that can wait for input
// without consuming it (the QUIC front's streams, which can be peeked at,
// and the TCP front's plain ones, through recv with MSG_PEEK). WaitRead blocks until the stream has bytes to read, or a read
// would fail (end of stream, reset, closed). The handler calls it before it
// reads the next message of a session that has nothing in flight and gives
// its read buffer back to a shared pool meanwhile, so thousands of idle
// sessions hold no read buffers; the sessions of a stream without it keep
// their buffers.
type ReadWaiter interface {
	WaitRead() error
}
