package pgauth

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/testca"
)

// TestEdgeTrustCA: a CA line trusts a chain that verifies against its CA
// for client authentication now and whose subject matches, the first
// matching line in file order wins, a fingerprint line beats CA lines, and
// every other certificate (another CA, expired, not yet valid, the wrong
// subject, no client-auth usage, a missing intermediate, self-signed with
// the right name) asserts nothing.
func TestEdgeTrustCA(t *testing.T) {
	caA, caB, caC := testca.New(t, "edge CA A"), testca.New(t, "edge CA B"), testca.New(t, "edge CA C")
	inter := caA.Intermediate(t, "edge CA A, region 2")
	corp := func(cn string) testca.Options { return testca.Named(cn, "Example Corp") }
	pinned := caA.Issue(t, corp("edge-1"))
	dir := t.TempDir()
	caA.WriteFile(t, dir, "a.pem")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	caB.WriteFile(t, filepath.Join(dir, "sub"), "b.pem")
	trustFile := filepath.Join(dir, "edges.txt")
	file := "# edges by CA\n" +
		"ca=a.pem cn=edge-1 app appdb\n" +
		`ca=a.pem subject="/^CN=edge-[0-9]+,O=Example Corp$" * *` + "\n" +
		"ca=" + filepath.Join(dir, "sub", "b.pem") + " cn=/^b- report *\n" +
		front.Fingerprint(pinned.Cert.Raw) + " pinned pinned_db\n"
	if err := os.WriteFile(trustFile, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	et, err := LoadEdgeTrust(trustFile)
	if err != nil {
		t.Fatal(err)
	}
	if et.Len() != 4 {
		t.Fatalf("Len = %d, want 4", et.Len())
	}
	withChain := inter.Issue(t, corp("edge-8"))
	noEKU := corp("edge-1")
	noEKU.NoExtKeyUsage = true
	serverOnly := corp("edge-1")
	serverOnly.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	expired, future := corp("edge-1"), corp("edge-1")
	expired.NotBefore, expired.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)
	future.NotBefore, future.NotAfter = time.Now().Add(time.Hour), time.Now().Add(48*time.Hour)
	selfSigned := testca.New(t, "edge-1")
	for _, tc := range []struct {
		name  string
		chain []*x509.Certificate
		line  int // 0: not trusted
	}{
		{"CN exact, first line wins", caA.Issue(t, corp("edge-1")).Chain, 2},
		{"subject regexp", caA.Issue(t, corp("edge-7")).Chain, 3},
		{"through an intermediate the edge sends", withChain.Chain, 3},
		{"intermediate not sent", withChain.Chain[:1], 0},
		{"relative CA path in another directory, CN regexp", caB.Issue(t, corp("b-west")).Chain, 4},
		{"fingerprint line beats the CA lines", pinned.Chain, 5},
		{"CA B does not cover line 2", caB.Issue(t, corp("edge-1")).Chain, 0},
		{"another CA", caC.Issue(t, corp("edge-1")).Chain, 0},
		{"expired", caA.Issue(t, expired).Chain, 0},
		{"not yet valid", caA.Issue(t, future).Chain, 0},
		{"server auth only", caA.Issue(t, serverOnly).Chain, 0},
		{"no extended key usage", caA.Issue(t, noEKU).Chain, 0},
		{"subject outside the regexp", caA.Issue(t, testca.Named("edge-9", "Other")).Chain, 0},
		{"CN compared exactly", caA.Issue(t, testca.Named("Edge-1")).Chain, 0},
		{"self-signed with the right name", []*x509.Certificate{selfSigned.Cert}, 0},
		{"the CA itself", []*x509.Certificate{caA.Cert}, 0},
		{"none", nil, 0},
	} {
		g, ok := et.Edge(tc.chain)
		switch {
		case tc.line == 0 && ok:
			t.Errorf("%s: trusted by line %d", tc.name, g.Line)
		case tc.line != 0 && (!ok || g.Line != tc.line):
			t.Errorf("%s: Edge = %+v, %v; want line %d", tc.name, g, ok, tc.line)
		}
	}
	g, _ := et.Edge(caA.Issue(t, corp("edge-1")).Chain)
	if g.CA != "a.pem" || g.CN.Text != "edge-1" || g.Subject != nil || !g.AllowsUser("app") || g.AllowsUser("other") || !g.AllowsDatabase("appdb") {
		t.Errorf("line 2's grant = %+v", g)
	}
	var none *EdgeTrust
	if _, ok := none.Edge(pinned.Chain); ok {
		t.Error("a nil table trusts")
	}
}

// TestEdgeTrustCABad: every malformed CA line, and a CA file that is
// missing or holds no certificate, is refused naming its line.
func TestEdgeTrustCABad(t *testing.T) {
	ca := testca.New(t, "edge CA")
	dir := t.TempDir()
	ca.WriteFile(t, dir, "a.pem")
	for name, content := range map[string]string{
		"garbage.pem": "not PEM at all\n",
		"key.pem":     "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
		"trail.pem":   string(ca.PEM()) + "junk\n",
		"broken.pem":  "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ line, want string }{
		{"ca=a.pem app db", "line 1: want ca=FILE subject=PATTERN|cn=PATTERN USERS DATABASES, got 3 fields"},
		{"ca=a.pem x=1 app db", `line 1: "x": unknown key`},
		{"ca=a.pem cn=x", "line 1: want ca=FILE subject=PATTERN|cn=PATTERN USERS DATABASES, got 2 fields"},
		{"ca=a.pem app * *", `line 1: "app": want key=value`},
		{"ca=a.pem subject=x * *", ""},
		{"ca=a.pem cn=x cn=y * *", "line 1: cn= given twice"},
		{"ca=a.pem ca=a.pem cn=x * *", "line 1: ca= given twice"},
		{"ca= cn=x * *", "line 1: ca: empty file name"},
		{"ca=a.pem cn= * *", "line 1: cn: empty pattern"},
		{`ca=a.pem cn="" * *`, "line 1: cn: empty pattern"},
		{"ca=a.pem cn=/( * *", "line 1: cn: pattern \"/(\": error parsing regexp"},
		{`ca=a.pem subject="CN=x * *`, "line 1: unterminated quote"},
		{"ca=a.pem cn=x app,,b *", "line 1: users: empty name"},
		{"ca=a.pem cn=x * db,*", `line 1: databases: "db,*": "*" stands alone`},
		{"ca=missing.pem cn=x * *", "line 1: ca missing.pem: open "},
		{"ca=garbage.pem cn=x * *", "line 1: ca garbage.pem: no PEM certificate"},
		{"ca=key.pem cn=x * *", `line 1: ca key.pem: PEM block 1 is "PRIVATE KEY", want CERTIFICATE`},
		{"ca=trail.pem cn=x * *", "line 1: ca trail.pem: text that is not PEM after the certificates"},
		{"ca=broken.pem cn=x * *", "line 1: ca broken.pem: certificate 1: x509: "},
		{"ca=a.pem cn=a\n" + "ca=a.pem cn=x * *", "line 1: want ca=FILE"},
		{"ca=a.pem cn=x * *\n" + "ca=garbage.pem cn=x * *", "line 2: ca garbage.pem"},
	} {
		path := filepath.Join(dir, "edges.txt")
		if err := os.WriteFile(path, []byte(tc.line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadEdgeTrust(path)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.line, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), path+": "+tc.want)):
			t.Errorf("%q: %v, want %q", tc.line, err, tc.want)
		}
	}
	if _, err := ParseEdgeTrust(strings.NewReader("ca=a.pem cn=x * *\n"), nil); err == nil || !strings.Contains(err.Error(), "no CA files can be read here") {
		t.Errorf("CA line without a reader: %v", err)
	}
}

// TestSplitQuoted: spaces and tabs split outside double quotes, "" is a
// quote inside them, and a quote may open in the middle of a field.
func TestSplitQuoted(t *testing.T) {
	for in, want := range map[string]string{
		`a  b	c`:                      "a|b|c",
		`subject="CN=edge 1,O=x" * *`: "subject=CN=edge 1,O=x|*|*",
		`cn="say ""hi""" x`:           `cn=say "hi"|x`,
		`cn="" x`:                     "cn=|x",
		`a"b c"d`:                     "ab cd",
	} {
		got, err := splitQuoted(in)
		if err != nil || strings.Join(got, "|") != want {
			t.Errorf("splitQuoted(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestEdgeTrustCACache: a verdict on a chain is kept only until a
// certificate's validity changes, so a certificate not yet valid is
// trusted from its NotBefore and not after its NotAfter, whatever was
// cached before.
func TestEdgeTrustCACache(t *testing.T) {
	ca := testca.New(t, "edge CA")
	base := time.Now()
	o := testca.Named("edge-1")
	o.NotBefore, o.NotAfter = base.Add(time.Hour), base.Add(2*time.Hour)
	chain := ca.Issue(t, o).Chain
	et, err := ParseEdgeTrust(strings.NewReader("ca=ca.pem cn=edge-1 * *\n"), func(string) ([]byte, error) { return ca.PEM(), nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		at   time.Duration // after base
		want bool
	}{
		{0, false},
		{time.Minute, false},
		{time.Hour + time.Second, true},
		{time.Hour + 2*time.Second, true},
		{2*time.Hour - time.Second, true},
		{2*time.Hour + time.Second, false},
	} {
		et.now = func() time.Time { return base.Add(tc.at) }
		if _, ok := et.Edge(chain); ok != tc.want {
			t.Errorf("at base+%v: trusted %v, want %v", tc.at, ok, tc.want)
		}
	}
	if n := len(et.verdicts.m); n != 1 {
		t.Errorf("%d verdicts cached for one chain", n)
	}
}

// BenchmarkEdgeTrustCA is what a CA line costs a new session: verify is
// one chain through an intermediate verified against the CA and its
// subject matched (a connection's first session), cached a later session
// of the same connection.
func BenchmarkEdgeTrustCA(b *testing.B) {
	ca := testca.New(b, "edge CA")
	chain := ca.Intermediate(b, "region").Issue(b, testca.Named("edge-1", "Example")).Chain
	et, err := ParseEdgeTrust(strings.NewReader("ca=ca.pem subject=\"/^CN=edge-[0-9]+,O=Example$\" * *\n"),
		func(string) ([]byte, error) { return ca.PEM(), nil })
	if err != nil {
		b.Fatal(err)
	}
	b.Run("verify", func(b *testing.B) {
		for b.Loop() {
			if et.verifyCA(chain, time.Now()) == nil {
				b.Fatal("not trusted")
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		for b.Loop() {
			if _, ok := et.Edge(chain); !ok {
				b.Fatal("not trusted")
			}
		}
	})
}

// TestCertSubject: the subject is written in the certificate's own RDN
// order, most specific first, as openssl's RFC 2253 form, not in the
// order Go's pkix.Name sorts attributes into.
func TestCertSubject(t *testing.T) {
	ca := testca.New(t, "edge CA")
	var (
		oidCN = asn1.ObjectIdentifier{2, 5, 4, 3}
		oidO  = asn1.ObjectIdentifier{2, 5, 4, 10}
	)
	for _, tc := range []struct {
		name pkix.Name
		want string
	}{
		{pkix.Name{CommonName: "edge-1", Organization: []string{"Example Corp"}, Country: []string{"DE"}}, "CN=edge-1,O=Example Corp,C=DE"},
		// Issued CN first: openssl -nameopt RFC2253 prints O=y,CN=x.
		{pkix.Name{ExtraNames: []pkix.AttributeTypeAndValue{{Type: oidCN, Value: "x"}, {Type: oidO, Value: "y"}}}, "O=y,CN=x"},
		{pkix.Name{CommonName: `a,b+c "d"`}, `CN=a\,b\+c \"d\"`},
	} {
		leaf := ca.Issue(t, testca.Options{Subject: tc.name}).Cert
		if got := CertSubject(leaf); got != tc.want {
			t.Errorf("CertSubject(%v) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
