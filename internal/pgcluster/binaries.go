package pgcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ErrNoBinaries is returned (wrapped) by Binaries and Start when no PostgreSQL
// server binaries can be found, so callers such as New can tell "PostgreSQL is
// not installed" apart from "PostgreSQL failed to start".
var ErrNoBinaries = errors.New("pgcluster: PostgreSQL server binaries (initdb, postgres) not found")

// BinDirEnv names an environment variable that, when set, is the directory
// holding initdb and postgres; it overrides the search so a developer can
// pick one of several installed versions.
const BinDirEnv = "PGTEST_BINDIR"

// debianRoot is where Debian and Ubuntu install one directory per major
// version; the server binaries are deliberately kept off PATH there.
const debianRoot = "/usr/lib/postgresql"

// Binaries finds the directory holding initdb and postgres. It looks, in
// order, at $PGTEST_BINDIR, at initdb on PATH (following symlinks, because
// Debian's wrappers and hand-made links point into a versioned directory),
// and at /usr/lib/postgresql/*/bin, picking the highest major version. It
// returns an error wrapping ErrNoBinaries when none has both programs.
func Binaries() (dir string, err error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		if hasServerBinaries(d) {
			return d, nil
		}
		return "", fmt.Errorf("%w: $%s=%q lacks initdb or postgres", ErrNoBinaries, BinDirEnv, d)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		for _, cand := range []string{p, resolve(p)} {
			if d := filepath.Dir(cand); hasServerBinaries(d) {
				return d, nil
			}
		}
	}
	if d := highestDebianVersion(debianRoot); d != "" {
		return d, nil
	}
	return "", fmt.Errorf("%w: looked on PATH and under %s/*/bin", ErrNoBinaries, debianRoot)
}

// resolve follows symlinks, returning p itself when that fails.
func resolve(p string) string {
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		return p
	}
	return r
}

// hasServerBinaries reports whether dir holds executable initdb and postgres.
func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// highestDebianVersion returns root/<version>/bin for the highest numeric
// version directory that holds the server binaries, or "" if none does.
func highestDebianVersion(root string) string {
	entries, err := os.ReadDir(root)
	if err != nil {
		return ""
	}
	type cand struct {
		ver []int
		dir string
	}
	var cands []cand
	for _, e := range entries {
		ver, ok := parseVersion(e.Name())
		if !ok {
			continue
		}
		d := filepath.Join(root, e.Name(), "bin")
		if hasServerBinaries(d) {
			cands = append(cands, cand{ver, d})
		}
	}
	if len(cands) == 0 {
		return ""
	}
	sort.Slice(cands, func(i, j int) bool { return versionLess(cands[j].ver, cands[i].ver) })
	return cands[0].dir
}

// parseVersion parses "15" or "9.6" into its numeric parts.
func parseVersion(s string) ([]int, bool) {
	var out []int
	for _, part := range strings.Split(s, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil, false
		}
		out = append(out, n)
	}
	return out, len(out) > 0
}

// versionLess orders versions numerically, part by part.
func versionLess(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}
