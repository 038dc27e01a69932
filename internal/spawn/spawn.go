// Package spawn starts child processes from one OS thread that lives as
// long as its owner wants. Linux delivers a child's parent-death signal
// (Pdeathsig) when the thread that forked it exits, not the process; Go
// threads exit when a goroutine locked to them ends, so a child forked from
// an arbitrary goroutine could be killed while its parent still runs.
// Forking from this long-lived locked thread keeps the signal for the
// parent's real death. The test clusters (internal/pgcluster) and the
// benchmark tool (internal/benchtool) start their servers through it.
package spawn

import "runtime"

// Thread is a goroutine locked to one OS thread that runs the functions
// given to Do, one at a time.
type Thread struct {
	reqs chan func()
}

// New starts the locked goroutine. Close ends it.
func New() *Thread {
	t := &Thread{reqs: make(chan func())}
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for fn := range t.reqs {
			fn()
		}
	}()
	return t
}

// Do runs fn (typically an exec.Cmd's Start) on the thread and waits for it.
func (t *Thread) Do(fn func()) {
	done := make(chan struct{})
	t.reqs <- func() {
		defer close(done)
		fn()
	}
	<-done
}

// Close ends the thread's goroutine. Call it only once every child it
// started has exited, or their parent-death signal fires.
func (t *Thread) Close() { close(t.reqs) }
