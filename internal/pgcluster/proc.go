package pgcluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// dirPrefix starts the name of every cluster's temporary directory, so
// sweepStale can find the ones left behind by killed test processes.
const dirPrefix = "pgtest-"

// ownerFile, inside a cluster's directory, records the pid and start time
// of the process that created it.
const ownerFile = "owner"

// serverUser is the system user that initdb and postgres run as when this
// process is root; Debian's postgresql package creates it.
const serverUser = "postgres"

// serverCredential returns the credential to run PostgreSQL with: nil when
// not root (run as ourselves), the postgres user's when root, since initdb
// and postgres refuse to run as root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(serverUser)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root needs a %q system user to run PostgreSQL: %w", serverUser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: uid of %q: %w", serverUser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: gid of %q: %w", serverUser, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// tempBase returns the directory to create cluster directories in:
// os.TempDir(), unless the server runs as another user that cannot
// traverse it, in which case /tmp.
func tempBase(cred *syscall.Credential) (string, error) {
	base := os.TempDir()
	if cred == nil {
		return base, nil
	}
	for _, cand := range []string{base, "/tmp"} {
		if traversableByOthers(cand) {
			return cand, nil
		}
	}
	return "", fmt.Errorf("pgcluster: neither %s nor /tmp is traversable by the %q user", base, serverUser)
}

// traversableByOthers reports whether dir and every parent have the
// others-execute bit, so a different user can reach paths below dir.
func traversableByOthers(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if p == filepath.Dir(p) {
			return true
		}
	}
}

// writeOwner records this process in dir so a later sweepStale can tell
// whether the creator is still alive.
func writeOwner(dir string) error {
	pid := os.Getpid()
	start, err := procStartTime(pid)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	content := fmt.Sprintf("%d %s\n", pid, start)
	// Write then rename, so a concurrent sweepStale never reads a
	// half-written file.
	tmp := filepath.Join(dir, ownerFile+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return fmt.Errorf("pgcluster: write owner file: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ownerFile)); err != nil {
		return fmt.Errorf("pgcluster: write owner file: %w", err)
	}
	return nil
}

// procStartTime returns the start time (in clock ticks since boot) of pid
// from /proc, which together with the pid identifies a process even if
// the pid is later reused.
func procStartTime(pid int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", fmt.Errorf("read process stat: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", errors.New("malformed /proc stat")
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); start time is field 22.
	if len(fields) < 20 {
		return "", errors.New("short /proc stat")
	}
	return fields[19], nil
}

// ownerAlive reports whether the process recorded in a cluster directory's
// owner file still runs. A missing or unreadable owner file counts as alive
// while the directory is young, since its creator may be about to write it.
func ownerAlive(dir string) bool {
	young := func() bool {
		fi, err := os.Stat(dir)
		return err == nil && time.Since(fi.ModTime()) < 10*time.Minute
	}
	data, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return young()
	}
	var pid int
	var start string
	if _, err := fmt.Sscanf(string(data), "%d %s", &pid, &start); err != nil {
		return young()
	}
	now, err := procStartTime(pid)
	return err == nil && now == start
}

// sweepStale removes cluster directories in base whose creating process
// has died without calling Stop (a test binary killed by a timeout, for
// example), so repeated runs do not fill the disk. A postmaster still
// running from such a directory is sent an immediate shutdown and its
// directory is left for a later sweep. Failures are logged, not returned.
func sweepStale(base string, log *slog.Logger) {
	dirs, err := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
	if err != nil {
		return
	}
	for _, dir := range dirs {
		if ownerAlive(dir) {
			continue
		}
		if pid, ok := runningPostmaster(filepath.Join(dir, "data")); ok {
			log.Warn("pgcluster: stopping orphaned postgres", "pid", pid, "dir", dir)
			_ = syscall.Kill(pid, syscall.SIGQUIT)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("pgcluster: remove stale cluster dir", "dir", dir, "err", err)
			continue
		}
		log.Debug("pgcluster: removed stale cluster dir", "dir", dir)
	}
}

// runningPostmaster returns the pid in dataDir's postmaster.pid if that
// process is alive and is a postgres process.
func runningPostmaster(dataDir string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, false
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "postgres") {
		return 0, false
	}
	return pid, true
}
