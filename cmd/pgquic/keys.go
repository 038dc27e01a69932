package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/config"
)

// minSecretLen is the least length, in bytes or characters, of a secret in
// a key file: 32 random hex characters are 128 bits, the strength of the
// AES keys they are turned into.
const minSecretLen = 32

// errShortSecret reports a secret in a key file shorter than minSecretLen.
var errShortSecret = fmt.Errorf("secret shorter than %d bytes (make one with `openssl rand -hex 32`)", minSecretLen)

// loadTicketKeys reads a TLS session-ticket keys file: one secret per line
// (blank lines and lines starting with # are skipped). Each secret is
// hashed into a 32-byte ticket key; the first line's key encrypts new
// tickets and every key decrypts, which is how crypto/tls rotates them
// (tls.Config.SetSessionTicketKeys). Replicas reading the same file accept
// each other's tickets, so a client resumes on any of them.
func loadTicketKeys(path string) ([][32]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("TLS session ticket keys: %w", err)
	}
	var keys [][32]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < minSecretLen {
			return nil, fmt.Errorf("TLS session ticket keys %s line %d: %w", path, n, errShortSecret)
		}
		keys = append(keys, sha256.Sum256([]byte("pgquic session ticket key v1\x00"+line)))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("TLS session ticket keys %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("TLS session ticket keys %s: %w", path, errors.New("no key in the file"))
	}
	return keys, nil
}

// loadResetKey reads a QUIC stateless-reset secret (the whole file, outer
// whitespace trimmed, so `openssl rand -hex 32 > file` and 32 raw random
// bytes both work) and hashes it into quic-go's 32-byte key. Replicas that
// read the same file can reset each other's connections.
func loadResetKey(path string) (*quic.StatelessResetKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("QUIC stateless reset key: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < minSecretLen {
		return nil, fmt.Errorf("QUIC stateless reset key %s: %w", path, errShortSecret)
	}
	h := sha256.New()
	h.Write([]byte("pgquic stateless reset key file v1\x00"))
	h.Write(b)
	var key quic.StatelessResetKey
	copy(key[:], h.Sum(nil))
	return &key, nil
}

// reloadTicketKeys reads next's session-ticket keys file again at every
// reload, so a rotation (a new first line, an old one dropped) takes
// effect without a restart. Keys set at start cannot be turned back into
// crypto/tls's automatic per-process keys, so removing the file from the
// configuration waits for a restart (moved from applied to restart).
// It returns nil keys when nothing is to be set.
func (s *server) reloadTicketKeys(prev, next *config.Config, applied, restart []string) ([][32]byte, []string, []string, error) {
	const key = "tls_session_ticket_keys_file"
	if next.TLSSessionTicketKeysFile == "" {
		if prev.TLSSessionTicketKeysFile != "" {
			applied = slices.DeleteFunc(applied, func(k string) bool { return k == key })
			restart = append(restart, key)
		}
		return nil, applied, restart, nil
	}
	if prev.TLSSessionTicketKeysFile == "" {
		// Per-process keys so far: the fronts' configurations were built
		// without the file; setting keys now works the same.
		if !slices.Contains(applied, key) {
			applied = append(applied, key)
		}
	}
	keys, err := loadTicketKeys(next.TLSSessionTicketKeysFile)
	if err != nil {
		return nil, nil, nil, err
	}
	return keys, applied, restart, nil
}

// setTicketKeys gives both fronts the ticket keys a reload read; nil does
// nothing.
func (s *server) setTicketKeys(keys [][32]byte) {
	if keys == nil {
		return
	}
	s.logger.Info("TLS session ticket keys set from the keys file", "keys", len(keys))
	if s.tcpTLS != nil {
		s.tcpTLS.SetSessionTicketKeys(keys)
	}
	if s.quic != nil {
		s.quic.SetSessionTicketKeys(keys)
	}
}
