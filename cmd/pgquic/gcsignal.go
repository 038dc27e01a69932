//go:build pgquic_gcsignal

package main

// Built only with the pgquic_gcsignal tag, which quicfront's memory test
// uses: SIGUSR1 runs two garbage collections. A server that has been idle
// for a few minutes has been through them (the runtime forces a collection
// every two minutes); each halves the stacks of goroutines using less than
// a quarter of theirs, and the scavenger then gives the freed pages back.
// The test measures that state without waiting minutes for it. Production
// binaries are built without the tag and do not catch SIGUSR1.

import (
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

func init() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	go func() {
		for range ch {
			runtime.GC()
			runtime.GC()
		}
	}()
}
