package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestStartRunProfile checks that each run's profile lands in its own file,
// named with the run's label before the extension, and holds a profile once
// stopped; without a path nothing is written.
func TestStartRunProfile(t *testing.T) {
	dir := t.TempDir()
	for _, label := range []string{"tcp+tls", "quic"} {
		stop, err := startRunProfile(filepath.Join(dir, "ramp.pprof"), label)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		stop()
	}
	for _, name := range []string{"ramp.tcp+tls.pprof", "ramp.quic.pprof"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() == 0 {
			t.Errorf("%s is empty", name)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ramp.pprof")); !os.IsNotExist(err) {
		t.Errorf("ramp.pprof itself was written (err %v)", err)
	}

	stop, err := startRunProfile("", "quic")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if _, err := startRunProfile(filepath.Join(dir, "missing", "ramp.pprof"), "quic"); err == nil {
		t.Error("a profile in a directory that does not exist started")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("%d files in the directory, want the 2 profiles", len(entries))
	}
}
