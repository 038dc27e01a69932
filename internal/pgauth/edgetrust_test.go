package pgauth

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
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
	if _, err := ParseEdgeTrust(strings.NewReader(file)); err == nil {
		t.Fatal("a line with four fields parsed")
	}
	file = "# edges\n\n" + fpA + "\tapp,report  *\n  SHA256:" + strings.Join(colons, ":") + " * app_db,pgquic\n"
	et, err := ParseEdgeTrust(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if et.Len() != 2 {
		t.Fatalf("Len = %d, want 2", et.Len())
	}
	a, ok := et.Edge(fpA)
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
	b, ok := et.Edge(fpB)
	if !ok || !b.AllowsUser("anyone") || !b.AllowsDatabase("app_db") || b.AllowsDatabase("other") || !b.ListsDatabase("pgquic") {
		t.Errorf("Edge(B) = %+v, %v", b, ok)
	}
	for _, fp := range []string{"", strings.ToUpper(fpA), fpA[:63] + "0"} {
		if _, ok := et.Edge(fp); ok {
			t.Errorf("Edge(%q) trusted", fp)
		}
	}
	var none *EdgeTrust
	if _, ok := none.Edge(fpA); ok || none.Len() != 0 {
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
		_, err := ParseEdgeTrust(strings.NewReader(tc.file))
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

// FuzzParseEdgeTrust checks that no file makes the parser panic and that
// every grant it returns names its certificate in Fingerprint's spelling
// and no empty or "*" name.
func FuzzParseEdgeTrust(f *testing.F) {
	f.Add([]byte("# c\n" + fpA + " app,report *\n"))
	f.Add([]byte("sha256:" + fpB + "\t*\tdb1,db2\r\n\n"))
	f.Add([]byte(fpA + " * *\n" + fpA + " * *\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		et, err := ParseEdgeTrust(bytes.NewReader(data))
		if err != nil {
			return
		}
		for fp, g := range et.edges {
			if g.Fingerprint != fp || len(fp) != 64 || strings.ToLower(fp) != fp {
				t.Fatalf("grant %+v under %q", g, fp)
			}
			if slices.Contains(g.Users, "") || slices.Contains(g.Users, "*") || slices.Contains(g.Databases, "") || slices.Contains(g.Databases, "*") {
				t.Fatalf("grant %+v holds an empty or wildcard name", g)
			}
		}
	})
}
