// Package testca issues X.509 certificates for tests: a CA, intermediates
// and client certificates with the subject, validity and key usage a test
// needs, so the edge-trust tests exercise real chains built with
// crypto/x509 and no fixture files. Only tests import it.
package testca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority: a self-signed root or an intermediate
// signed by its parent.
type CA struct {
	Cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	parent *CA // nil for a root
}

// New returns a fresh self-signed root CA named cn.
func New(t testing.TB, cn string) *CA {
	t.Helper()
	ca := &CA{}
	ca.Cert, ca.key = issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: cn},
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, nil)
	return ca
}

// Intermediate returns a CA named cn signed by ca.
func (ca *CA) Intermediate(t testing.TB, cn string) *CA {
	t.Helper()
	in := &CA{parent: ca}
	in.Cert, in.key = issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: cn},
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}, ca)
	return in
}

// PEM returns the CA's certificate as a PEM block, a CA file's content.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// WriteFile writes the CA's certificate as PEM to dir/name and returns the
// path.
func (ca *CA) WriteFile(t testing.TB, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Options shape a client certificate. The zero value is a client
// certificate valid from an hour ago for a day, for client
// authentication, with an empty subject.
type Options struct {
	// Subject is the certificate's subject.
	Subject pkix.Name
	// NotBefore and NotAfter default to an hour ago and a day from now.
	NotBefore, NotAfter time.Time
	// ExtKeyUsage defaults to client authentication; NoExtKeyUsage leaves
	// the extension out.
	ExtKeyUsage   []x509.ExtKeyUsage
	NoExtKeyUsage bool
}

// Named returns Options for a certificate whose subject is the common
// name cn and the organizations org.
func Named(cn string, org ...string) Options {
	return Options{Subject: pkix.Name{CommonName: cn, Organization: org}}
}

// Leaf is an issued certificate with its key and the chain up to (not
// including) the root.
type Leaf struct {
	Cert  *x509.Certificate
	Chain []*x509.Certificate // Cert, then each intermediate
	Key   *ecdsa.PrivateKey
}

// Issue returns a certificate signed by ca, shaped by o.
func (ca *CA) Issue(t testing.TB, o Options) *Leaf {
	t.Helper()
	tmpl := &x509.Certificate{Subject: o.Subject, NotBefore: o.NotBefore, NotAfter: o.NotAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: o.ExtKeyUsage}
	if tmpl.ExtKeyUsage == nil && !o.NoExtKeyUsage {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	l := &Leaf{}
	l.Cert, l.Key = issue(t, tmpl, ca)
	l.Chain = []*x509.Certificate{l.Cert}
	for c := ca; c.parent != nil; c = c.parent {
		l.Chain = append(l.Chain, c.Cert)
	}
	return l
}

// TLS returns the leaf as a tls.Certificate presenting its whole chain.
func (l *Leaf) TLS() tls.Certificate {
	c := tls.Certificate{PrivateKey: l.Key, Leaf: l.Cert}
	for _, x := range l.Chain {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c
}

// WriteFiles writes the chain (leaf first) and the key as PEM files into
// dir, named base.crt and base.key, and returns their paths.
func (l *Leaf) WriteFiles(t testing.TB, dir, base string) (certFile, keyFile string) {
	t.Helper()
	var chain []byte
	for _, c := range l.Chain {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	der, err := x509.MarshalPKCS8PrivateKey(l.Key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
	if err := os.WriteFile(certFile, chain, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// issue creates a certificate from tmpl with a fresh P-256 key, signed by
// parent or, when parent is nil, by itself.
func issue(t testing.TB, tmpl *x509.Certificate, parent *CA) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.Cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}
