package pgauth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/xdg-go/scram"
)

// scramMechanism is the only SASL mechanism offered. The -PLUS variant needs
// the TLS channel, which the pooler does not expose to authentication.
const scramMechanism = "SCRAM-SHA-256"

// scramAuth runs a SCRAM-SHA-256 exchange (RFC 5802, RFC 7677) in
// PostgreSQL's SASL framing. When the user is unknown, has no password, or
// only an md5 hash (which cannot answer SCRAM), the exchange still runs to the
// end against a mock verifier and then fails, like PostgreSQL's mock
// authentication, so a client cannot tell which case it hit.
func (a *Authenticator) scramAuth(ctx context.Context, ex Exchange, user string, secret Secret, found bool) error {
	keys, real, why, err := a.scramKeysFor(user, secret, found)
	if err != nil {
		return err
	}

	if err := ex.Send(&pgproto3.AuthenticationSASL{AuthMechanisms: []string{scramMechanism}}); err != nil {
		return fmt.Errorf("send AuthenticationSASL: %w", err)
	}
	body, err := ex.ReceivePassword(ctx)
	if err != nil {
		return fmt.Errorf("receive SASLInitialResponse: %w", err)
	}
	mech, data, hasData, err := parseSASLInitialResponse(body)
	if err != nil {
		return protocolError(user, "malformed SASLInitialResponse", err)
	}
	if mech != scramMechanism {
		return protocolError(user, fmt.Sprintf("client selected an invalid SASL authentication mechanism %q", mech), nil)
	}
	if !hasData {
		// A length of -1 means the client sent no initial response; the
		// server answers with an empty challenge and gets it next
		// (RFC 4422 section 5, PostgreSQL's scram_exchange with NULL input).
		if err := ex.Send(&pgproto3.AuthenticationSASLContinue{Data: []byte{}}); err != nil {
			return fmt.Errorf("send AuthenticationSASLContinue: %w", err)
		}
		if data, err = ex.ReceivePassword(ctx); err != nil {
			return fmt.Errorf("receive SASLResponse: %w", err)
		}
	}
	if len(data) > 0 && data[0] == 'p' {
		return protocolError(user, "channel binding is not supported: the client asked for SCRAM-SHA-256-PLUS channel binding, but only SCRAM-SHA-256 was offered", nil)
	}

	server, err := scram.SHA256.NewServer(func(string) (scram.StoredCredentials, error) {
		// PostgreSQL clients leave the SCRAM user name empty ("n=,"); the
		// identity is the startup user, whatever the message says.
		return scram.StoredCredentials{
			KeyFactors: scram.KeyFactors{Salt: string(keys.salt), Iters: keys.iterations},
			StoredKey:  keys.storedKey,
			ServerKey:  keys.serverKey,
		}, nil
	})
	if err != nil {
		return fmt.Errorf("scram server: %w", err)
	}
	conv := server.NewConversation()

	serverFirst, err := conv.Step(string(data))
	if err != nil {
		return protocolError(user, "malformed SCRAM client-first-message", err)
	}
	if err := ex.Send(&pgproto3.AuthenticationSASLContinue{Data: []byte(serverFirst)}); err != nil {
		return fmt.Errorf("send AuthenticationSASLContinue: %w", err)
	}

	clientFinal, err := ex.ReceivePassword(ctx)
	if err != nil {
		return fmt.Errorf("receive SASLResponse: %w", err)
	}
	serverFinal, err := conv.Step(string(clientFinal))
	if err != nil {
		if serverFinal == scram.ErrInvalidProof {
			if !real {
				return authFailed(user, why)
			}
			return authFailed(user, "SCRAM proof does not match the stored verifier")
		}
		return protocolError(user, "malformed SCRAM client-final-message", err)
	}
	if !real || !conv.Valid() {
		return authFailed(user, why)
	}
	if err := ex.Send(&pgproto3.AuthenticationSASLFinal{Data: []byte(serverFinal)}); err != nil {
		return fmt.Errorf("send AuthenticationSASLFinal: %w", err)
	}
	return nil
}

// scramKeysFor returns the verifier to run the exchange against. real is
// false when the keys are a mock and the exchange must fail; why then says
// why, for the log.
func (a *Authenticator) scramKeysFor(user string, secret Secret, found bool) (keys scramKeys, real bool, why string, err error) {
	if !found {
		return a.mockKeys(user), false, "user is not in the userlist", nil
	}
	switch secret.kind {
	case SecretSCRAM:
		return secret.scram, true, "", nil
	case SecretPlain:
		k, err := a.plainKeys(user, secret.plain)
		if err != nil {
			return scramKeys{}, false, "", err
		}
		return k, true, "", nil
	case SecretMD5:
		return a.mockKeys(user), false, "user has an md5 secret, which cannot be used for SCRAM authentication", nil
	default:
		return a.mockKeys(user), false, "user has no password", nil
	}
}

// plainKeys returns a verifier for a plaintext secret, computing it once per
// user and password.
func (a *Authenticator) plainKeys(user, plain string) (scramKeys, error) {
	a.mu.Lock()
	c, ok := a.plainSCRAM[user]
	a.mu.Unlock()
	if ok && c.plain == plain {
		return c.keys, nil
	}
	k, err := newSCRAMKeys(plain, DefaultSCRAMIterations)
	if err != nil {
		return scramKeys{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.plainSCRAM[user]; ok && c.plain == plain {
		return c.keys, nil // another session won the race; keep one salt
	}
	a.plainSCRAM[user] = cachedKeys{plain: plain, keys: k}
	return k, nil
}

// mockKeys makes a fake verifier for user. The salt is a keyed hash of the
// user name, stable within the process, so repeated attempts see the same
// salt exactly as they would for a real user.
func (a *Authenticator) mockKeys(user string) scramKeys {
	h := func(label string) []byte {
		m := hmac.New(sha256.New, a.mockKey)
		m.Write([]byte(label))
		m.Write([]byte{0})
		m.Write([]byte(user))
		return m.Sum(nil)
	}
	return scramKeys{
		iterations: DefaultSCRAMIterations,
		salt:       h("salt")[:scramSaltLen],
		storedKey:  h("stored"),
		serverKey:  h("server"),
	}
}

// parseSASLInitialResponse splits a SASLInitialResponse body: the mechanism
// name as a C string, an Int32 length, then that many bytes of data, where a
// length of -1 means no data. The length must match the rest of the body.
func parseSASLInitialResponse(body []byte) (mech string, data []byte, hasData bool, err error) {
	nul := -1
	for i, c := range body {
		if c == 0 {
			nul = i
			break
		}
	}
	if nul < 0 {
		return "", nil, false, fmt.Errorf("mechanism name is not terminated")
	}
	mech = string(body[:nul])
	rest := body[nul+1:]
	if len(rest) < 4 {
		return "", nil, false, fmt.Errorf("missing data length")
	}
	n := int32(binary.BigEndian.Uint32(rest))
	rest = rest[4:]
	if n == -1 {
		if len(rest) != 0 {
			return "", nil, false, fmt.Errorf("trailing bytes after empty initial response")
		}
		return mech, nil, false, nil
	}
	if n < 0 || int(n) != len(rest) {
		return "", nil, false, fmt.Errorf("data length %d does not match the %d bytes sent", n, len(rest))
	}
	return mech, rest, true, nil
}
