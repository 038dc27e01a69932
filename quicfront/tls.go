package quicfront

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/pgproto"
)

// DefaultALPN is the ALPN protocol of the QUIC wire contract, version 1.
const DefaultALPN = pgproto.ALPN

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
