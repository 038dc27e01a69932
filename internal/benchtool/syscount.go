package benchtool

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// perfEvent counts every system call entry. /proc/PID/io's syscr and syscw
// count only the read and write families: recv, send, recvmsg and sendmsg,
// which PgBouncer uses, do not move them, so comparing poolers needs a
// count of all system calls.
const perfEvent = "raw_syscalls:sys_enter"

// perfUsable reports whether `perf stat` can count system calls here
// (perf installed, tracepoints readable: root or a low perf_event_paranoid).
func perfUsable() (string, bool) {
	bin, err := exec.LookPath("perf")
	if err != nil {
		return "", false
	}
	out, err := exec.Command(bin, "stat", "-x", ",", "-e", perfEvent, "--", "true").CombinedOutput()
	if err != nil {
		return "", false
	}
	_, err = parsePerf(string(out))
	return bin, err == nil
}

// parsePerf reads the count from `perf stat -x ,` output.
func parsePerf(out string) (int64, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) >= 3 && f[2] == perfEvent {
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("perf: count %q: %w", f[0], err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("perf: no %s line in %q", perfEvent, tail(out, 5))
}

// perfCounter is a running `perf stat` attached to one process.
type perfCounter struct {
	c   *child
	out string
}

// startPerf attaches perf to every thread of pid and waits until its
// counters are open (one perf_event file per thread), so the count covers
// the whole run.
func (e *env) startPerf(ctx context.Context, pid int, name string) (*perfCounter, error) {
	out := filepath.Join(e.workDir, name+".perf")
	cmd := exec.Command(e.perfBin, "stat", "-x", ",", "-e", perfEvent, "-p", strconv.Itoa(pid), "-o", out)
	c, err := e.spawn.start("perf", cmd, nil)
	if err != nil {
		return nil, err
	}
	threads, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	deadline := time.Now().Add(5 * time.Second)
	for countPerfFds(c.pid()) < len(threads) {
		if c.exited() || time.Now().After(deadline) || ctx.Err() != nil {
			c.stop(syscall.SIGINT)
			return nil, fmt.Errorf("perf stat -p %d did not attach", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return &perfCounter{c: c, out: out}, nil
}

// countPerfFds counts the perf_event descriptors pid holds open.
func countPerfFds(pid int) int {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.Contains(l, "perf_event") {
			n++
		}
	}
	return n
}

// stop ends perf and returns the system calls it counted.
func (p *perfCounter) stop() (int64, error) {
	p.c.stop(syscall.SIGINT)
	b, err := os.ReadFile(p.out)
	if err != nil {
		return 0, err
	}
	return parsePerf(string(b))
}

// straceRow is one line of `strace -c`: a system call and its count.
type straceRow struct {
	name  string
	calls int64
}

// parseStrace reads the table `strace -c` writes, skipping the header,
// rules and the total line.
func parseStrace(out string) []straceRow {
	var rows []straceRow
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || f[len(f)-1] == "total" || f[len(f)-1] == "syscall" {
			continue
		}
		if _, err := strconv.ParseFloat(f[0], 64); err != nil {
			continue
		}
		// % time, seconds, usecs/call, calls, [errors,] syscall
		calls, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			continue
		}
		rows = append(rows, straceRow{name: f[len(f)-1], calls: calls})
	}
	return rows
}
