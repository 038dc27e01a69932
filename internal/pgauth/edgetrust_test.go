package pgauth

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pgquic/pgquic/internal/testca"
)

const (
	fpA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	fpB = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
)

// TestParseEdgeTrust: the spellings a file may use, what each grant
// allows, and that a certificate not listed (or none) gets nothing.
func TestParseEdgeTrust(t *testing.T) {
	var colons []string
	for i := 0; i < len(fpB); i += 2 {
		colons = append(colons, strings.ToUpper(fpB[i:i+2]))
	}
	file := "# edges\n\n" + fpA + "\tapp,report  *\n  SHA256:" + strings.Join(colons, ":") + " * app_db,pgquic # trailing words are not comments\n"
	if _, err := ParseEdgeTrust(strings.NewReader(file), nil); err == nil {
		t.Fatal("a line with four fields parsed")
	}
	file = "# edges\n\n" + fpA + "\tapp,report  *\n  SHA256:" + strings.Join(colons, ":") + " * app_db,pgquic\n"
	et, err := ParseEdgeTrust(strings.NewReader(file), nil)
	if err != nil {
		t.Fatal(err)
	}
	if et.Len() != 2 {
		t.Fatalf("Len = %d, want 2", et.Len())
	}
	a, ok := et.byFingerprint(fpA)
	if !ok || a.Line != 3 {
		t.Fatalf("Edge(A) = %+v, %v", a, ok)
	}
	for _, tc := range []struct {
		g        *EdgeGrant
		user, db string
		uOK, dOK bool
	}{
		{a, "app", "anything", true, true},
		{a, "report", "x", true, true},
		{a, "App", "x", false, true}, // role names are case-sensitive
		{a, "other", "x", false, true},
	} {
		if got := tc.g.AllowsUser(tc.user); got != tc.uOK {
			t.Errorf("AllowsUser(%q) = %v", tc.user, got)
		}
		if got := tc.g.AllowsDatabase(tc.db); got != tc.dOK {
			t.Errorf("AllowsDatabase(%q) = %v", tc.db, got)
		}
	}
	if a.ListsDatabase("pgquic") {
		t.Error(`"*" lists the console`)
	}
	b, ok := et.byFingerprint(fpB)
	if !ok || !b.AllowsUser("anyone") || !b.AllowsDatabase("app_db") || b.AllowsDatabase("other") || !b.ListsDatabase("pgquic") {
		t.Errorf("Edge(B) = %+v, %v", b, ok)
	}
	for _, fp := range []string{"", strings.ToUpper(fpA), fpA[:63] + "0"} {
		if _, ok := et.byFingerprint(fp); ok {
			t.Errorf("Edge(%q) trusted", fp)
		}
	}
	var none *EdgeTrust
	if _, ok := none.byFingerprint(fpA); ok || none.Len() != 0 {
		t.Error("a nil table trusts")
	}
}

// TestParseEdgeTrustBad: every malformed line is refused, naming its line,
// so a typo never widens what an edge may do.
func TestParseEdgeTrustBad(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{fpA + " app\n", "line 1: want SHA256-FINGERPRINT USERS DATABASES, got 2 fields"},
		{"\n" + fpA[:62] + " * *\n", "line 2: fingerprint"},
		{strings.Replace(fpA, "0", "g", 1) + " * *\n", "line 1: fingerprint"},
		{fpA + " * *\n" + strings.ToUpper(fpA) + " app db\n", "line 2: certificate " + fpA + " already listed on line 1"},
		{fpA + " app,,x *\n", "line 1: users: empty name"},
		{fpA + " app, *\n", "line 1: users: empty name"},
		{fpA + " * db,*\n", `line 1: databases: "db,*": "*" stands alone`},
		{fpA + " * " + strings.Repeat("d", maxEdgeTrustLine) + "\n", "line 1: bufio.Scanner: token too long"},
	} {
		_, err := ParseEdgeTrust(strings.NewReader(tc.file), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseEdgeTrust(%.40q) = %v, want %q", tc.file, err, tc.want)
		}
	}
	if _, err := LoadEdgeTrust(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "edge trust") {
		t.Errorf("LoadEdgeTrust(missing) = %v", err)
	}
	path := filepath.Join(t.TempDir(), "edges")
	if err := os.WriteFile(path, []byte(fpA+" * * x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadEdgeTrust(path); err == nil || !strings.Contains(err.Error(), path+": line 1") {
		t.Errorf("LoadEdgeTrust(bad) = %v, want the path and line", err)
	}
}

// FuzzParseEdgeTrust checks that no file makes the parser panic, that
// every fingerprint grant names its certificate in Fingerprint's spelling,
// that every CA grant has its CA's certificates and a subject or CN
// pattern, and that no grant holds an empty or "*" name. CA lines may name
// ca.pem (a real CA) or bad.pem (not PEM); any other file does not exist.
func FuzzParseEdgeTrust(f *testing.F) {
	caPEM := testca.New(f, "fuzz CA").PEM()
	readCA := func(name string) ([]byte, error) {
		switch name {
		case "ca.pem":
			return caPEM, nil
		case "bad.pem":
			return []byte("not a certificate"), nil
		}
		return nil, fs.ErrNotExist
	}
	f.Add([]byte("# c\n" + fpA + " app,report *\n"))
	f.Add([]byte("sha256:" + fpB + "\t*\tdb1,db2\r\n\n"))
	f.Add([]byte(fpA + " * *\n" + fpA + " * *\n"))
	f.Add([]byte("ca=ca.pem cn=edge-1 app appdb\nca=ca.pem subject=\"/^CN=edge-[0-9]+,O=Example \"\"Co\"\"$\" * *\n"))
	f.Add([]byte("ca=bad.pem cn=x * *\nca=ca.pem cn=/( * *\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		et, err := ParseEdgeTrust(bytes.NewReader(data), readCA)
		if err != nil {
			return
		}
		for fp, g := range et.edges {
			if g.Fingerprint != fp || len(fp) != 64 || strings.ToLower(fp) != fp {
				t.Fatalf("grant %+v under %q", g, fp)
			}
			checkGrantNames(t, g)
		}
		for _, g := range et.byCA {
			if g.CA != "ca.pem" || g.roots == nil || (g.Subject == nil && g.CN == nil) || g.Fingerprint != "" {
				t.Fatalf("CA grant %+v", g)
			}
			checkGrantNames(t, g)
		}
	})
}

// checkGrantNames fails when a grant holds an empty or wildcard name.
func checkGrantNames(t *testing.T, g *EdgeGrant) {
	t.Helper()
	if slices.Contains(g.Users, "") || slices.Contains(g.Users, "*") || slices.Contains(g.Databases, "") || slices.Contains(g.Databases, "*") {
		t.Fatalf("grant %+v holds an empty or wildcard name", g)
	}
}
