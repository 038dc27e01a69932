package pgauth

import (
	"bufio"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/pgquic/pgquic/internal/front"
)

// EdgeTrust is the pooler's table of trusted edges: QUIC client
// certificates, each allowed to open sessions for a set of users and
// databases without a password exchange. It is what PostgreSQL's cert
// method does for one user, for an edge that has authenticated its own
// local clients already (the edge's local startup). An edge is trusted by
// its certificate's SHA-256 fingerprint, or by a CA plus subject line: its
// chain verifies against that CA for client authentication and its subject
// matches, as pg_ident maps a certificate's name. A certificate matching no
// line asserts nothing: its sessions authenticate as any other client's.
// The zero value and nil trust no one; an EdgeTrust is never changed once
// built (but for its cache of chain verifications, which has its own
// lock), so sessions may read it concurrently and a reload swaps in a new
// one (with its CA files read again).
type EdgeTrust struct {
	edges map[string]*EdgeGrant
	byCA  []*EdgeGrant // CA plus subject lines, in file order
	// rootTimes are the validity bounds of every CA file's certificates
	// (see verdicts).
	rootTimes []time.Time
	verdicts  verdictCache
	// now is the clock chains are verified at; nil is time.Now (tests set
	// it to cross a certificate's validity bounds without waiting).
	now func() time.Time
}

// EdgeGrant is what one trusted edge may assert.
type EdgeGrant struct {
	// Fingerprint is the certificate's SHA-256, lower-case hex, for a
	// fingerprint line; "" for a CA line.
	Fingerprint string
	// CA is the CA file of a CA line as written in the file, "" for a
	// fingerprint line.
	CA string
	// Subject and CN are a CA line's patterns for the certificate's full
	// subject and its common name; nil when the line does not constrain it.
	Subject, CN *NamePattern
	// Users and Databases list the names allowed; nil means any ("*").
	Users, Databases []string
	// Line is the line of the file the grant came from, for logs.
	Line int

	roots *x509.CertPool // the CA file's certificates, for a CA line
}

// NamePattern is a CA line's test of a certificate name: an exact string,
// or, written with a leading "/", a regular expression (RE2 syntax),
// unanchored as pg_ident's are, so "/^edge-[0-9]+$" is anchored by its own
// ^ and $.
type NamePattern struct {
	// Text is the pattern as written, the "/" included.
	Text string
	re   *regexp.Regexp
}

// parseNamePattern compiles a subject= or cn= value.
func parseNamePattern(s string) (*NamePattern, error) {
	if s == "" {
		return nil, errors.New("empty pattern")
	}
	p := &NamePattern{Text: s}
	if rest, ok := strings.CutPrefix(s, "/"); ok {
		re, err := regexp.Compile(rest)
		if err != nil {
			return nil, fmt.Errorf("pattern %q: %w", s, err)
		}
		p.re = re
	}
	return p, nil
}

// Match reports whether name matches the pattern; a nil pattern matches
// any name.
func (p *NamePattern) Match(name string) bool {
	switch {
	case p == nil:
		return true
	case p.re != nil:
		return p.re.MatchString(name)
	default:
		return p.Text == name
	}
}

// AllowsUser reports whether the edge may open sessions for user. Names
// are compared exactly, as PostgreSQL compares role names.
func (g *EdgeGrant) AllowsUser(user string) bool {
	return g.Users == nil || slices.Contains(g.Users, user)
}

// AllowsDatabase reports whether the edge may open sessions on database.
func (g *EdgeGrant) AllowsDatabase(database string) bool {
	return g.Databases == nil || slices.Contains(g.Databases, database)
}

// ListsDatabase reports whether database is named in the grant, not only
// covered by "*". The pooler's admin console needs that: "*" is every
// database the edge's applications use, not the console.
func (g *EdgeGrant) ListsDatabase(database string) bool {
	return slices.Contains(g.Databases, database)
}

// Edge returns the grant of the client whose certificates these are (the
// chain it presented in its TLS handshake, leaf first, not yet verified:
// front.Peer.ClientCerts), or false when it is not a trusted edge. A
// fingerprint line naming the leaf wins; otherwise the first CA line, in
// file order, whose CA verifies the chain for client authentication now
// and whose patterns match the leaf's subject. The leaf must list client
// authentication in its extended key usage: a certificate without the
// extension, which x509 would take for any usage, asserts nothing here.
// The verdict on a chain is kept until the next moment a certificate in
// it or in a CA file becomes valid or expires (see verdictCache), so the
// sessions of one connection verify its chain once. It implements the
// pooler's EdgeTrust.
func (t *EdgeTrust) Edge(certs []*x509.Certificate) (*EdgeGrant, bool) {
	if t == nil || len(certs) == 0 || certs[0] == nil {
		return nil, false
	}
	if g, ok := t.byFingerprint(front.Fingerprint(certs[0].Raw)); ok {
		return g, true
	}
	if len(t.byCA) == 0 || !clientAuthUsage(certs[0]) {
		return nil, false
	}
	now := time.Now
	if t.now != nil {
		now = t.now
	}
	at := now()
	key := chainKey(certs)
	if g, ok := t.verdicts.get(key, at); ok {
		return g, g != nil
	}
	g := t.verifyCA(certs, at)
	t.verdicts.put(key, g, nextBound(at, certs, t.rootTimes))
	return g, g != nil
}

// verifyCA returns the first CA line that verifies certs at time at and
// whose patterns match the leaf, nil for none.
func (t *EdgeTrust) verifyCA(certs []*x509.Certificate, at time.Time) *EdgeGrant {
	leaf := certs[0]
	var inter *x509.CertPool
	if len(certs) > 1 {
		inter = x509.NewCertPool()
		for _, c := range certs[1:] {
			if c != nil {
				inter.AddCert(c)
			}
		}
	}
	verified := make(map[*x509.CertPool]bool, 1) // one Verify per CA file
	dn := CertSubject(leaf)
	for _, g := range t.byCA {
		if !g.Subject.Match(dn) || !g.CN.Match(leaf.Subject.CommonName) {
			continue
		}
		ok, seen := verified[g.roots]
		if !seen {
			_, err := leaf.Verify(x509.VerifyOptions{Roots: g.roots, Intermediates: inter, CurrentTime: at,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
			ok = err == nil
			verified[g.roots] = ok
		}
		if ok {
			return g
		}
	}
	return nil
}

// CertSubject returns c's subject as a CA line's subject= pattern sees
// it: RFC 2253's string form of the certificate's own RDN sequence, most
// specific first ("CN=edge-1,OU=edges,O=Example"), which is what
// `openssl x509 -noout -subject -nameopt RFC2253` prints for the usual
// attributes (CN, O, OU, C, ST, L, STREET, POSTALCODE, SERIALNUMBER);
// others are written as their OID and "#" with the hex of their DER value.
func CertSubject(c *x509.Certificate) string {
	var rdns pkix.RDNSequence
	if rest, err := asn1.Unmarshal(c.RawSubject, &rdns); err != nil || len(rest) > 0 {
		return c.Subject.String()
	}
	return rdns.String()
}

// clientAuthUsage reports whether c lists client authentication (or any
// usage) in its extended key usage.
func clientAuthUsage(c *x509.Certificate) bool {
	return slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth) || slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageAny)
}

// byFingerprint returns the grant of a fingerprint line.
func (t *EdgeTrust) byFingerprint(fingerprint string) (*EdgeGrant, bool) {
	if t == nil || fingerprint == "" {
		return nil, false
	}
	g, ok := t.edges[fingerprint]
	return g, ok
}

// Len reports how many edges (lines) the table trusts.
func (t *EdgeTrust) Len() int {
	if t == nil {
		return 0
	}
	return len(t.edges) + len(t.byCA)
}

// maxCAFile bounds a CA file, so a line naming a device or a huge file
// cannot exhaust memory.
const maxCAFile = 4 << 20

// LoadEdgeTrust reads an edge-trust file (see ParseEdgeTrust); a CA line's
// relative file name is taken relative to the edge-trust file's directory,
// as PostgreSQL takes pg_hba.conf's included files.
func LoadEdgeTrust(path string) (*EdgeTrust, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("edge trust: %w", err)
	}
	defer f.Close()
	dir := filepath.Dir(path)
	t, err := ParseEdgeTrust(f, func(name string) ([]byte, error) {
		if !filepath.IsAbs(name) {
			name = filepath.Join(dir, name)
		}
		ca, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer ca.Close()
		b, err := io.ReadAll(io.LimitReader(ca, maxCAFile+1))
		if err == nil && len(b) > maxCAFile {
			err = fmt.Errorf("%s: larger than %d bytes", name, maxCAFile)
		}
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("edge trust %s: %w", path, err)
	}
	return t, nil
}

// maxEdgeTrustLine bounds one line of an edge-trust file.
const maxEdgeTrustLine = 64 << 10

// ParseEdgeTrust reads one edge per line, in either of two forms, fields
// separated by spaces or tabs:
//
//	SHA256-FINGERPRINT USERS DATABASES
//	ca=FILE [subject=PATTERN] [cn=PATTERN] USERS DATABASES
//
// USERS and DATABASES are comma-separated names or "*" for any. The
// fingerprint may be spelled as tools print it (colons, either case, a
// "sha256:" prefix). A CA line trusts a certificate whose chain verifies
// against the PEM certificates of FILE (read with readCA; nil refuses CA
// lines) and whose subject, in RFC 2253 form ("CN=edge-1,O=Example"), and
// common name match the patterns (see NamePattern); it needs at least one
// of subject= and cn=, so a CA line never trusts everything its CA signed
// without saying so. A value holding spaces is written in double quotes, a
// quote inside as two ("CN=edge 1,O=Example ""Co"""). Blank lines and
// lines starting with '#' are skipped. A certificate listed twice, an
// empty name in a list, "*" mixed with names, or a CA file holding no
// certificate is an error, so a typo never widens what an edge may do.
func ParseEdgeTrust(r io.Reader, readCA func(name string) ([]byte, error)) (*EdgeTrust, error) {
	t := &EdgeTrust{edges: make(map[string]*EdgeGrant)}
	pools := make(map[string]*x509.CertPool) // CA file → its certificates, read once
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxEdgeTrustLine)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "ca=") {
			g, err := parseCALine(line, readCA, pools, &t.rootTimes)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			g.Line = n
			t.byCA = append(t.byCA, g)
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			return nil, fmt.Errorf("line %d: want SHA256-FINGERPRINT USERS DATABASES, got %d fields", n, len(fields))
		}
		fp, err := front.ParseFingerprint(fields[0])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if prev, dup := t.edges[fp]; dup {
			return nil, fmt.Errorf("line %d: certificate %s already listed on line %d", n, fp, prev.Line)
		}
		g := &EdgeGrant{Fingerprint: fp, Line: n}
		if g.Users, g.Databases, err = grantNames(fields[1], fields[2]); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		t.edges[fp] = g
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", n+1, err)
	}
	return t, nil
}

// parseCALine parses `ca=FILE [subject=PATTERN] [cn=PATTERN] USERS
// DATABASES`, reading FILE through pools (or readCA the first time, adding
// its certificates' validity bounds to rootTimes).
func parseCALine(line string, readCA func(string) ([]byte, error), pools map[string]*x509.CertPool, rootTimes *[]time.Time) (*EdgeGrant, error) {
	fields, err := splitQuoted(line)
	if err != nil {
		return nil, err
	}
	if len(fields) < 4 {
		return nil, fmt.Errorf("want ca=FILE subject=PATTERN|cn=PATTERN USERS DATABASES, got %d fields", len(fields))
	}
	g := &EdgeGrant{}
	for _, f := range fields[:len(fields)-2] {
		key, val, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want key=value before USERS DATABASES", f)
		}
		var dup bool
		switch key {
		case "ca":
			dup = g.CA != ""
			if val == "" {
				return nil, errors.New("ca: empty file name")
			}
			g.CA = val
		case "subject", "cn":
			p, err := parseNamePattern(val)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
			if key == "subject" {
				dup, g.Subject = g.Subject != nil, p
			} else {
				dup, g.CN = g.CN != nil, p
			}
		default:
			return nil, fmt.Errorf("%q: unknown key (ca, subject, cn)", key)
		}
		if dup {
			return nil, fmt.Errorf("%s= given twice", key)
		}
	}
	if g.Subject == nil && g.CN == nil {
		return nil, errors.New("a ca= line needs subject= or cn=")
	}
	if g.Users, g.Databases, err = grantNames(fields[len(fields)-2], fields[len(fields)-1]); err != nil {
		return nil, err
	}
	if g.roots = pools[g.CA]; g.roots == nil {
		if readCA == nil {
			return nil, fmt.Errorf("ca %s: no CA files can be read here", g.CA)
		}
		b, err := readCA(g.CA)
		if err != nil {
			return nil, fmt.Errorf("ca %s: %w", g.CA, err)
		}
		if g.roots, err = parseCAPEM(b, rootTimes); err != nil {
			return nil, fmt.Errorf("ca %s: %w", g.CA, err)
		}
		pools[g.CA] = g.roots
	}
	return g, nil
}

// parseCAPEM reads the CERTIFICATE blocks of a PEM file. A block that does
// not parse, anything but certificates, or no certificate at all is an
// error: a CA file that went wrong must not quietly trust fewer (or no)
// edges than the operator meant, nor more.
func parseCAPEM(b []byte, times *[]time.Time) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d is %q, want CERTIFICATE", n+1, blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", n+1, err)
		}
		pool.AddCert(c)
		*times = append(*times, validityBounds(c)...)
		n++
	}
	if n == 0 {
		return nil, errors.New("no PEM certificate")
	}
	if strings.TrimSpace(string(b)) != "" {
		return nil, errors.New("text that is not PEM after the certificates")
	}
	return pool, nil
}

// splitQuoted splits a line at spaces and tabs outside double quotes; a
// quoted part loses its quotes, and "" inside quotes is one quote.
func splitQuoted(line string) ([]string, error) {
	var fields []string
	var cur strings.Builder
	inField, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '"' && i+1 < len(line) && line[i+1] == '"':
			cur.WriteByte('"')
			i++
		case c == '"':
			quoted, inField = !quoted, true
		case !quoted && (c == ' ' || c == '\t'):
			if inField {
				fields = append(fields, cur.String())
				cur.Reset()
				inField = false
			}
		default:
			cur.WriteByte(c)
			inField = true
		}
	}
	if quoted {
		return nil, errors.New("unterminated quote")
	}
	if inField {
		fields = append(fields, cur.String())
	}
	return fields, nil
}

// grantNames parses a line's USERS and DATABASES fields.
func grantNames(users, databases string) (u, d []string, err error) {
	if u, err = nameList(users); err != nil {
		return nil, nil, fmt.Errorf("users: %w", err)
	}
	if d, err = nameList(databases); err != nil {
		return nil, nil, fmt.Errorf("databases: %w", err)
	}
	return u, d, nil
}

// nameList parses "*" (nil: any) or a comma-separated list of names.
func nameList(s string) ([]string, error) {
	if s == "*" {
		return nil, nil
	}
	names := strings.Split(s, ",")
	for _, name := range names {
		switch name {
		case "":
			return nil, fmt.Errorf("empty name in %q", s)
		case "*":
			return nil, fmt.Errorf("%q: \"*\" stands alone, for any name", s)
		}
	}
	return names, nil
}
