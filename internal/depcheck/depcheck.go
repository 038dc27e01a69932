// Package depcheck lets a test assert what a package must not depend on, so
// that layering rules (the QUIC client never reaches the pooler, the binary
// never links the test framework) fail a test instead of a review. Only
// tests import it.
package depcheck

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Deps returns the packages pkg depends on, itself included, as `go list
// -deps` reports them (test-only imports are not included).
func Deps(t testing.TB, pkg string) []string {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goBin, "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// Forbid fails the test for every package pkg depends on that is one of
// forbidden or lies below one of them.
func Forbid(t testing.TB, pkg string, forbidden ...string) {
	t.Helper()
	for _, dep := range Deps(t, pkg) {
		for _, bad := range forbidden {
			if dep == bad || strings.HasPrefix(dep, bad+"/") {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}
