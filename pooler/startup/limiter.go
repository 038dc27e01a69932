package startup

import (
	"fmt"
	"sync"
)

// Limiter counts the sessions that have not finished authenticating, in
// all and per source, for the pooler's MaxStartingClients and
// MaxStartingPerSource. Until a client has authenticated it has proved
// nothing, so these counts are what keeps clients that connect and stay
// silent (or authenticate slowly) from piling up without bound. Its zero
// value is ready to use, and it is safe for concurrent use.
type Limiter struct {
	mu       sync.Mutex
	total    int
	bySource map[string]int // only sources with sessions starting
}

// Acquire takes a slot for a session from src, which the caller releases
// with Release once the session has authenticated or ended. When maxTotal
// slots are taken in all, or maxPerSource by src, it takes none and
// returns false with the message to refuse the session with (the
// per-source limit is named first, as it is the one to blame when both
// are reached).
func (l *Limiter) Acquire(src string, maxTotal, maxPerSource int) (refusal string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.bySource[src] >= maxPerSource:
		return fmt.Sprintf("too many connections still authenticating from %s", src), false
	case l.total >= maxTotal:
		return "too many connections still authenticating", false
	}
	if l.bySource == nil {
		l.bySource = make(map[string]int)
	}
	l.total++
	l.bySource[src]++
	return "", true
}

// Release returns a slot Acquire took for src. A source's entry goes once
// its last slot is returned, so the limiter holds only the sources with
// sessions starting, however many have come and gone.
func (l *Limiter) Release(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.bySource[src]--; l.bySource[src] <= 0 {
		delete(l.bySource, src)
	}
}

// Count returns the slots taken, the unauthenticated load the pooler
// reports (Pooler.StartingSessions).
func (l *Limiter) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}
