package pooler_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/pgquic/pgquic/internal/pgauth"
)

// scramAuthenticator returns a SCRAM-SHA-256 authenticator whose userlist
// holds the harness superuser with the password of harness.url, so an
// authenticated client gets through a harness configured with it.
func scramAuthenticator(t testing.TB) *pgauth.Authenticator {
	t.Helper()
	v, err := pgauth.SCRAMVerifier("postgres", 0)
	if err != nil {
		t.Fatal(err)
	}
	users, err := pgauth.ParseUserlist(strings.NewReader(`"postgres" "` + v + `"` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := pgauth.New(pgauth.Config{Method: pgauth.MethodSCRAM, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// startupMessage is a protocol 3.0 StartupMessage for user and database
// postgres.
func startupMessage() []byte {
	const params = "user\x00postgres\x00database\x00postgres\x00\x00"
	b := binary.BigEndian.AppendUint32(nil, uint32(8+len(params)))
	b = binary.BigEndian.AppendUint32(b, 196608)
	return append(b, params...)
}

// serverMsg is one backend message as read off the wire.
type serverMsg struct {
	typ  byte
	body []byte
}

// readServerMsg reads one backend message.
func readServerMsg(r io.Reader) (serverMsg, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return serverMsg{}, err
	}
	n := int(binary.BigEndian.Uint32(hdr[1:]))
	if n < 4 || n > 1<<20 {
		return serverMsg{}, fmt.Errorf("message %q with length %d", hdr[0], n)
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return serverMsg{}, err
	}
	return serverMsg{typ: hdr[0], body: body}, nil
}

// isSASLRequest reports whether m is AuthenticationSASL.
func (m serverMsg) isSASLRequest() bool {
	return m.typ == 'R' && len(m.body) >= 4 && binary.BigEndian.Uint32(m.body) == 10
}

// errorField returns field f ('C' SQLSTATE, 'M' message, 'S' severity) of an
// ErrorResponse, or "" when m is not one or lacks it.
func (m serverMsg) errorField(f byte) string {
	if m.typ != 'E' {
		return ""
	}
	b := m.body
	for len(b) > 0 && b[0] != 0 {
		code := b[0]
		end := bytes.IndexByte(b[1:], 0)
		if end < 0 {
			return ""
		}
		if code == f {
			return string(b[1 : 1+end])
		}
		b = b[2+end:]
	}
	return ""
}

func (m serverMsg) String() string {
	if m.typ == 'E' {
		return fmt.Sprintf("ErrorResponse %s %s: %s", m.errorField('S'), m.errorField('C'), m.errorField('M'))
	}
	return fmt.Sprintf("message %q (%d bytes)", m.typ, len(m.body))
}
