package tcpfront

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/wire"
)

// Startup-phase request codes from the PostgreSQL protocol ("Message
// Formats": SSLRequest, GSSENCRequest, CancelRequest).
const (
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
	cancelRequestCode = 80877102
)

// tooManyResponse is the FATAL error a refused client receives, with the
// SQLSTATE PostgreSQL uses for "sorry, too many clients already".
var tooManyResponse = func() []byte {
	b, err := (&pgproto3.ErrorResponse{
		Severity:            "FATAL",
		SeverityUnlocalized: "FATAL",
		Code:                "53300",
		Message:             "too many connections",
		Detail:              "The pgquic TCP front is at its connection limit.",
	}).Encode(nil)
	if err != nil {
		panic(err) // static message; cannot fail
	}
	return b
}()

// answerTooMany reads startup packets from rw until it sees one that is
// neither an SSLRequest nor a GSSENCRequest (those get 'N'), then writes the
// 53300 ErrorResponse, unless the packet was a CancelRequest, which gets no
// answer. At most three packets are read, so a confused client cannot keep
// the refusal going.
func answerTooMany(rw io.ReadWriter) error {
	r := wire.NewReader(rw, 512, 0)
	for range 3 {
		body, err := r.ReadStartup()
		if err != nil {
			return fmt.Errorf("read startup packet: %w", err)
		}
		code := uint32(0)
		if len(body) >= 4 {
			code = binary.BigEndian.Uint32(body)
		}
		switch code {
		case sslRequestCode, gssEncRequestCode:
			if _, err := rw.Write([]byte{'N'}); err != nil {
				return fmt.Errorf("answer encryption request: %w", err)
			}
		case cancelRequestCode:
			return nil
		default:
			if _, err := rw.Write(tooManyResponse); err != nil {
				return fmt.Errorf("write too-many-connections error: %w", err)
			}
			return nil
		}
	}
	return fmt.Errorf("no startup message after %d encryption requests", 3)
}
