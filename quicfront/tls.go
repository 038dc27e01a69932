package quicfront

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"strings"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/pgproto"
)

// DefaultALPN is the ALPN protocol of the QUIC wire contract, version 1.
const DefaultALPN = pgproto.ALPN

// Fingerprint returns the hex SHA-256 of a DER certificate, the value a
// client pins with DialerConfig.PinSHA256 (and `pgquic edge --pin`).
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// normalizePin accepts a SHA-256 fingerprint in any of the spellings tools
// print (hex in either case, optional colons, optional "sha256:" prefix) and
// returns lower-case hex.
func normalizePin(pin string) (string, error) {
	p := strings.ToLower(strings.TrimSpace(pin))
	p = strings.TrimPrefix(p, "sha256:")
	p = strings.TrimPrefix(p, "sha256/")
	p = strings.ReplaceAll(p, ":", "")
	if len(p) != sha256.Size*2 {
		return "", fmt.Errorf("pin %q: want %d hex digits of a SHA-256 fingerprint, got %d", pin, sha256.Size*2, len(p))
	}
	if _, err := hex.DecodeString(p); err != nil {
		return "", fmt.Errorf("pin %q: %w", pin, err)
	}
	return p, nil
}

// ErrPinMismatch is returned (wrapped) by the TLS handshake when the server's
// certificate does not match DialerConfig.PinSHA256.
var ErrPinMismatch = errors.New("quicfront: server certificate does not match the pinned SHA-256 fingerprint")

// GenerateSelfSigned creates a throwaway ECDSA P-256 certificate valid for
// one year for the given host names and IP addresses, plus localhost and the
// loopback addresses. The server uses it when no certificate is configured;
// clients then pin its fingerprint.
func GenerateSelfSigned(hosts ...string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "pgquic self-signed"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	for _, h := range hosts {
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			if !ip.IsUnspecified() {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		} else if h != "localhost" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parse certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// statelessResetKey derives the QUIC stateless reset key from the server's
// private key. A restarted server with the same certificate then answers
// packets of connections it forgot with a stateless reset, so clients learn
// at once that their connection is gone instead of waiting for the idle
// timeout (RFC 9000, section 10.3). It returns nil when the key cannot be
// marshalled; stateless resets are then off.
func statelessResetKey(cert *tls.Certificate) *quic.StatelessResetKey {
	if cert == nil || cert.PrivateKey == nil {
		return nil
	}
	der, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return nil
	}
	h := sha256.New()
	h.Write([]byte("pgquic stateless reset key v1\x00"))
	h.Write(der)
	var key quic.StatelessResetKey
	copy(key[:], h.Sum(nil))
	return &key
}

// clientTLSConfig builds the client TLS configuration from exactly one
// verification mode (or an explicit override).
func clientTLSConfig(cfg DialerConfig, serverName string) (*tls.Config, error) {
	modes := 0
	if cfg.CAFile != "" {
		modes++
	}
	if cfg.PinSHA256 != "" {
		modes++
	}
	if cfg.Insecure {
		modes++
	}
	if modes > 1 {
		return nil, errors.New("quicfront: choose one of CAFile, PinSHA256 and Insecure")
	}
	if modes == 0 && cfg.TLSConfig == nil {
		return nil, errors.New("quicfront: no server verification: set CAFile, PinSHA256 or Insecure (or TLSConfig)")
	}
	var tc *tls.Config
	if cfg.TLSConfig != nil {
		tc = cfg.TLSConfig.Clone()
	} else {
		tc = &tls.Config{}
	}
	if tc.ServerName == "" {
		tc.ServerName = serverName
	}
	if len(tc.NextProtos) == 0 {
		tc.NextProtos = []string{cfg.ALPN}
	}
	if tc.MinVersion < tls.VersionTLS13 {
		tc.MinVersion = tls.VersionTLS13
	}
	switch {
	case cfg.CAFile != "":
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("quicfront: read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("quicfront: CA file %s holds no PEM certificate", cfg.CAFile)
		}
		tc.RootCAs = pool
	case cfg.PinSHA256 != "":
		pin, err := normalizePin(cfg.PinSHA256)
		if err != nil {
			return nil, fmt.Errorf("quicfront: %w", err)
		}
		// The pin replaces chain and name verification: the leaf itself is trusted.
		tc.InsecureSkipVerify = true
		tc.VerifyPeerCertificate = func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
			if len(rawCerts) == 0 {
				return ErrPinMismatch
			}
			if got := Fingerprint(rawCerts[0]); got != pin {
				return fmt.Errorf("%w: got %s", ErrPinMismatch, got)
			}
			return nil
		}
	case cfg.Insecure:
		tc.InsecureSkipVerify = true
	}
	return tc, nil
}
