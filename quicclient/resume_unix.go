//go:build unix

package quicclient

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// checkCacheFile refuses a session cache file that another user owns or
// that others may read or write: whoever writes it can plant a session
// that resumes without any check of the server's certificate (the client
// trusts what the file says it verified), so a man in the middle could
// pose as the pooler; whoever reads it can resume as this client.
func checkCacheFile(fi fs.FileInfo) error {
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("mode %#o lets other users read or write it (want 0600)", perm)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("owned by uid %d, not this process's %d", st.Uid, os.Geteuid())
	}
	return nil
}
