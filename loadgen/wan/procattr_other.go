//go:build !linux

package wan

import "os/exec"

// setParentDeathSignal has no portable equivalent outside Linux.
func setParentDeathSignal(*exec.Cmd) {}
