//go:build pgquic_gcsignal

package main

// Built only with the pgquic_gcsignal tag, which quicfront's memory test
// uses: SIGUSR1 runs three garbage collections, then returns the free
// pages to the kernel. A server that has been idle for six minutes has
// been through as many collections (the runtime forces one every two
// minutes). Each halves the stacks of goroutines using less than a quarter
// of theirs (16 KiB, 8, then 4), and the stack pages a collection frees
// while it runs go back to the heap at the end of the next one. The
// runtime's background scavenger returns free pages at its own pace, down
// to about 10% over the heap goal, so how much of them a reading still
// saw varied from run to run by kibibytes per session; returning them all
// makes the reading what the server holds in use. The test measures that
// state without waiting minutes for it. Production binaries are built
// without the tag and do not catch SIGUSR1.

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
)

func init() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		for range ch {
			reportMemStats("before")
			for range 3 {
				runtime.GC()
			}
			debug.FreeOSMemory()
			reportMemStats("after")
		}
	}()
}

// reportMemStats writes the runtime's memory figures to stderr, so that the test
// can say which part of the process's RSS the collections gave back.
func reportMemStats(when string) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(os.Stderr, "pgquic memstats %s collections: stack_inuse=%d heap_inuse=%d heap_alloc=%d heap_idle=%d heap_released=%d goroutines=%d num_gc=%d\n",
		when, ms.StackInuse, ms.HeapInuse, ms.HeapAlloc, ms.HeapIdle, ms.HeapReleased, runtime.NumGoroutine(), ms.NumGC)
}
