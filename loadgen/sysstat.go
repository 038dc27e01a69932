package loadgen

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// ProcSample is one reading of this process's resource use: what the load
// generator itself costs, so a run can tell whether the client ran out of
// CPU or memory before the server did. The figures are process-wide: when
// the pooler runs in the same process, they include it.
type ProcSample struct {
	// CPU is the user plus system CPU time consumed since the process
	// started (getrusage).
	CPU time.Duration
	// RSS is the resident set size in bytes (VmRSS in /proc/self/status);
	// 0 where /proc is missing.
	RSS int64
	// PeakRSS is the highest resident set size so far (VmHWM).
	PeakRSS int64
	// FDs is the number of open file descriptors (entries of /proc/self/fd);
	// 0 where /proc is missing.
	FDs int
}

// SampleProc reads the current process's CPU time, memory and open file
// descriptors. Figures it cannot read are left zero.
func SampleProc() ProcSample {
	var s ProcSample
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		s.RSS = statusKB(b, "VmRSS:")
		s.PeakRSS = statusKB(b, "VmHWM:")
	}
	if f, err := os.Open("/proc/self/fd"); err == nil {
		// Counted in chunks so a process with thousands of sockets does not
		// allocate them all at once; the directory's own descriptor is not
		// counted.
		n := 0
		for {
			names, err := f.Readdirnames(1024)
			n += len(names)
			if err != nil || len(names) == 0 {
				break
			}
		}
		_ = f.Close()
		s.FDs = max(n-1, 0)
	}
	return s
}

// statusKB returns the value in bytes of a "Name:   123 kB" line of
// /proc/self/status, or 0.
func statusKB(status []byte, name string) int64 {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte(name)) {
			continue
		}
		f := bytes.Fields(line[len(name):])
		if len(f) == 0 {
			return 0
		}
		v, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return 0
		}
		return v * 1024
	}
	return 0
}
