package pgauth

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// fuzzUsers are the startup users a fuzz input can pick, one per path
// through scramKeysFor.
var fuzzUsers = []string{"scram", "plain", "md5", "nopw", "nobody"}

// FuzzSCRAMClientMessages feeds arbitrary SASLInitialResponse and
// SASLResponse bodies to the SCRAM exchange. It must never panic, never
// accept the client, and fail only with ErrProtocol, ErrAuthFailed or the
// end of the scripted input. Run with
// go test -fuzz=FuzzSCRAMClientMessages ./internal/pgauth/.
func FuzzSCRAMClientMessages(f *testing.F) {
	f.Add([]byte("n,,n=,r=rOprNGfwEbeRWgbNEkqO"), []byte("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="), true, uint8(0))
	f.Add([]byte("y,,n=user,r=abc"), []byte("c=eSws,r=abc,p=AAAA"), true, uint8(1))
	f.Add([]byte("p=tls-server-end-point,,n=,r=abc"), []byte(""), true, uint8(4))
	f.Add([]byte("n,a=admin,n=,r=abc"), []byte("c=biwsYT1hZG1pbiw=,r=abc,x=ext,p=AAAA"), true, uint8(2))
	f.Add([]byte("SCRAM-SHA-256\x00\xff\xff\xff\xff"), []byte("n,,n=,r=abc"), false, uint8(3))
	f.Add([]byte("SCRAM-SHA-256\x00\x00\x00\x00\x03n,,"), []byte{}, false, uint8(0))
	f.Add([]byte(""), []byte(""), false, uint8(0))

	users := fuzzUsersList(f)
	a, err := New(Config{Method: MethodSCRAM, Users: users})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, first, final []byte, wrap bool, who uint8) {
		body := first
		if wrap {
			body = saslInitial(scramMechanism, first)
		}
		ex := &scriptedExchange{bodies: [][]byte{body, bytes.Clone(final)}}
		user := fuzzUsers[int(who)%len(fuzzUsers)]
		err := a.Authenticate(context.Background(), ex, user, nil)
		if err == nil {
			t.Fatalf("random input authenticated %q: %q / %q", user, first, final)
		}
		if !errors.Is(err, ErrProtocol) && !errors.Is(err, ErrAuthFailed) && !errors.Is(err, errScriptDone) {
			t.Fatalf("unexpected error kind: %v", err)
		}
	})
}

// FuzzParseUserlist checks that no file makes the parser panic and that
// whatever parses can be looked up.
func FuzzParseUserlist(f *testing.F) {
	f.Add([]byte("\"u\" \"pw\"\n; c\n# c\n\"q\"\"x\" \"md5" + "0123456789abcdef0123456789abcdef\"\n"))
	f.Add([]byte("\"u\" \"SCRAM-SHA-256$4096:c2FsdA==$x:y\"\n"))
	f.Add([]byte("\"u\"\t\"\" extra\r\n\"\"\"\" \"x\""))
	f.Fuzz(func(t *testing.T, data []byte) {
		u, err := ParseUserlist(bytes.NewReader(data))
		if err != nil {
			return
		}
		for _, name := range u.Users() {
			if _, ok := u.Lookup(name); !ok {
				t.Fatalf("listed user %q not found", name)
			}
		}
	})
}

// fuzzUsersList builds the fuzz userlist once, with a cheap iteration count
// so each input runs fast.
func fuzzUsersList(tb testing.TB) *Userlist {
	tb.Helper()
	v, err := SCRAMVerifier("secret-scram", 16)
	if err != nil {
		tb.Fatal(err)
	}
	m := map[string]Secret{}
	for user, s := range map[string]string{"scram": v, "plain": "secret-plain", "md5": md5Hash("pw", "md5"), "nopw": ""} {
		sec, err := ParseSecret(user, s)
		if err != nil {
			tb.Fatal(err)
		}
		m[user] = sec
	}
	return NewUserlist(m)
}
