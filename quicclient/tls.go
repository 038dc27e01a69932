package quicclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/quicwire"
)

// Fingerprint returns the hex SHA-256 of a DER certificate, the value a
// client pins with DialerConfig.PinSHA256 (and `pgquic edge --pin`). A
// server with a generated certificate logs the same value at start.
func Fingerprint(der []byte) string { return quicwire.Fingerprint(der) }

// normalizePin accepts a SHA-256 fingerprint in any of the spellings tools
// print and returns lower-case hex (front.ParseFingerprint, which the
// pooler's edge-trust file uses too).
func normalizePin(pin string) (string, error) {
	p, err := front.ParseFingerprint(pin)
	if err != nil {
		return "", fmt.Errorf("pin: %w", err)
	}
	return p, nil
}

// ErrPinMismatch is returned (wrapped) by the TLS handshake when the server's
// certificate does not match DialerConfig.PinSHA256.
var ErrPinMismatch = errors.New("quicclient: server certificate does not match the pinned SHA-256 fingerprint")

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
		return nil, errors.New("quicclient: choose one of CAFile, PinSHA256 and Insecure")
	}
	if modes == 0 && cfg.TLSConfig == nil {
		return nil, errors.New("quicclient: no server verification: set CAFile, PinSHA256 or Insecure (or TLSConfig)")
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
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("quicclient: CertFile and KeyFile go together")
	}
	if cfg.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("quicclient: client certificate: %w", err)
		}
		tc.Certificates = append([]tls.Certificate{cert}, tc.Certificates...)
	}
	switch {
	case cfg.CAFile != "":
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("quicclient: read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("quicclient: CA file %s holds no PEM certificate", cfg.CAFile)
		}
		tc.RootCAs = pool
	case cfg.PinSHA256 != "":
		pin, err := normalizePin(cfg.PinSHA256)
		if err != nil {
			return nil, fmt.Errorf("quicclient: %w", err)
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
