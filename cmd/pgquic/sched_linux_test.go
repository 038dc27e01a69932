//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// realtimeChildEnv makes the test binary the child of TestEnterRealtime:
// real-time scheduling is process-wide, so the test process itself, which
// shares the machine with other packages' tests, never enters it.
const realtimeChildEnv = "PGQUIC_TEST_REALTIME_CHILD"

// TestEnterRealtime: every thread of the process moves to SCHED_RR, threads
// started afterwards and child processes inherit it; without the privilege
// it fails with EPERM and changes nothing.
func TestEnterRealtime(t *testing.T) {
	if os.Getenv(realtimeChildEnv) == "1" {
		realtimeChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestEnterRealtime$", "-test.count=1")
	cmd.Env = append(os.Environ(), realtimeChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	got := string(out)
	if unix.Geteuid() != 0 {
		if !strings.Contains(got, "refused: ") || !strings.Contains(got, "threads normal: all") {
			t.Fatalf("unprivileged: want a refusal and nothing changed:\n%s", got)
		}
		return
	}
	for _, want := range []string{"entered", "threads normal: none", "late thread: rr", "child process: rr"} {
		if !strings.Contains(got, want) {
			t.Errorf("child output lacks %q:\n%s", want, got)
		}
	}
}

// realtimeChild runs in the child: enter, then report each thread's policy,
// a thread started after, and a child process's.
func realtimeChild() {
	if err := enterRealtime(); err != nil {
		fmt.Printf("refused: %v (EPERM %v)\n", err, errors.Is(err, unix.EPERM))
	} else {
		fmt.Println("entered")
	}
	before := threadPolicies()
	// Threads the runtime starts afterwards: goroutines that hold their
	// thread in a blocking system call make it start new ones.
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 8 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			<-release
		})
	}
	var after map[int]uint32
	for range 100 {
		if after = threadPolicies(); len(after) >= len(before)+4 {
			break
		}
		ts := unix.Timespec{Nsec: 10_000_000}
		_ = unix.Nanosleep(&ts, nil)
	}
	close(release)
	wg.Wait()
	normal, late, lateRR := 0, 0, 0
	for tid, p := range after {
		if p != unix.SCHED_RR {
			normal++
		}
		if _, ok := before[tid]; !ok {
			late++
			if p == unix.SCHED_RR {
				lateRR++
			}
		}
	}
	switch normal {
	case 0:
		fmt.Println("threads normal: none")
	case len(after):
		fmt.Println("threads normal: all")
	default:
		fmt.Printf("threads normal: %d of %d\n", normal, len(after))
	}
	if late > 0 && lateRR == late {
		fmt.Println("late thread: rr")
	} else {
		fmt.Printf("late threads: %d, %d rr\n", late, lateRR)
	}
	out, err := exec.Command("/bin/sh", "-c", "cat /proc/self/sched | grep '^policy'").Output()
	if err == nil && strings.Contains(string(out), " 2") { // SCHED_RR is policy 2
		fmt.Println("child process: rr")
	} else {
		fmt.Printf("child process: %q %v\n", out, err)
	}
}

// threadPolicies maps each thread of this process to its scheduling policy.
func threadPolicies() map[int]uint32 {
	m := map[int]uint32{}
	ents, _ := os.ReadDir("/proc/self/task")
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := unix.SchedGetAttr(tid, 0); err == nil {
			m[tid] = p.Policy
		}
	}
	return m
}
