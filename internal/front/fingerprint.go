package front

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Fingerprint returns the SHA-256 of a certificate's DER bytes as lower-case
// hex, the spelling the pooler's edge trust gives Peer.ClientCerts' leaf, of the fingerprint the QUIC
// front logs for its own certificate and of the pins clients give.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// ParseFingerprint accepts a SHA-256 fingerprint in any of the spellings
// tools print (hex in either case, optional colons, an optional "sha256:"
// or "sha256/" prefix) and returns it as Fingerprint spells it, so a pin or
// an edge-trust entry copied from openssl's output matches.
func ParseFingerprint(s string) (string, error) {
	p := strings.ToLower(strings.TrimSpace(s))
	p = strings.TrimPrefix(p, "sha256:")
	p = strings.TrimPrefix(p, "sha256/")
	p = strings.ReplaceAll(p, ":", "")
	if len(p) != sha256.Size*2 {
		return "", fmt.Errorf("fingerprint %q: want %d hex digits of a SHA-256 fingerprint, got %d", s, sha256.Size*2, len(p))
	}
	if _, err := hex.DecodeString(p); err != nil {
		return "", fmt.Errorf("fingerprint %q: %w", s, err)
	}
	return p, nil
}
