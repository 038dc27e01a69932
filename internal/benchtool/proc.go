package benchtool

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgquic/pgquic/internal/spawn"
)

// clockTick is the unit of the utime/stime/cutime/cstime fields of
// /proc/PID/stat (USER_HZ, 100 on every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// stopGrace is how long a child gets after SIGINT before SIGKILL.
const stopGrace = 10 * time.Second

// spawner starts the tool's children from one locked OS thread (see
// internal/spawn), so their parent-death signal fires only when the tool
// dies.
type spawner struct {
	*spawn.Thread
}

// newSpawner starts the thread; close ends it.
func newSpawner() *spawner { return &spawner{spawn.New()} }

// close ends the spawner's thread. Call it after every child has exited.
func (s *spawner) close() { s.Close() }

// child is one running process the tool started.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done is closed
}

// start runs cmd on the spawner's thread with a parent-death signal and,
// when cred is not nil, as that user.
func (s *spawner) start(name string, cmd *exec.Cmd, cred *syscall.Credential) (*child, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred, Setpgid: true}
	var err error
	s.Do(func() { err = cmd.Start() })
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// pid is the child's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// exited reports whether the process has ended.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop asks the process to end with sig, then kills it after stopGrace,
// and waits for it.
func (c *child) stop(sig syscall.Signal) {
	if c.exited() {
		return
	}
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
	case <-time.After(stopGrace):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// rusageCPU is the user plus system CPU time of an exited child.
func (c *child) rusageCPU() time.Duration {
	if c.cmd.ProcessState == nil {
		return 0
	}
	return c.cmd.ProcessState.UserTime() + c.cmd.ProcessState.SystemTime()
}

// procStat holds the fields of /proc/PID/stat the tool reads.
type procStat struct {
	ppid     int
	self     time.Duration // utime + stime
	children time.Duration // cutime + cstime: exited, waited-for children
}

// readStat parses /proc/PID/stat. The command name may hold spaces and
// parentheses, so fields are counted from the last ')'.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); field n is f[n-3].
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var v [5]int64
	for k, idx := range []int{1, 11, 12, 13, 14} { // ppid, utime, stime, cutime, cstime
		if v[k], err = strconv.ParseInt(f[idx], 10, 64); err != nil {
			return procStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	return procStat{
		ppid:     int(v[0]),
		self:     time.Duration(v[1]+v[2]) * clockTick,
		children: time.Duration(v[3]+v[4]) * clockTick,
	}, nil
}

// taskCPU is the on-CPU time of every live thread of pid, summed from
// /proc/PID/task/*/schedstat (nanoseconds, unlike the 10 ms ticks of
// /proc/PID/stat). It falls back to /proc/PID/stat where schedstat is
// missing.
func taskCPU(pid int) (time.Duration, error) {
	dirs, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, d := range dirs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, d.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(fmt.Sprintf("/proc/%d/task/%s", pid, d.Name())); serr != nil {
				continue // the thread has exited
			}
			st, err := readStat(pid)
			return st.self, err
		}
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/task/%s/schedstat: %w", pid, d.Name(), err)
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}

// counters is a snapshot of one pooler process's resource counters.
type counters struct {
	cpu      time.Duration
	rwCalls  int64 // syscr + syscw from /proc/PID/io
	switches int64 // voluntary + nonvoluntary context switches of every thread
}

// readCounters samples pid's CPU, read/write system calls and context
// switches.
func readCounters(pid int) (counters, error) {
	var c counters
	var err error
	if c.cpu, err = taskCPU(pid); err != nil {
		return c, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return c, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "syscr" || k == "syscw") {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return c, fmt.Errorf("/proc/%d/io: %w", pid, err)
			}
			c.rwCalls += n
		}
	}
	paths, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		return c, err
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread has exited
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return c, fmt.Errorf("%s: %w", p, err)
				}
				c.switches += n
			}
		}
	}
	return c, nil
}

// childPids lists the children of pid, from /proc/PID/task/*/children
// (each thread lists the children it forked) when the kernel has them, else
// by scanning every process's parent.
func childPids(pid int) ([]int, error) {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if len(files) > 0 {
		var out []int
		for _, file := range files {
			b, err := os.ReadFile(file)
			if err != nil {
				continue // the thread has exited
			}
			for _, f := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(f); err == nil {
					out = append(out, n)
				}
			}
		}
		return out, nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := readStat(n); err == nil && st.ppid == pid {
			out = append(out, n)
		}
	}
	return out, nil
}

// clusterCPU is the CPU time of a PostgreSQL cluster: the postmaster, its
// live children (backends and background processes) and, through the
// postmaster's cutime and cstime, every child that has exited since the
// server started. The difference of two samples is the cluster's CPU in
// between, whether backends came, went or stayed. exclude names live
// children left out (the tool's own monitoring backend).
func clusterCPU(postmaster int, exclude ...int) (time.Duration, error) {
	kids, err := childPids(postmaster)
	if err != nil {
		return 0, err
	}
	sum, err := taskCPU(postmaster)
	if err != nil {
		return 0, fmt.Errorf("postmaster %d: %w", postmaster, err)
	}
next:
	for _, k := range kids {
		for _, x := range exclude {
			if k == x {
				continue next
			}
		}
		if t, err := taskCPU(k); err == nil {
			sum += t
		}
	}
	st, err := readStat(postmaster)
	if err != nil {
		return 0, err
	}
	return sum + st.children, nil
}

// postmasterPid reads the first line of DATADIR/postmaster.pid.
func postmasterPid(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("read postmaster.pid: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %w", err)
	}
	return pid, nil
}
