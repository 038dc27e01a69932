package tcpfront

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/wire"
)

// tooManyResponse is the FATAL error a refused client receives, with the
// SQLSTATE PostgreSQL uses for "sorry, too many clients already".
var tooManyResponse = func() []byte {
	b, err := (&pgproto3.ErrorResponse{
		Severity:            "FATAL",
		SeverityUnlocalized: "FATAL",
		Code:                pgproto.CodeTooManyConnections,
		Message:             "too many connections",
		Detail:              "The pgquic TCP front is at its connection limit.",
	}).Encode(nil)
	if err != nil {
		panic(err) // static message; cannot fail
	}
	return b
}()

// errPlainAfterSSLRequest refuses bytes sent in the clear after an
// SSLRequest, which would otherwise be read as if they had been encrypted
// (CVE-2021-23214).
var errPlainAfterSSLRequest = errors.New("unencrypted data after SSL request")

// limitStartup reads the startup packets of a connection beyond the limit
// until it sees one that is neither an SSLRequest nor a GSSENCRequest. An
// SSLRequest is answered 'S' and the TLS handshake run when tlsCfg is set
// (as PostgreSQL does before it reports too many clients), 'N' otherwise; a
// GSSENCRequest gets 'N'. It returns the stream the session now runs on (the
// TLS connection after a handshake) and, when the packet was a
// CancelRequest, that whole packet, so it can be served. At most three
// packets are read, so a confused client cannot keep the refusal going.
func limitStartup(ctx context.Context, conn net.Conn, tlsCfg *tls.Config) (stream net.Conn, cancelReq []byte, err error) {
	stream = conn
	r := wire.NewReader(conn, 512, 0)
	for range 3 {
		body, err := r.ReadStartup()
		if err != nil {
			return stream, nil, fmt.Errorf("read startup packet: %w", err)
		}
		code := uint32(0)
		if len(body) >= 4 {
			code = binary.BigEndian.Uint32(body)
		}
		switch code {
		case pgproto.SSLRequestCode:
			if tlsCfg == nil || stream != conn {
				if _, err := stream.Write([]byte{'N'}); err != nil {
					return stream, nil, fmt.Errorf("answer SSL request: %w", err)
				}
				continue
			}
			if r.Buffered() > 0 {
				return stream, nil, errPlainAfterSSLRequest
			}
			if _, err := conn.Write([]byte{'S'}); err != nil {
				return stream, nil, fmt.Errorf("answer SSL request: %w", err)
			}
			tc := tls.Server(conn, tlsCfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				return stream, nil, fmt.Errorf("TLS handshake: %w", err)
			}
			stream = tc
			r.Reset(tc)
		case pgproto.GSSEncRequestCode:
			if _, err := stream.Write([]byte{'N'}); err != nil {
				return stream, nil, fmt.Errorf("answer GSSENC request: %w", err)
			}
		case pgproto.CancelRequestCode:
			pkt := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(4+len(body)))
			return stream, append(pkt, body...), nil
		default:
			return stream, nil, nil
		}
	}
	return stream, nil, fmt.Errorf("no startup message after %d encryption requests", 3)
}

// replayConn hands a handler a connection whose first packet the front has
// already read: Read yields that packet, then whatever the client sends next.
type replayConn struct {
	net.Conn
	r io.Reader
}

func newReplayConn(c net.Conn, first []byte) *replayConn {
	return &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(first), c)}
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }
