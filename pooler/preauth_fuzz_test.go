package pooler_test

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/pooler"
)

// Allocation allowed for one fuzzed session: a fixed amount for the session
// itself (buffers, the SCRAM exchange, goroutines) plus a multiple of the
// bytes the client sent. What a client announces must not count: a message
// that claims megabytes and delivers a few bytes stays within this bound.
const (
	preauthFuzzFixed   = 128 << 10
	preauthFuzzPerByte = 4
)

// preauthPoolers builds one pooler per client authentication method, each
// with a userlist holding user "u" with password "secret".
func preauthPoolers(tb testing.TB) []*pooler.Pooler {
	tb.Helper()
	verifier, err := pgauth.SCRAMVerifier("secret", 16) // few iterations: fast inputs
	if err != nil {
		tb.Fatal(err)
	}
	var out []*pooler.Pooler
	for _, c := range []struct {
		method pgauth.Method
		secret string
	}{
		{pgauth.MethodSCRAM, verifier},
		{pgauth.MethodMD5, "secret"},
		{pgauth.MethodPassword, "secret"},
	} {
		users, err := pgauth.ParseUserlist(strings.NewReader(`"u" "` + c.secret + `"` + "\n"))
		if err != nil {
			tb.Fatal(err)
		}
		a, err := pgauth.New(pgauth.Config{Method: c.method, Users: users})
		if err != nil {
			tb.Fatal(err)
		}
		p, err := pooler.New(pooler.Config{Auth: a, StartupTimeout: time.Minute}, noPools{}, nil, nil)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// FuzzPreauthSession feeds arbitrary client bytes (a startup packet, then
// password, SASLInitialResponse or SASLResponse messages) to a session with
// SCRAM, md5 or password authentication configured (method picks which),
// over an in-memory pipe. The session must end once the client hangs up,
// release every startup slot, and allocate no more than a fixed amount plus
// a small multiple of the bytes sent, whatever lengths the messages
// announce. The seed corpus is in testdata/fuzz/FuzzPreauthSession; run with
// go test -run=^$ -fuzz=FuzzPreauthSession ./pooler/.
func FuzzPreauthSession(f *testing.F) {
	poolers := preauthPoolers(f)
	f.Fuzz(func(t *testing.T, method uint8, data []byte) {
		p := poolers[int(method)%len(poolers)]
		limit := uint64(preauthFuzzFixed + preauthFuzzPerByte*len(data))
		// A process's first pass through some code (crypto self-tests,
		// lazily built tables) allocates once; only an input that is over
		// the bound on a second run too fails.
		if got := preauthRun(t, p, data); got > limit {
			if got = preauthRun(t, p, data); got > limit {
				t.Fatalf("session allocated %d bytes for %d bytes of input, want at most %d", got, len(data), limit)
			}
		}
	})
}

// preauthRun serves one session fed data and returns the bytes allocated
// meanwhile.
func preauthRun(t *testing.T, p *pooler.Pooler, data []byte) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)

	feedSession(t, p, data)

	runtime.ReadMemStats(&after)
	if n := p.Sessions(); n != 0 {
		t.Fatalf("%d sessions left registered", n)
	}
	if n := p.StartingSessions(); n != 0 {
		t.Fatalf("%d startup slots still held", n)
	}
	return after.TotalAlloc - before.TotalAlloc
}
