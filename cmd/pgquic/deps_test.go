package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestBinaryDoesNotLinkTesting keeps the test framework out of the
// production binary: the throwaway PostgreSQL it starts comes from
// internal/pgcluster, not from the test helpers in internal/pgtest.
func TestBinaryDoesNotLinkTesting(t *testing.T) {
	deps := goListDeps(t, "github.com/pgquic/pgquic/cmd/pgquic")
	for _, bad := range []string{"testing", "github.com/pgquic/pgquic/internal/pgtest"} {
		if deps[bad] {
			t.Errorf("cmd/pgquic depends on %s", bad)
		}
	}
}

// goListDeps returns the packages pkg depends on, itself included.
func goListDeps(t *testing.T, pkg string) map[string]bool {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	out, err := exec.Command(goBin, "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	deps := make(map[string]bool)
	for _, line := range strings.Fields(string(out)) {
		deps[line] = true
	}
	return deps
}
