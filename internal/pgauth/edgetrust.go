package pgauth

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/pgquic/pgquic/internal/front"
)

// EdgeTrust is the pooler's table of trusted edges: QUIC client
// certificates, by SHA-256 fingerprint, each allowed to open sessions for a
// set of users and databases without a password exchange. It is what
// PostgreSQL's cert method does for one user, for an edge that has
// authenticated its own local clients already (the edge's local startup).
// A certificate not in the table asserts nothing: its sessions authenticate
// as any other client's. The zero value and nil trust no one; an EdgeTrust
// is never changed once built, so sessions may read it concurrently and a
// reload swaps in a new one.
type EdgeTrust struct {
	edges map[string]*EdgeGrant
}

// EdgeGrant is what one trusted edge may assert.
type EdgeGrant struct {
	// Fingerprint is the certificate's SHA-256, lower-case hex.
	Fingerprint string
	// Users and Databases list the names allowed; nil means any ("*").
	Users, Databases []string
	// Line is the line of the file the grant came from, for logs.
	Line int
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

// Edge returns the grant of the certificate with this fingerprint
// (front.Fingerprint's spelling), or false when it is not a trusted edge.
// It implements the pooler's EdgeTrust.
func (t *EdgeTrust) Edge(fingerprint string) (*EdgeGrant, bool) {
	if t == nil || fingerprint == "" {
		return nil, false
	}
	g, ok := t.edges[fingerprint]
	return g, ok
}

// Len reports how many edges the table trusts.
func (t *EdgeTrust) Len() int {
	if t == nil {
		return 0
	}
	return len(t.edges)
}

// LoadEdgeTrust reads an edge-trust file (see ParseEdgeTrust).
func LoadEdgeTrust(path string) (*EdgeTrust, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("edge trust: %w", err)
	}
	defer f.Close()
	t, err := ParseEdgeTrust(f)
	if err != nil {
		return nil, fmt.Errorf("edge trust %s: %w", path, err)
	}
	return t, nil
}

// maxEdgeTrustLine bounds one line of an edge-trust file.
const maxEdgeTrustLine = 64 << 10

// ParseEdgeTrust reads one edge per line, `SHA256-FINGERPRINT USERS
// DATABASES`, fields separated by spaces or tabs; USERS and DATABASES are
// comma-separated names or "*" for any. The fingerprint may be spelled as
// tools print it (colons, either case, a "sha256:" prefix). Blank lines and
// lines starting with '#' are skipped. A certificate listed twice, an empty
// name in a list, or "*" mixed with names is an error, so a typo never
// widens what an edge may do.
func ParseEdgeTrust(r io.Reader) (*EdgeTrust, error) {
	t := &EdgeTrust{edges: make(map[string]*EdgeGrant)}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxEdgeTrustLine)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
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
		users, err := nameList(fields[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: users: %w", n, err)
		}
		dbs, err := nameList(fields[2])
		if err != nil {
			return nil, fmt.Errorf("line %d: databases: %w", n, err)
		}
		t.edges[fp] = &EdgeGrant{Fingerprint: fp, Users: users, Databases: dbs, Line: n}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", n+1, err)
	}
	return t, nil
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
