package spawn

import (
	"os/exec"
	"syscall"
	"testing"
)

// TestDoStartsOnOneThread starts two children through one Thread with a
// parent-death signal; both run and exit normally.
func TestDoStartsOnOneThread(t *testing.T) {
	th := New()
	defer th.Close()
	for range 2 {
		cmd := exec.Command("true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		var err error
		th.Do(func() { err = cmd.Start() })
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
	}
}
