package pgauth

import (
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Request message names recorded by backendExchange.
const (
	sentSASL  = "*pgproto3.AuthenticationSASL"
	sentMD5   = "*pgproto3.AuthenticationMD5Password"
	sentClear = "*pgproto3.AuthenticationCleartextPassword"
	sentFinal = "*pgproto3.AuthenticationSASLFinal"
	sentCont  = "*pgproto3.AuthenticationSASLContinue"
)

// testUsers is a userlist with one user per kind of secret; every password
// is "secret-<user>".
func testUsers(t *testing.T) *Userlist {
	t.Helper()
	verifier, err := SCRAMVerifier("secret-scram", 0)
	if err != nil {
		t.Fatal(err)
	}
	weird := `we"ird, =user`
	src := map[string]string{
		"plain": "secret-plain",
		"md5":   md5Hash("secret-md5", "md5"),
		"scram": verifier,
		"nopw":  "",
		weird:   "secret-" + weird,
	}
	secrets := make(map[string]Secret)
	for u, s := range src {
		sec, err := ParseSecret(u, s)
		if err != nil {
			t.Fatalf("ParseSecret(%q): %v", u, err)
		}
		secrets[u] = sec
	}
	return NewUserlist(secrets)
}

func TestAuthenticateWithPgconn(t *testing.T) {
	users := testUsers(t)
	weird := `we"ird, =user`
	tests := []struct {
		method   Method
		user     string
		password string
		ok       bool
		request  string // first authentication request the server sent
	}{
		{MethodSCRAM, "plain", "secret-plain", true, sentSASL},
		{MethodSCRAM, "plain", "wrong", false, sentSASL},
		{MethodSCRAM, "scram", "secret-scram", true, sentSASL},
		{MethodSCRAM, "scram", "wrong", false, sentSASL},
		{MethodSCRAM, "md5", "secret-md5", false, sentSASL},
		{MethodSCRAM, "nopw", "", false, sentSASL},
		{MethodSCRAM, "nobody", "secret-nobody", false, sentSASL},
		{MethodSCRAM, weird, "secret-" + weird, true, sentSASL},

		{MethodMD5, "plain", "secret-plain", true, sentMD5},
		{MethodMD5, "plain", "wrong", false, sentMD5},
		{MethodMD5, "md5", "secret-md5", true, sentMD5},
		{MethodMD5, "md5", "wrong", false, sentMD5},
		{MethodMD5, "scram", "secret-scram", true, sentSASL}, // falls back to SCRAM
		{MethodMD5, "scram", "wrong", false, sentSASL},
		{MethodMD5, "nopw", "x", false, sentMD5},
		{MethodMD5, "nobody", "secret-nobody", false, sentMD5},
		{MethodMD5, weird, "secret-" + weird, true, sentMD5},

		{MethodPassword, "plain", "secret-plain", true, sentClear},
		{MethodPassword, "plain", "wrong", false, sentClear},
		{MethodPassword, "md5", "secret-md5", true, sentClear},
		{MethodPassword, "md5", "wrong", false, sentClear},
		{MethodPassword, "scram", "secret-scram", true, sentClear},
		{MethodPassword, "scram", "wrong", false, sentClear},
		{MethodPassword, "nopw", "x", false, sentClear},
		{MethodPassword, "nobody", "secret-nobody", false, sentClear},
		{MethodPassword, "plain", "", false, sentClear}, // empty password is refused

		{MethodTrust, "anyone", "", true, ""},
	}
	for _, tt := range tests {
		name := string(tt.method) + "/" + tt.user + "/" + tt.password
		t.Run(name, func(t *testing.T) {
			a, err := New(Config{Method: tt.method, Users: users})
			if err != nil {
				t.Fatal(err)
			}
			res := connectPgconn(t, a, tt.user, tt.password, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5000})
			if res.server.user != tt.user {
				t.Errorf("server saw user %q, want %q", res.server.user, tt.user)
			}
			var first string
			if len(res.server.sent) > 0 {
				first = res.server.sent[0]
			}
			if first != tt.request {
				t.Errorf("first request = %q, want %q (all: %v)", first, tt.request, res.server.sent)
			}
			if tt.ok {
				if res.clientErr != nil || res.server.err != nil {
					t.Fatalf("want success; client: %v; server: %v", res.clientErr, res.server.err)
				}
				if tt.request == sentSASL && !slices.Contains(res.server.sent, sentFinal) {
					t.Errorf("SCRAM success without AuthenticationSASLFinal: %v", res.server.sent)
				}
				return
			}
			if !errors.Is(res.server.err, ErrAuthFailed) {
				t.Fatalf("server error = %v, want ErrAuthFailed", res.server.err)
			}
			want := `password authentication failed for user "` + tt.user + `"`
			if res.server.err.Error() != want {
				t.Errorf("server error text = %q, want %q", res.server.err.Error(), want)
			}
			var pgErr *pgconn.PgError
			if !errors.As(res.clientErr, &pgErr) || pgErr.Code != "28P01" {
				t.Fatalf("client error = %v, want a 28P01 PgError", res.clientErr)
			}
			if tt.request == sentSASL {
				// Mock authentication: the exchange ran to the client's
				// proof whatever the reason, and never reached SASLFinal.
				if !slices.Contains(res.server.sent, sentCont) || slices.Contains(res.server.sent, sentFinal) {
					t.Errorf("SCRAM failure messages = %v", res.server.sent)
				}
			}
		})
	}
}

func TestTrustLoopbackOnly(t *testing.T) {
	a, err := New(Config{Method: MethodTrust, TrustLoopbackOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	peers := []struct {
		peer net.Addr
		ok   bool
	}{
		{nil, true},
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv4(127, 9, 9, 9), Port: 1}, true},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 1}, true},
		{&net.UDPAddr{IP: net.ParseIP("::ffff:127.0.0.1"), Port: 1}, true},
		{&net.UnixAddr{Name: "/tmp/.s.PGSQL.6432", Net: "unix"}, true},
		{(*net.TCPAddr)(nil), true},
		{fakeAddr("pipe"), true},
		{fakeAddr("127.0.0.1:5432"), true},
		{&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 1}, false},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8::1"), Port: 1}, false},
		{fakeAddr("[2001:db8::1]:5432"), false},
		{fakeAddr("192.0.2.7"), false},
	}
	for _, p := range peers {
		res := connectPgconn(t, a, "u", "", p.peer)
		if p.ok != (res.server.err == nil) || p.ok != (res.clientErr == nil) {
			t.Errorf("peer %v: server err %v, client err %v; want ok=%v", p.peer, res.server.err, res.clientErr, p.ok)
		}
		if !p.ok && !errors.Is(res.server.err, ErrAuthFailed) {
			t.Errorf("peer %v: error %v does not wrap ErrAuthFailed", p.peer, res.server.err)
		}
	}
	// Without the restriction every peer is trusted.
	open, err := New(Config{Method: MethodTrust})
	if err != nil {
		t.Fatal(err)
	}
	if res := connectPgconn(t, open, "u", "", &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1)}); res.clientErr != nil {
		t.Errorf("trust without loopback limit: %v", res.clientErr)
	}
}

// fakeAddr is a net.Addr of a type the package does not know.
type fakeAddr string

func (f fakeAddr) Network() string { return "fake" }
func (f fakeAddr) String() string  { return string(f) }

func TestSCRAMVerifierRoundTrip(t *testing.T) {
	for _, pw := range []string{"pw", "correct horse battery staple", "pässwörd", `quote"comma,equals=`} {
		v, err := SCRAMVerifier(pw, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(v, "SCRAM-SHA-256$4096:") {
			t.Errorf("verifier %q: want default 4096 iterations", v)
		}
		sec, err := ParseSecret("u", v)
		if err != nil {
			t.Fatalf("ParseSecret(SCRAMVerifier): %v", err)
		}
		if sec.Kind() != SecretSCRAM {
			t.Fatalf("kind %v", sec.Kind())
		}
		a, err := New(Config{Method: MethodSCRAM, Users: NewUserlist(map[string]Secret{"u": sec})})
		if err != nil {
			t.Fatal(err)
		}
		if res := connectPgconn(t, a, "u", pw, nil); res.clientErr != nil || res.server.err != nil {
			t.Errorf("password %q: client %v, server %v", pw, res.clientErr, res.server.err)
		}
	}
}

func TestConcurrentPlaintextSCRAM(t *testing.T) {
	a, err := New(Config{Method: MethodSCRAM, Users: testUsers(t)})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			res := connectPgconn(t, a, "plain", "secret-plain", nil)
			if res.clientErr != nil {
				errs <- res.clientErr
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	a.mu.Lock()
	n := len(a.plainSCRAM)
	a.mu.Unlock()
	if n != 1 {
		t.Errorf("cached verifiers = %d, want 1", n)
	}
}

func TestNewValidates(t *testing.T) {
	users := NewUserlist(nil)
	tests := []struct {
		cfg     Config
		wantErr string
	}{
		{Config{Method: MethodTrust}, ""},
		{Config{Method: MethodSCRAM, Users: users}, ""},
		{Config{Users: users}, ""},
		{Config{}, "needs a userlist"},
		{Config{Method: MethodMD5}, "needs a userlist"},
		{Config{Method: MethodPassword}, "needs a userlist"},
		{Config{Method: "ldap", Users: users}, "unknown method"},
		{Config{Method: "MD5", Users: users}, "unknown method"},
	}
	for _, tt := range tests {
		a, err := New(tt.cfg)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("New(%+v): %v", tt.cfg, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("New(%+v) = %v, %v; want error containing %q", tt.cfg, a, err, tt.wantErr)
		}
	}
	a, _ := New(Config{Users: users})
	if a.Method() != MethodSCRAM {
		t.Errorf("default method = %q", a.Method())
	}
}

func TestParseMethod(t *testing.T) {
	for in, want := range map[string]Method{
		"trust": MethodTrust, "SCRAM-SHA-256": MethodSCRAM, " md5 ": MethodMD5,
		"password": MethodPassword, "plain": MethodPassword,
	} {
		got, err := ParseMethod(in)
		if err != nil || got != want {
			t.Errorf("ParseMethod(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseMethod("cert"); err == nil {
		t.Error("ParseMethod(cert) succeeded")
	}
}
