package pgauth

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"
)

// md5Auth runs PostgreSQL's md5 challenge: the client answers a random 4-byte
// salt with "md5" + hex(md5(hex(md5(password + user)) + salt)). A user that
// is unknown or has no md5-capable secret still gets a challenge, and fails
// once it answers.
func (a *Authenticator) md5Auth(ctx context.Context, ex Exchange, user string, secret Secret, found bool) error {
	var salt [4]byte
	if _, err := rand.Read(salt[:]); err != nil {
		return fmt.Errorf("generate md5 salt: %w", err)
	}
	if err := ex.Send(&pgproto3.AuthenticationMD5Password{Salt: salt}); err != nil {
		return fmt.Errorf("send AuthenticationMD5Password: %w", err)
	}
	answer, err := a.receivePasswordMessage(ctx, ex, user)
	if err != nil {
		return err
	}
	if !found {
		return authFailed(user, "user is not in the userlist")
	}
	stored, ok := secret.md5Hash()
	if !ok {
		return authFailed(user, "user has no password")
	}
	// stored is "md5" + hex; the challenge hashes the hex part with the salt.
	sum := md5.Sum(append([]byte(stored[3:]), salt[:]...))
	want := "md5" + hex.EncodeToString(sum[:])
	if subtle.ConstantTimeCompare([]byte(answer), []byte(want)) != 1 {
		return authFailed(user, "md5 password does not match")
	}
	return nil
}

// passwordAuth asks for the cleartext password and checks it against any
// kind of secret.
func (a *Authenticator) passwordAuth(ctx context.Context, ex Exchange, user string, secret Secret, found bool) error {
	if err := ex.Send(&pgproto3.AuthenticationCleartextPassword{}); err != nil {
		return fmt.Errorf("send AuthenticationCleartextPassword: %w", err)
	}
	password, err := a.receivePasswordMessage(ctx, ex, user)
	if err != nil {
		return err
	}
	if !found {
		return authFailed(user, "user is not in the userlist")
	}
	if secret.kind == SecretNone {
		return authFailed(user, "user has no password")
	}
	if !secret.verifyCleartext(password) {
		return authFailed(user, "password does not match")
	}
	return nil
}

// receivePasswordMessage reads a PasswordMessage body: one C string filling
// the whole message, as PostgreSQL's recv_password_packet demands. An empty
// password is refused as PostgreSQL refuses it.
func (a *Authenticator) receivePasswordMessage(ctx context.Context, ex Exchange, user string) (string, error) {
	body, err := ex.ReceivePassword(ctx)
	if err != nil {
		return "", fmt.Errorf("receive PasswordMessage: %w", err)
	}
	if len(body) == 0 || bytes.IndexByte(body, 0) != len(body)-1 {
		return "", protocolError(user, "invalid password packet size", nil)
	}
	if len(body) == 1 {
		return "", authFailed(user, "empty password returned by client")
	}
	return string(body[:len(body)-1]), nil
}
