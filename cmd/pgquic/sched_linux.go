//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// realtimePriority is the SCHED_RR priority the ramp asks for: the lowest,
// enough to run ahead of every time-shared task without competing with the
// kernel's own real-time threads.
const realtimePriority = 1

// enterRealtime moves every thread of this process to real-time
// round-robin scheduling. Threads the Go runtime starts later, and child
// processes (the WAN emulators, a throwaway PostgreSQL), inherit it from
// the thread that creates them. The kernel's real-time throttling
// (sched_rt_runtime_us, 95% by default) still leaves the rest of the
// machine a share of each second. It fails, changing nothing, where the
// process lacks CAP_SYS_NICE or an RLIMIT_RTPRIO allowance.
func enterRealtime() error {
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_RR, Priority: realtimePriority}
	// The runtime may start a thread while the list is read: go round
	// until a pass finds nothing left to move.
	done := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("list threads: %w", err)
		}
		moved := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			if err := unix.SchedSetAttr(tid, &attr, 0); err != nil {
				if errors.Is(err, unix.ESRCH) {
					continue // the thread exited
				}
				return fmt.Errorf("sched_setattr SCHED_RR %d: %w", realtimePriority, err)
			}
			done[tid] = true
			moved++
		}
		if moved == 0 {
			return nil
		}
	}
	return nil
}
