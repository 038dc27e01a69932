package pgauth

import (
	"crypto/hmac"
	"crypto/md5"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/xdg-go/stringprep"
)

// DefaultSCRAMIterations is the PBKDF2 iteration count SCRAMVerifier uses
// when asked for zero, the same default as PostgreSQL's scram_iterations.
const DefaultSCRAMIterations = 4096

// scramSaltLen is the salt length PostgreSQL uses for new verifiers
// (SCRAM_DEFAULT_SALT_LEN in src/include/common/scram-common.h).
const scramSaltLen = 16

// scramKeyLen is the size of SHA-256 output, the length of StoredKey and
// ServerKey.
const scramKeyLen = sha256.Size

// scramPrefix starts every SCRAM-SHA-256 verifier in pg_authid.rolpassword.
const scramPrefix = "SCRAM-SHA-256$"

// ErrBadSecret reports a stored secret that looks like a SCRAM verifier but
// cannot be parsed. ParseSecret wraps it so callers can tell a broken
// userlist entry from an I/O problem.
var ErrBadSecret = errors.New("invalid secret")

// SecretKind says how a Secret is stored, which decides the exchanges it can
// take part in: a plaintext password works with every method, an md5 hash
// cannot answer SCRAM, and a SCRAM verifier cannot answer md5.
type SecretKind int

const (
	// SecretNone is a user without a password. It never authenticates, like a
	// PostgreSQL role whose rolpassword is NULL.
	SecretNone SecretKind = iota
	// SecretPlain is a cleartext password.
	SecretPlain
	// SecretMD5 is "md5" followed by hex(md5(password + user)).
	SecretMD5
	// SecretSCRAM is a SCRAM-SHA-256 verifier in PostgreSQL's format.
	SecretSCRAM
)

// String names the kind for logs and error messages.
func (k SecretKind) String() string {
	switch k {
	case SecretNone:
		return "none"
	case SecretPlain:
		return "plaintext"
	case SecretMD5:
		return "md5"
	case SecretSCRAM:
		return "scram-sha-256"
	default:
		return "SecretKind(" + strconv.Itoa(int(k)) + ")"
	}
}

// scramKeys holds the parts of a SCRAM-SHA-256 verifier, decoded.
type scramKeys struct {
	iterations int
	salt       []byte
	storedKey  []byte
	serverKey  []byte
}

// String formats the keys the way PostgreSQL stores them in
// pg_authid.rolpassword.
func (k scramKeys) String() string {
	return fmt.Sprintf("%s%d:%s$%s:%s", scramPrefix, k.iterations,
		base64.StdEncoding.EncodeToString(k.salt),
		base64.StdEncoding.EncodeToString(k.storedKey),
		base64.StdEncoding.EncodeToString(k.serverKey))
}

// Secret is one user's stored credential, as it appears in a PgBouncer
// auth_file or in pg_authid.rolpassword. The zero value is SecretNone and
// never authenticates. A Secret never prints its contents: String and the
// %v verb show only its kind, so secrets do not end up in logs.
type Secret struct {
	kind  SecretKind
	user  string
	plain string    // SecretPlain
	md5   string    // SecretMD5: "md5" + 32 lowercase hex digits
	scram scramKeys // SecretSCRAM
}

// ParseSecret classifies s the way PostgreSQL's get_password_type does: "md5"
// followed by exactly 32 lowercase hex digits is an md5 hash, a string that
// starts with "SCRAM-SHA-256$" is a SCRAM verifier (and must parse: a broken
// verifier is an error wrapping ErrBadSecret rather than silently becoming a
// plaintext password), the empty string is SecretNone, and anything else is a
// plaintext password. user is kept because md5 hashes are salted with the
// user name.
func ParseSecret(user, s string) (Secret, error) {
	switch {
	case s == "":
		return Secret{kind: SecretNone, user: user}, nil
	case isMD5Hash(s):
		return Secret{kind: SecretMD5, user: user, md5: s}, nil
	case strings.HasPrefix(s, scramPrefix):
		k, err := parseSCRAMVerifier(s)
		if err != nil {
			return Secret{}, err
		}
		return Secret{kind: SecretSCRAM, user: user, scram: k}, nil
	default:
		return Secret{kind: SecretPlain, user: user, plain: s}, nil
	}
}

// Kind reports how the secret is stored.
func (s Secret) Kind() SecretKind { return s.kind }

// String shows the kind only, never the secret, so that a Secret printed by
// mistake does not leak into logs.
func (s Secret) String() string { return "Secret(" + s.kind.String() + ")" }

// GoString keeps %#v as discreet as %v.
func (s Secret) GoString() string { return s.String() }

// isMD5Hash applies PostgreSQL's test for a stored md5 password: "md5" and
// 32 characters from "0123456789abcdef".
func isMD5Hash(s string) bool {
	if len(s) != 35 || !strings.HasPrefix(s, "md5") {
		return false
	}
	for _, c := range []byte(s[3:]) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// parseSCRAMVerifier decodes "SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>"
// as parse_scram_secret in PostgreSQL's src/backend/libpq/auth-scram.c does.
func parseSCRAMVerifier(s string) (scramKeys, error) {
	bad := func(why string) (scramKeys, error) {
		return scramKeys{}, fmt.Errorf("%w: SCRAM verifier: %s", ErrBadSecret, why)
	}
	rest, ok := strings.CutPrefix(s, scramPrefix)
	if !ok {
		return bad("missing SCRAM-SHA-256$ prefix")
	}
	params, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return bad("want SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>")
	}
	iterStr, saltStr, ok := strings.Cut(params, ":")
	if !ok {
		return bad("missing salt")
	}
	iter, err := strconv.Atoi(iterStr)
	if err != nil || iter <= 0 {
		return bad(fmt.Sprintf("bad iteration count %q", iterStr))
	}
	salt, err := base64.StdEncoding.DecodeString(saltStr)
	if err != nil || len(salt) == 0 {
		return bad("salt is not base64")
	}
	storedStr, serverStr, ok := strings.Cut(keys, ":")
	if !ok {
		return bad("missing ServerKey")
	}
	stored, err := base64.StdEncoding.DecodeString(storedStr)
	if err != nil || len(stored) != scramKeyLen {
		return bad("StoredKey is not 32 bytes of base64")
	}
	server, err := base64.StdEncoding.DecodeString(serverStr)
	if err != nil || len(server) != scramKeyLen {
		return bad("ServerKey is not 32 bytes of base64")
	}
	return scramKeys{iterations: iter, salt: salt, storedKey: stored, serverKey: server}, nil
}

// SCRAMVerifier builds a SCRAM-SHA-256 verifier for password in the format
// PostgreSQL stores in pg_authid.rolpassword, with a random 16-byte salt.
// Storing verifiers instead of passwords in the userlist means a leaked file
// does not reveal the passwords. iterations of zero means
// DefaultSCRAMIterations; negative counts are an error. The password is
// normalized with SASLprep as PostgreSQL does.
func SCRAMVerifier(password string, iterations int) (string, error) {
	if iterations < 0 {
		return "", fmt.Errorf("SCRAM iterations must be positive, got %d", iterations)
	}
	if iterations == 0 {
		iterations = DefaultSCRAMIterations
	}
	k, err := newSCRAMKeys(password, iterations)
	if err != nil {
		return "", err
	}
	return k.String(), nil
}

// newSCRAMKeys derives verifier keys for password with a fresh random salt.
func newSCRAMKeys(password string, iterations int) (scramKeys, error) {
	salt := make([]byte, scramSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return scramKeys{}, fmt.Errorf("generate SCRAM salt: %w", err)
	}
	stored, server, err := deriveSCRAMKeys(password, salt, iterations)
	if err != nil {
		return scramKeys{}, err
	}
	return scramKeys{iterations: iterations, salt: salt, storedKey: stored, serverKey: server}, nil
}

// deriveSCRAMKeys computes StoredKey and ServerKey from a password as in
// RFC 5802 section 3, after PostgreSQL's SASLprep normalization.
func deriveSCRAMKeys(password string, salt []byte, iterations int) (stored, server []byte, err error) {
	salted, err := pbkdf2.Key(sha256.New, saslPrep(password), salt, iterations, scramKeyLen)
	if err != nil {
		return nil, nil, fmt.Errorf("derive SCRAM keys: %w", err)
	}
	clientKey := hmacSHA256(salted, "Client Key")
	sum := sha256.Sum256(clientKey)
	return sum[:], hmacSHA256(salted, "Server Key"), nil
}

// hmacSHA256 returns HMAC-SHA-256(key, msg).
func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// saslPrep normalizes a password the way PostgreSQL's pg_saslprep does before
// SCRAM hashing: pure ASCII and invalid UTF-8 are used as they are, and a
// password SASLprep rejects (prohibited or unassigned code points) is used raw
// as well, because PostgreSQL accepts such passwords too.
func saslPrep(password string) string {
	ascii := true
	for i := 0; i < len(password); i++ {
		if password[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii || !utf8.ValidString(password) {
		return password
	}
	prepped, err := stringprep.SASLprep.Prepare(password)
	if err != nil {
		return password
	}
	return prepped
}

// md5Hash returns PostgreSQL's stored md5 form, "md5"+hex(md5(password+user)).
func md5Hash(password, user string) string {
	sum := md5.Sum([]byte(password + user))
	return "md5" + hex.EncodeToString(sum[:])
}

// md5Hash returns the secret's md5 form, or false when the secret cannot
// produce one (SCRAM verifiers and SecretNone).
func (s Secret) md5Hash() (string, bool) {
	switch s.kind {
	case SecretPlain:
		return md5Hash(s.plain, s.user), true
	case SecretMD5:
		return s.md5, true
	default:
		return "", false
	}
}

// verifyCleartext reports whether password matches the secret, whatever its
// kind, comparing in constant time. It is what the "password" method uses.
func (s Secret) verifyCleartext(password string) bool {
	switch s.kind {
	case SecretPlain:
		return subtle.ConstantTimeCompare([]byte(password), []byte(s.plain)) == 1
	case SecretMD5:
		return subtle.ConstantTimeCompare([]byte(md5Hash(password, s.user)), []byte(s.md5)) == 1
	case SecretSCRAM:
		// As scram_verify_plain_password does: recompute ServerKey.
		_, server, err := deriveSCRAMKeys(password, s.scram.salt, s.scram.iterations)
		return err == nil && hmac.Equal(server, s.scram.serverKey)
	default:
		return false
	}
}
