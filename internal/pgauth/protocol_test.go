package pgauth

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/xdg-go/scram"
)

// saslInitial builds a SASLInitialResponse body.
func saslInitial(mech string, data []byte) []byte {
	b := append([]byte(mech), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// lastSASLData returns the data of the last SASLContinue sent.
func lastSASLData(sent []pgproto3.BackendMessage) ([]byte, bool) {
	for i := len(sent) - 1; i >= 0; i-- {
		if m, ok := sent[i].(*pgproto3.AuthenticationSASLContinue); ok {
			return m.Data, true
		}
	}
	return nil, false
}

// scramClientScript answers a SCRAM exchange with xdg-go's client, passing
// each message through tamper (if set) before the server sees it.
func scramClientScript(t *testing.T, password string, tamper func(step int, msg string) string) *scriptedExchange {
	t.Helper()
	c, err := scram.SHA256.NewClient("", password, "")
	if err != nil {
		t.Fatal(err)
	}
	conv := c.NewConversation()
	first, err := conv.Step("")
	if err != nil {
		t.Fatal(err)
	}
	if tamper != nil {
		first = tamper(0, first)
	}
	ex := &scriptedExchange{bodies: [][]byte{saslInitial(scramMechanism, []byte(first))}}
	ex.reply = func(sent []pgproto3.BackendMessage) ([]byte, error) {
		serverFirst, ok := lastSASLData(sent)
		if !ok {
			return nil, errors.New("no server-first-message")
		}
		final, err := conv.Step(string(serverFirst))
		if err != nil {
			return nil, err
		}
		if tamper != nil {
			final = tamper(1, final)
		}
		ex.reply = nil
		return []byte(final), nil
	}
	return ex
}

func newSCRAMAuth(t *testing.T) *Authenticator {
	t.Helper()
	a, err := New(Config{Method: MethodSCRAM, Users: testUsers(t)})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestSCRAMScriptedClient(t *testing.T) {
	a := newSCRAMAuth(t)
	ctx := context.Background()
	if err := a.Authenticate(ctx, scramClientScript(t, "secret-scram", nil), "scram", nil); err != nil {
		t.Fatalf("xdg-go client: %v", err)
	}
	// The SCRAM user name is ignored: the startup user decides.
	c, _ := scram.SHA256.NewClient("somebody-else", "secret-scram", "")
	conv := c.NewConversation()
	first, _ := conv.Step("")
	ex := &scriptedExchange{bodies: [][]byte{saslInitial(scramMechanism, []byte(first))}}
	ex.reply = func(sent []pgproto3.BackendMessage) ([]byte, error) {
		sf, _ := lastSASLData(sent)
		final, err := conv.Step(string(sf))
		ex.reply = nil
		return []byte(final), err
	}
	if err := a.Authenticate(ctx, ex, "scram", nil); err != nil {
		t.Errorf("SCRAM user name should be ignored: %v", err)
	}
}

func TestSCRAMNoInitialResponse(t *testing.T) {
	a := newSCRAMAuth(t)
	c, err := scram.SHA256.NewClient("", "secret-plain", "")
	if err != nil {
		t.Fatal(err)
	}
	conv := c.NewConversation()
	body := append([]byte(scramMechanism), 0, 0xff, 0xff, 0xff, 0xff) // length -1
	ex := &scriptedExchange{bodies: [][]byte{body}}
	ex.reply = func(sent []pgproto3.BackendMessage) ([]byte, error) {
		data, _ := lastSASLData(sent)
		out, err := conv.Step(string(data)) // "" first, then server-first
		return []byte(out), err
	}
	if err := a.Authenticate(context.Background(), ex, "plain", nil); err != nil {
		t.Fatalf("exchange without initial response: %v", err)
	}
	if m, ok := ex.sent[1].(*pgproto3.AuthenticationSASLContinue); !ok || len(m.Data) != 0 {
		t.Errorf("second message = %#v, want an empty SASLContinue", ex.sent[1])
	}
}

func TestSCRAMProtocolViolations(t *testing.T) {
	a := newSCRAMAuth(t)
	tests := []struct {
		name    string
		ex      *scriptedExchange
		wantMsg string
	}{
		{"plus mechanism", &scriptedExchange{bodies: [][]byte{saslInitial("SCRAM-SHA-256-PLUS", []byte("p=tls-server-end-point,,n=,r=abc"))}}, "invalid SASL authentication mechanism"},
		{"other mechanism", &scriptedExchange{bodies: [][]byte{saslInitial("PLAIN", []byte("\x00u\x00pw"))}}, "invalid SASL authentication mechanism"},
		{"channel binding flag", &scriptedExchange{bodies: [][]byte{saslInitial(scramMechanism, []byte("p=tls-server-end-point,,n=,r=abc"))}}, "channel binding is not supported"},
		{"no terminator", &scriptedExchange{bodies: [][]byte{[]byte("SCRAM-SHA-256")}}, "malformed SASLInitialResponse"},
		{"short length", &scriptedExchange{bodies: [][]byte{[]byte("SCRAM-SHA-256\x00\x00\x00")}}, "malformed SASLInitialResponse"},
		{"length mismatch", &scriptedExchange{bodies: [][]byte{append(saslInitial(scramMechanism, []byte("n,,n=,r=abc")), 'x')}}, "malformed SASLInitialResponse"},
		{"negative length", &scriptedExchange{bodies: [][]byte{[]byte("SCRAM-SHA-256\x00\xff\xff\xff\xfe")}}, "malformed SASLInitialResponse"},
		{"garbage first", &scriptedExchange{bodies: [][]byte{saslInitial(scramMechanism, []byte("hello"))}}, "malformed SCRAM client-first-message"},
		{"extension", &scriptedExchange{bodies: [][]byte{saslInitial(scramMechanism, []byte("n,,m=ext,n=,r=abc"))}}, "malformed SCRAM client-first-message"},
		{"bad nonce", scramClientScript(t, "secret-scram", func(step int, m string) string {
			if step == 1 {
				return strings.Replace(m, ",r=", ",r=X", 1)
			}
			return m
		}), "malformed SCRAM client-final-message"},
		{"bad channel binding echo", scramClientScript(t, "secret-scram", func(step int, m string) string {
			if step == 1 {
				return strings.Replace(m, "c=biws", "c=eSws", 1)
			}
			return m
		}), "malformed SCRAM client-final-message"},
		{"short proof", scramClientScript(t, "secret-scram", func(step int, m string) string {
			if step == 1 {
				return m[:strings.LastIndex(m, ",p=")] + ",p=AAAA"
			}
			return m
		}), "malformed SCRAM client-final-message"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := a.Authenticate(context.Background(), tt.ex, "scram", nil)
			if !errors.Is(err, ErrProtocol) || errors.Is(err, ErrAuthFailed) {
				t.Fatalf("err = %v, want ErrProtocol only", err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("err = %q, want it to mention %q", err, tt.wantMsg)
			}
			var ae *Error
			if !errors.As(err, &ae) || ae.SQLState() != "08P01" {
				t.Errorf("SQLState of %v is not 08P01", err)
			}
			for _, m := range tt.ex.sent {
				if _, ok := m.(*pgproto3.AuthenticationSASLFinal); ok {
					t.Error("AuthenticationSASLFinal sent on a protocol violation")
				}
			}
		})
	}
}

func TestPasswordMessageFraming(t *testing.T) {
	users := testUsers(t)
	for _, m := range []Method{MethodMD5, MethodPassword} {
		a, err := New(Config{Method: m, Users: users})
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct {
			body []byte
			want error
		}{
			{[]byte("no-terminator"), ErrProtocol},
			{[]byte("two\x00parts\x00"), ErrProtocol},
			{[]byte{}, ErrProtocol},
			{[]byte{0}, ErrAuthFailed}, // empty password
			{[]byte("secret-plain\x00"), nil},
		} {
			if m == MethodMD5 && tt.want == nil {
				continue // covered with a real client elsewhere
			}
			err := a.Authenticate(context.Background(), &scriptedExchange{bodies: [][]byte{tt.body}}, "plain", nil)
			if !errors.Is(err, tt.want) && !(tt.want == nil && err == nil) {
				t.Errorf("%s body %q: err %v, want %v", m, tt.body, err, tt.want)
			}
		}
	}
}

// failingExchange fails every send, as a closed connection would.
type failingExchange struct{ err error }

func (f failingExchange) Send(...pgproto3.BackendMessage) error { return f.err }
func (f failingExchange) ReceivePassword(context.Context) ([]byte, error) {
	return nil, errors.New("unreachable")
}

func TestTransportErrors(t *testing.T) {
	users := testUsers(t)
	broken := errors.New("connection reset")
	for _, m := range []Method{MethodSCRAM, MethodMD5, MethodPassword} {
		a, err := New(Config{Method: m, Users: users})
		if err != nil {
			t.Fatal(err)
		}
		err = a.Authenticate(context.Background(), failingExchange{broken}, "plain", nil)
		if !errors.Is(err, broken) || errors.Is(err, ErrAuthFailed) || errors.Is(err, ErrProtocol) {
			t.Errorf("%s: err %v, want the transport error only", m, err)
		}
	}
}

func TestContextCancel(t *testing.T) {
	a := newSCRAMAuth(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.Authenticate(ctx, &scriptedExchange{}, "plain", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("pre-cancelled: %v", err)
	}

	// A client that stops answering: cancelling ctx must unblock the
	// exchange on a real connection.
	client, server := net.Pipe()
	defer client.Close()
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		be := pgproto3.NewBackend(server, server)
		defer server.Close()
		done <- a.Authenticate(ctx, &backendExchange{be: be, conn: server}, "plain", nil)
	}()
	fe := pgproto3.NewFrontend(client, client)
	msg, err := fe.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := msg.(*pgproto3.AuthenticationSASL); !ok {
		t.Fatalf("got %T", msg)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled mid-exchange: %v", err)
	}
}

func TestErrorReporting(t *testing.T) {
	a := newSCRAMAuth(t)
	err := a.Authenticate(context.Background(), scramClientScript(t, "whatever", nil), "nobody", nil)
	var ae *Error
	if !errors.As(err, &ae) {
		t.Fatalf("err %T %v is not *Error", err, err)
	}
	if ae.SQLState() != "28P01" || ae.User != "nobody" {
		t.Errorf("SQLState %s user %q", ae.SQLState(), ae.User)
	}
	if strings.Contains(err.Error(), "userlist") {
		t.Errorf("client-facing text reveals the reason: %q", err)
	}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("auth", "err", err)
	if !strings.Contains(buf.String(), "not in the userlist") {
		t.Errorf("log line lacks the detail: %s", buf.String())
	}
}
