package pooler_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
)

// Frame-level comparisons with PostgreSQL: a raw client speaks the protocol
// to the server directly and to the pooler, and the messages each sends back
// are summarised and compared, so a client sees through the pooler the same
// frames (types, severities, SQLSTATEs) PostgreSQL itself sends.

// rawConn is a protocol-level client connection.
type rawConn struct {
	t  testing.TB
	nc net.Conn
	fe *pgproto3.Frontend
}

// dialRaw opens a TCP connection to addr without sending anything.
func dialRaw(ctx context.Context, t testing.TB, addr string) *rawConn {
	t.Helper()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	return &rawConn{t: t, nc: nc, fe: pgproto3.NewFrontend(nc, nc)}
}

// startRaw connects to addr as the superuser (trust or the password
// "postgres") with the given extra startup parameters and reads the greeting
// up to ReadyForQuery, which it returns summarised.
func startRaw(ctx context.Context, t testing.TB, addr string, params map[string]string) (*rawConn, []string) {
	t.Helper()
	c := dialRaw(ctx, t, addr)
	p := map[string]string{"user": "postgres", "database": "postgres"}
	for k, v := range params {
		p[k] = v
	}
	c.send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: p})
	var greeting []string
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			t.Fatalf("startup with %s: %v (so far %v)", addr, err, greeting)
		}
		switch m := msg.(type) {
		case *pgproto3.AuthenticationCleartextPassword, *pgproto3.AuthenticationMD5Password:
			t.Fatalf("startup with %s: password requested", addr)
		case *pgproto3.ErrorResponse:
			t.Fatalf("startup with %s: %s %s %s", addr, m.Severity, m.Code, m.Message)
		}
		greeting = append(greeting, summarise(msg))
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			return c, greeting
		}
	}
}

func (c *rawConn) send(msgs ...pgproto3.FrontendMessage) {
	c.t.Helper()
	for _, m := range msgs {
		c.fe.Send(m)
	}
	if err := c.fe.Flush(); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// writeBytes writes b as is.
func (c *rawConn) writeBytes(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// untilZ reads messages up to and including ReadyForQuery.
func (c *rawConn) untilZ() []string {
	c.t.Helper()
	var out []string
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			c.t.Fatalf("receive: %v (so far %v)", err, out)
		}
		out = append(out, summarise(msg))
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			return out
		}
	}
}

// untilEOF reads messages until the peer closes the connection, which ends
// the list as "EOF". A read that fails otherwise ends it with the error.
func (c *rawConn) untilEOF() []string {
	c.t.Helper()
	var out []string
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
				return append(out, "EOF")
			}
			return append(out, "read error: "+err.Error())
		}
		out = append(out, summarise(msg))
	}
}

// rawBytesUntilEOF reads raw bytes (no framing) until the peer closes.
func (c *rawConn) rawBytesUntilEOF() ([]byte, error) {
	b, err := io.ReadAll(c.nc)
	if isReset(err) {
		err = nil
	}
	return b, err
}

func isReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "connection reset by peer") || errors.Is(err, net.ErrClosed))
}

// summarise names a backend message by what a client acts on: its type, and
// for errors and notices the severity and SQLSTATE, for ParameterStatus the
// name and value.
func summarise(msg pgproto3.BackendMessage) string {
	switch m := msg.(type) {
	case *pgproto3.ErrorResponse:
		return fmt.Sprintf("E[%s %s]", m.Severity, m.Code)
	case *pgproto3.NoticeResponse:
		return fmt.Sprintf("N[%s %s]", m.Severity, m.Code)
	case *pgproto3.ParameterStatus:
		return fmt.Sprintf("S[%s=%s]", m.Name, m.Value)
	case *pgproto3.ReadyForQuery:
		return "Z[" + string(m.TxStatus) + "]"
	case *pgproto3.CommandComplete:
		return "C[" + string(m.CommandTag) + "]"
	case *pgproto3.DataRow:
		vals := make([]string, len(m.Values))
		for i, v := range m.Values {
			vals[i] = string(v)
		}
		return "D[" + strings.Join(vals, ",") + "]"
	case *pgproto3.BackendKeyData:
		return "K"
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", msg), "*pgproto3.")
}

// clusterAddr is the PostgreSQL server's own TCP address.
func clusterAddr(c *pgtest.Cluster) string {
	return net.JoinHostPort(c.Host, strconv.Itoa(c.Port))
}

// sameFrames fails the test unless the pooler's frames equal PostgreSQL's.
func sameFrames(t testing.TB, what string, direct, pooled []string) {
	t.Helper()
	if !slices.Equal(direct, pooled) {
		t.Errorf("%s:\n  PostgreSQL: %v\n  pgquic:     %v", what, direct, pooled)
	}
}

// withTimeout returns a context for one probe.
func withTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestFramesAfterTerminate compares what a client running a query sees when
// its server process is ended with pg_terminate_backend: PostgreSQL sends
// FATAL 57P01 and closes, and so must the pooler, in both modes, without an
// error of its own after the server's.
func TestFramesAfterTerminate(t *testing.T) {
	c := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	d := direct(ctx, t, c)
	probe := func(addr, tag string) []string {
		rc, _ := startRaw(ctx, t, addr, nil)
		sql := "select pg_sleep(30) -- " + tag
		rc.send(&pgproto3.Query{String: sql})
		pid := waitQuery(ctx, t, d, sql)
		if _, err := d.Exec(ctx, "select pg_terminate_backend($1)", pid); err != nil {
			t.Fatal(err)
		}
		// Whether PostgreSQL had sent the RowDescription before the
		// termination landed depends on timing alone (pg_stat_activity
		// shows the query before its executor starts): compare the rest.
		return slices.DeleteFunc(rc.untilEOF(), func(f string) bool { return f == "RowDescription" })
	}
	want := probe(clusterAddr(c), "direct")
	if !slices.Contains(want, "E[FATAL 57P01]") {
		t.Fatalf("PostgreSQL sent %v", want)
	}
	for _, mode := range []pooler.Mode{pooler.ModeTransaction, pooler.ModeSession} {
		h := newHarness(t, harnessOpts{cluster: c, cfg: pooler.Config{Mode: mode}})
		sameFrames(t, string(mode)+" mode", want, probe(h.ln.Addr().String(), string(mode)))
		h.waitNoneInUse(t)
	}
}

// decodeFrames summarises a byte stream of backend messages; bytes that do
// not form a whole message end the list as "partial" followed by them.
func decodeFrames(b []byte) []string {
	var out []string
	for len(b) > 0 {
		if b[0] == 'E' && strings.HasPrefix(string(b[1:]), "FATAL:") {
			// An error in the format of protocol 2, up to its NUL.
			end := strings.IndexByte(string(b), 0)
			if end < 0 {
				return append(out, fmt.Sprintf("partial %q", b))
			}
			out = append(out, "E(v2)[FATAL]")
			b = b[end+1:]
			continue
		}
		if len(b) < 5 {
			return append(out, fmt.Sprintf("partial %q", b))
		}
		n := int(binary.BigEndian.Uint32(b[1:5]))
		if n < 4 || len(b) < 1+n {
			return append(out, fmt.Sprintf("partial %q", b))
		}
		typ, body := b[0], b[5:1+n]
		b = b[1+n:]
		var msg pgproto3.BackendMessage
		switch typ {
		case 'E':
			msg = &pgproto3.ErrorResponse{}
		case 'v':
			msg = &pgproto3.NegotiateProtocolVersion{}
		default:
			out = append(out, string(typ))
			continue
		}
		if err := msg.Decode(body); err != nil {
			out = append(out, fmt.Sprintf("bad %c", typ))
			continue
		}
		out = append(out, summarise(msg))
	}
	return out
}

// startupPacket builds a startup-phase packet: length, version code, body.
func startupPacket(code uint32, body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(8+len(body)))
	b = binary.BigEndian.AppendUint32(b, code)
	return append(b, body...)
}

// TestFramesBadStartup sends malformed or absent startup packets to
// PostgreSQL and to the pooler and compares what comes back before the
// connection closes: PostgreSQL answers some with FATAL and only logs the
// others, and the pooler must do the same.
func TestFramesBadStartup(t *testing.T) {
	c := sharedCluster(t)
	h := newHarness(t, harnessOpts{cluster: c})
	cases := []struct {
		name  string
		bytes []byte
	}{
		{"eof", nil},
		{"terminate", []byte{'X', 0, 0, 0, 4}},
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		{"zeros", make([]byte, 16)},
		{"length 3", []byte{0, 0, 0, 3, 0, 3, 0, 0}},
		{"length 7", []byte{0, 0, 0, 7, 0, 3, 0}},
		{"length 10001", append([]byte{0, 0, 0x27, 0x11}, make([]byte, 64)...)},
		{"incomplete", []byte{0, 0, 0, 100, 0, 3, 0, 0, 'u'}},
		{"protocol 2.0", startupPacket(2<<16, "user\x00postgres\x00\x00")},
		{"protocol 4.0", startupPacket(4<<16, "user\x00postgres\x00\x00")},
		{"protocol 1234.5678", startupPacket(1234<<16|5678, "user\x00postgres\x00\x00")},
		{"no terminator", startupPacket(3<<16, "user\x00postgres\x00")},
		{"no user", startupPacket(3<<16, "database\x00postgres\x00\x00")},
		{"ssl then eof", startupPacket(80877103, "")},
		{"ssl then terminate", append(startupPacket(80877103, ""), 'X', 0, 0, 0, 4)},
		{"cancel bad length", startupPacket(80877102, "\x00\x00")},
	}
	probe := func(addr string, b []byte) []string {
		ctx := withTimeout(t, 10*time.Second)
		rc := dialRaw(ctx, t, addr)
		if len(b) > 0 {
			rc.writeBytes(b)
		}
		_ = rc.nc.(*net.TCPConn).CloseWrite()
		got, err := rc.rawBytesUntilEOF()
		var out []string
		// The one-byte answer to SSLRequest and GSSENCRequest is not a message.
		if len(got) > 0 && (got[0] == 'N' || got[0] == 'S') && len(b) >= 8 && binary.BigEndian.Uint32(b[4:]) >= 80877103 {
			out = append(out, "answer "+string(got[0]))
			got = got[1:]
		}
		out = append(out, decodeFrames(got)...)
		if err != nil {
			out = append(out, "read error: "+err.Error())
		}
		return append(out, "EOF")
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := probe(clusterAddr(c), tc.bytes)
			t.Logf("PostgreSQL: %v", want)
			sameFrames(t, tc.name, want, probe(h.ln.Addr().String(), tc.bytes))
		})
	}
	h.waitNoneInUse(t)
}

// greetingOf connects to addr with the given startup parameters and returns
// the frames up to ReadyForQuery, or up to the close after an error.
func greetingOf(ctx context.Context, t testing.TB, addr string, params map[string]string) []string {
	t.Helper()
	c := dialRaw(ctx, t, addr)
	p := map[string]string{"user": "postgres", "database": "postgres"}
	for k, v := range params {
		p[k] = v
	}
	c.send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: p})
	var out []string
	for {
		msg, err := c.fe.Receive()
		if err != nil {
			return append(out, "EOF")
		}
		out = append(out, summarise(msg))
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			c.send(&pgproto3.Terminate{})
			return out
		}
	}
}

// TestFramesGreeting compares the greeting (ParameterStatus set, order and
// values) a client gets from PostgreSQL and from the pooler, in both modes,
// for startup parameters spelt otherwise than the server reports them:
// the client must see the server's spelling (UTF8 for utf-8), as it would
// directly. Each pooler probe runs twice, since the second is answered from
// what the first taught the pooler.
func TestFramesGreeting(t *testing.T) {
	c := sharedCluster(t)
	ctx := testCtx(t, time.Minute)
	cases := []map[string]string{
		nil,
		{"client_encoding": "utf-8"},
		{"client_encoding": "euc-jp", "datestyle": "iso", "TimeZone": "utc"},
		{"client_encoding": "latin1", "DateStyle": "german", "timezone": "europe/paris", "application_name": "fidelity"},
		{"IntervalStyle": "ISO_8601", "application_name": "caf\u00e9"},
		{"client_encoding": "UTF8", "search_path": "public"},
		{"application_name": `it's a \ tést`, "search_path": `"$user", public`},
		{"TimeZone": "nowhere/none"},
		{"client_encoding": "klingon"},
	}
	hs := map[pooler.Mode]*harness{}
	for _, mode := range []pooler.Mode{pooler.ModeTransaction, pooler.ModeSession} {
		hs[mode] = newHarness(t, harnessOpts{cluster: c, cfg: pooler.Config{Mode: mode}})
	}
	for i, params := range cases {
		want := greetingOf(ctx, t, clusterAddr(c), params)
		t.Logf("case %d %v: PostgreSQL %v", i, params, want)
		for mode, h := range hs {
			for round := range 2 {
				got := greetingOf(ctx, t, h.ln.Addr().String(), params)
				sameFrames(t, fmt.Sprintf("%s mode, %v, round %d", mode, params, round+1), want, got)
			}
		}
	}
	for _, h := range hs {
		h.waitNoneInUse(t)
	}
}
