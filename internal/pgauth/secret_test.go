package pgauth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestParseSecretKinds(t *testing.T) {
	v, err := SCRAMVerifier("pw", 10)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		in   string
		kind SecretKind
	}{
		{"", SecretNone},
		{"hunter2", SecretPlain},
		{md5Hash("pw", "u"), SecretMD5},
		{"md5" + strings.Repeat("A", 32), SecretPlain}, // uppercase hex is not an md5 hash to PostgreSQL
		{"md5" + strings.Repeat("a", 31), SecretPlain},
		{"md5" + strings.Repeat("a", 33), SecretPlain},
		{v, SecretSCRAM},
		{"scram-sha-256$not-a-verifier", SecretPlain}, // the prefix is case-sensitive
	}
	for _, tt := range tests {
		s, err := ParseSecret("u", tt.in)
		if err != nil {
			t.Errorf("ParseSecret(%q): %v", tt.in, err)
			continue
		}
		if s.Kind() != tt.kind {
			t.Errorf("ParseSecret(%q).Kind() = %v, want %v", tt.in, s.Kind(), tt.kind)
		}
	}
}

func TestParseSecretBadVerifiers(t *testing.T) {
	key := "UrRmmKTSUfwvpFpBUxGK9AzGAT9I7NHymxrppOyIqfw="
	for _, in := range []string{
		"SCRAM-SHA-256$",
		"SCRAM-SHA-256$4096:c2FsdA==",
		"SCRAM-SHA-256$4096$" + key + ":" + key,
		"SCRAM-SHA-256$0:c2FsdA==$" + key + ":" + key,
		"SCRAM-SHA-256$-1:c2FsdA==$" + key + ":" + key,
		"SCRAM-SHA-256$x:c2FsdA==$" + key + ":" + key,
		"SCRAM-SHA-256$4096:!!!$" + key + ":" + key,
		"SCRAM-SHA-256$4096:$" + key + ":" + key,
		"SCRAM-SHA-256$4096:c2FsdA==$" + key,
		"SCRAM-SHA-256$4096:c2FsdA==$c2hvcnQ=:" + key,
		"SCRAM-SHA-256$4096:c2FsdA==$" + key + ":c2hvcnQ=",
	} {
		if _, err := ParseSecret("u", in); !errors.Is(err, ErrBadSecret) {
			t.Errorf("ParseSecret(%q) = %v, want ErrBadSecret", in, err)
		}
	}
}

func TestSecretDoesNotPrint(t *testing.T) {
	s, err := ParseSecret("u", "very-secret-password")
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s", s, s, s, s)} {
		if strings.Contains(out, "very-secret") {
			t.Errorf("formatted secret leaks: %s", out)
		}
	}
}

func TestSCRAMVerifierFormat(t *testing.T) {
	re := regexp.MustCompile(`^SCRAM-SHA-256\$(\d+):([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]{44}):([A-Za-z0-9+/=]{44})$`)
	a, err := SCRAMVerifier("pw", 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := SCRAMVerifier("pw", 5000)
	if err != nil {
		t.Fatal(err)
	}
	ma, mb := re.FindStringSubmatch(a), re.FindStringSubmatch(b)
	if ma == nil || mb == nil {
		t.Fatalf("verifiers do not match PostgreSQL's format:\n%s\n%s", a, b)
	}
	if ma[1] != "4096" || mb[1] != "5000" {
		t.Errorf("iterations %s, %s; want 4096, 5000", ma[1], mb[1])
	}
	if len(ma[2]) != 24 { // 16 bytes of salt
		t.Errorf("salt %q is not 16 bytes", ma[2])
	}
	if ma[2] == mb[2] {
		t.Error("two verifiers share a salt")
	}
	if _, err := SCRAMVerifier("pw", -1); err == nil {
		t.Error("negative iterations accepted")
	}
}

// TestPostgresVerifiers checks secrets copied from a real PostgreSQL 15
// server's pg_authid against their passwords, including one whose password
// SASLprep changes before hashing.
func TestPostgresVerifiers(t *testing.T) {
	users, err := LoadUserlist(filepath.Join("testdata", "postgres15_verifiers.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for user, pw := range map[string]string{"u": "pw", "weird user": "pässwörd ½", "m": "pw"} {
		s, ok := users.Lookup(user)
		if !ok {
			t.Fatalf("user %q missing", user)
		}
		if !s.verifyCleartext(pw) {
			t.Errorf("%q: PostgreSQL's secret does not verify %q", user, pw)
		}
		if s.verifyCleartext(pw + "x") {
			t.Errorf("%q: wrong password verifies", user)
		}
	}
	// Without SASLprep the ½ password would not match: the normalization is
	// what makes it verify.
	s, _ := users.Lookup("weird user")
	stored, _, err := deriveSCRAMKeys("pässwörd 1⁄2", s.scram.salt, s.scram.iterations)
	if err != nil {
		t.Fatal(err)
	}
	if string(stored) != string(s.scram.storedKey) {
		t.Error("SASLprep-normalized password does not give PostgreSQL's StoredKey")
	}

	// pgx's own SCRAM client against PostgreSQL's verifier, through the
	// Authenticator, with the SCRAM and md5 methods (md5 falls back to SCRAM).
	for _, m := range []Method{MethodSCRAM, MethodMD5} {
		a, err := New(Config{Method: m, Users: users})
		if err != nil {
			t.Fatal(err)
		}
		if res := connectPgconn(t, a, "u", "pw", nil); res.clientErr != nil || res.server.err != nil {
			t.Errorf("%s: client %v, server %v", m, res.clientErr, res.server.err)
		}
		if res := connectPgconn(t, a, "u", "nope", nil); res.clientErr == nil {
			t.Errorf("%s: wrong password accepted", m)
		}
		if res := connectPgconn(t, a, "m", "pw", nil); (m == MethodMD5) != (res.clientErr == nil) {
			t.Errorf("%s: md5 user: client %v", m, res.clientErr)
		}
	}
}

func TestSASLPrep(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain ascii", "plain ascii"},
		{"ctrl\x01ascii", "ctrl\x01ascii"}, // ASCII is never touched
		{"½", "1⁄2"},                       // NFKC
		{"a\u00a0b", "a b"},                // non-ASCII space maps to space
		{"soft\u00adhyphen", "softhyphen"}, // mapped to nothing
		{"bad\xffutf8", "bad\xffutf8"},     // invalid UTF-8 is used raw
		{"\u0627\u0031", "\u0627\u0031"},   // bidi violation: used raw
		{"x\u0221", "x\u0221"},             // unassigned in Unicode 3.2: used raw
	}
	for _, tt := range tests {
		if got := saslPrep(tt.in); got != tt.want {
			t.Errorf("saslPrep(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestUserlistGolden(t *testing.T) {
	users, err := LoadUserlist(filepath.Join("testdata", "userlist", "pgbouncer.good.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		kind     SecretKind
		password string
	}{
		"alice":       {SecretPlain, "alice-plain-password"},
		"bob":         {SecretMD5, "bob-password"},
		"carol":       {SecretSCRAM, "pw"},
		"dave":        {SecretNone, ""},
		`quo"ted`:     {SecretPlain, `pass "with" quotes`},
		"old pg_auth": {SecretPlain, "md5NOTHEX-so-this-is-plaintext"},
		"crlf":        {SecretPlain, "tabbed"},
		"windows":     {SecretPlain, "line-ending"},
	}
	if users.Len() != len(want) {
		t.Errorf("users = %q, want %d", users.Users(), len(want))
	}
	for user, w := range want {
		s, ok := users.Lookup(user)
		if !ok {
			t.Errorf("user %q missing", user)
			continue
		}
		if s.Kind() != w.kind {
			t.Errorf("%q: kind %v, want %v", user, s.Kind(), w.kind)
		}
		if w.kind != SecretNone && !s.verifyCleartext(w.password) {
			t.Errorf("%q: password %q does not verify", user, w.password)
		}
	}

	empty, err := LoadUserlist(filepath.Join("testdata", "userlist", "empty.good.txt"))
	if err != nil || empty.Len() != 0 {
		t.Errorf("empty userlist: %v users, err %v", empty.Len(), err)
	}
}

func TestUserlistBadFiles(t *testing.T) {
	want := map[string]string{
		"unquoted-user.bad.txt":   "line 2: user name: userlist syntax error: field must start with a double quote",
		"unterminated.bad.txt":    "line 3: secret for user \"bob\": userlist syntax error: missing closing double quote",
		"missing-secret.bad.txt":  "line 1: userlist syntax error: missing secret after user \"alice\"",
		"empty-user.bad.txt":      "line 1: userlist syntax error: empty user name",
		"duplicate.bad.txt":       "line 3: userlist syntax error: user \"alice\" already defined on line 1",
		"bad-verifier.bad.txt":    "line 1: user \"alice\": invalid secret: SCRAM verifier: StoredKey is not 32 bytes of base64",
		"no-space.bad.txt":        "line 1: userlist syntax error: want white space after the user name",
		"trailing.bad.txt":        "line 1: userlist syntax error: unexpected text after the secret for user \"alice\"",
		"unquoted-secret.bad.txt": "line 1: secret for user \"alice\": userlist syntax error: field must start with a double quote",
	}
	files, err := filepath.Glob(filepath.Join("testdata", "userlist", "*.bad.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(want) {
		t.Errorf("found %d bad files, the table has %d", len(files), len(want))
	}
	for _, f := range files {
		name := filepath.Base(f)
		_, err := LoadUserlist(f)
		if err == nil {
			t.Errorf("%s: parsed without error", name)
			continue
		}
		if !errors.Is(err, ErrUserlistSyntax) && !errors.Is(err, ErrBadSecret) {
			t.Errorf("%s: %v wraps neither ErrUserlistSyntax nor ErrBadSecret", name, err)
		}
		if got := strings.TrimPrefix(err.Error(), f+": "); got != want[name] {
			t.Errorf("%s:\n got  %s\n want %s", name, got, want[name])
		}
	}
	if _, err := LoadUserlist(filepath.Join("testdata", "no-such-file")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	long := `"u" "` + strings.Repeat("x", maxUserlistLine) + `"`
	if _, err := ParseUserlist(strings.NewReader(long)); !errors.Is(err, ErrUserlistSyntax) {
		t.Errorf("over-long line: %v", err)
	}
}
