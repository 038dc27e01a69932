package wan

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal asks the kernel to SIGTERM the child if this process
// dies, so no relay outlives the run that started it.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
