package loadgen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Worker runs queries on one PostgreSQL session, one at a time: the
// runner never calls Do concurrently on the same Worker. Do must return
// promptly once ctx is canceled (the runner cancels it when the run ends).
type Worker interface {
	Do(ctx context.Context) error
}

// Defaults of RunConfig, applied to zero fields.
const (
	// DefaultGrace is how long queries still pending when the schedule ends
	// may take to finish before they count as unfinished. Callers running
	// across a WAN add two round trips.
	DefaultGrace = time.Second
	// DefaultLagThreshold is how late the dispatcher may release a query
	// before it counts as late (see LagSummary).
	DefaultLagThreshold = 10 * time.Millisecond
	// lateFraction is the share of late queries beyond which a run is
	// flagged as having fallen behind.
	lateFraction = 0.01
)

// RunConfig configures Run. Zero values take the defaults named on each
// field.
type RunConfig struct {
	// Schedule is the arrival plan. Required.
	Schedule Schedule
	// Grace is how long after the schedule's end pending queries (queued
	// or running) may still finish; the rest count as unfinished. Default
	// DefaultGrace (1s).
	Grace time.Duration
	// LagThreshold is how long after its intended time a query may be
	// released by the dispatcher before it counts as late. Default
	// DefaultLagThreshold (10ms).
	LagThreshold time.Duration
	// Progress, when set, is called once per elapsed second from the
	// dispatcher's goroutine, so it must not block (print and return).
	Progress func(Progress)
	// OnQuery, when set, is called from the dispatcher's goroutine once per
	// scheduled query: when it completes or fails, or, for a query still
	// pending when the run ends, with Err = ErrUnfinished. It must not block.
	OnQuery func(Query)
}

// ErrUnfinished marks, in Query.Err, a query that was queued or running
// when the run ended.
var ErrUnfinished = errors.New("loadgen: query unfinished when the run ended")

// ErrNoWorkers is returned by Run when it is given no worker.
var ErrNoWorkers = errors.New("loadgen: no worker to run queries on")

// Query is what happened to one scheduled query. Times are offsets from
// Result.Start.
type Query struct {
	// Index is the query's position in the schedule, from 0.
	Index int
	// Intended is when the schedule said to send it; latency counts from here.
	Intended time.Duration
	// Released is when the dispatcher queued it; Released-Intended is the
	// generator's own lag.
	Released time.Duration
	// Started is when a worker took it (0 if it never started).
	Started time.Duration
	// Done is when it completed or failed (for an unfinished query, when the
	// run ended).
	Done time.Duration
	// Err is nil for a completed query, ErrUnfinished for an unfinished one,
	// and the query's error otherwise.
	Err error
}

// Latency is the time from the intended send time to the completion.
func (q Query) Latency() time.Duration { return q.Done - q.Intended }

// Progress is the live state handed to RunConfig.Progress each second.
type Progress struct {
	// Elapsed is the time since the start.
	Elapsed time.Duration
	// Offered is how many queries the schedule released during the last
	// second; Done and Errors how many completed or failed during it.
	Offered, Done, Errors int
	// InFlight is the number of queries running on a session; Backlog the
	// number waiting for a free session.
	InFlight, Backlog int
	// OldestQueued is the age, from its intended time, of the oldest query
	// in the backlog (0 when empty).
	OldestQueued time.Duration
	// P50 and P99 are the latency percentiles of the queries completed
	// during the last second.
	P50, P99 time.Duration
	// CPU is the client's CPU use over the last second, in cores (1.0 is one
	// core busy); RSS its resident memory in bytes; FDs its open descriptors.
	CPU float64
	RSS int64
	FDs int
	// Scheduled, Completed and Errors count queries since the start.
	Scheduled, Completed, TotalErrors int
}

// job is a query between its release and its completion.
type job struct {
	index    int
	intended time.Duration
	released time.Duration
	started  time.Duration
}

// completion is a worker's report that its query ended.
type completion struct {
	worker int
	job    job
	done   time.Duration
	err    error
}

// secondSample is the sampler's reading at the end of second k.
type secondSample struct {
	k    int
	at   time.Duration
	proc ProcSample
}

// Run sends the schedule's queries to the workers and measures them. A
// dispatcher releases each query at its intended time into a FIFO backlog,
// from which idle workers take them; a query's latency runs from its
// intended time to its completion, so time spent in the backlog counts (no
// coordinated omission). The run ends when every query has finished, when
// the grace period after the schedule expires, or when ctx is canceled; in
// the last two cases queries still pending count as unfinished and the
// partial measurements are returned (Result.Canceled tells a canceled run
// apart), with a nil error. Run returns an error only for a bad config.
func Run(ctx context.Context, cfg RunConfig, workers []Worker) (*Result, error) {
	if err := cfg.Schedule.Validate(); err != nil {
		return nil, err
	}
	if len(workers) == 0 {
		return nil, ErrNoWorkers
	}
	if cfg.Grace == 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.LagThreshold == 0 {
		cfg.LagThreshold = DefaultLagThreshold
	}
	if cfg.Grace < 0 || cfg.LagThreshold < 0 {
		return nil, fmt.Errorf("loadgen: Grace %v and LagThreshold %v must not be negative", cfg.Grace, cfg.LagThreshold)
	}
	d := newDispatcher(cfg, len(workers))
	return d.run(ctx, workers), nil
}

// dispatcher owns every piece of a run's state; workers and the sampler
// only send it messages.
type dispatcher struct {
	cfg  RunConfig
	m    *measurements
	t0   time.Time
	done chan completion // buffered: one slot per worker, so workers never block

	queue    ring[job]
	idle     ring[int]
	jobs     []chan job
	current  []job // the job each worker runs; valid while busy[i]
	busy     []bool
	inFlight int
}

func newDispatcher(cfg RunConfig, workers int) *dispatcher {
	d := &dispatcher{
		cfg:     cfg,
		done:    make(chan completion, workers),
		jobs:    make([]chan job, workers),
		current: make([]job, workers),
		busy:    make([]bool, workers),
	}
	for i := range d.jobs {
		d.jobs[i] = make(chan job, 1)
		d.idle.push(i)
	}
	return d
}

func (d *dispatcher) since() time.Duration { return time.Since(d.t0) }

func (d *dispatcher) run(ctx context.Context, workers []Worker) *Result {
	// Workers get a context of their own, canceled only after the
	// dispatcher stopped counting, so that a canceled run's in-flight
	// queries are counted unfinished rather than as errors.
	wctx, cancelWorkers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWorkers()
	var wg sync.WaitGroup

	procStart := SampleProc()
	d.t0 = time.Now()
	d.m = newMeasurements(d.cfg, d.t0, procStart)
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range d.jobs[i] {
				err := w.Do(wctx)
				d.done <- completion{worker: i, job: j, done: d.since(), err: err}
			}
		}()
	}
	samples := make(chan secondSample)
	stopSampler := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		sampleSeconds(d.t0, samples, stopSampler)
	}()

	end := d.loop(ctx, samples)
	stopAt := d.since()
	final := queueState{backlog: d.queue.len(), inFlight: d.inFlight, oldest: d.oldestQueued(stopAt)}
	unfinished := d.pending(stopAt)

	close(stopSampler)
	cancelWorkers()
	for _, ch := range d.jobs {
		close(ch)
	}
	wg.Wait()

	d.m.finish(stopAt, end, final, unfinished, SampleProc())
	return d.m.result()
}

// runEnd says why a run stopped.
type runEnd int

const (
	endAllDone runEnd = iota
	endGraceExpired
	endCanceled
)

func (d *dispatcher) loop(ctx context.Context, samples <-chan secondSample) runEnd {
	arr := d.cfg.Schedule.Arrivals()
	next, more := arr.Next()
	deadline := d.cfg.Schedule.Duration + d.cfg.Grace
	timer := time.NewTimer(0)
	defer timer.Stop()
	index := 0
	for {
		now := d.since()
		for more && next <= now {
			j := job{index: index, intended: next, released: now}
			index++
			d.m.released(j)
			d.queue.push(j)
			next, more = arr.Next()
		}
		d.dispatch(now)
		if !more {
			if d.queue.len() == 0 && d.inFlight == 0 {
				return endAllDone
			}
			if now >= deadline {
				return endGraceExpired
			}
		}
		wake := deadline
		if more {
			wake = next
		}
		timer.Reset(wake - now)
		select {
		case <-ctx.Done():
			return endCanceled
		case <-timer.C:
		case c := <-d.done:
			d.complete(c)
			// Take whatever else completed meanwhile before looking at the clock again.
			for n := len(d.done); n > 0; n-- {
				d.complete(<-d.done)
			}
		case s := <-samples:
			now := d.since()
			d.m.second(s, queueState{backlog: d.queue.len(), inFlight: d.inFlight, oldest: d.oldestQueued(now)})
		}
	}
}

// dispatch hands queued queries to idle workers, oldest query first and
// longest-idle worker first (so load spreads over every session).
func (d *dispatcher) dispatch(now time.Duration) {
	for d.queue.len() > 0 && d.idle.len() > 0 {
		j := d.queue.pop()
		w := d.idle.pop()
		j.started = now
		d.current[w] = j
		d.busy[w] = true
		d.inFlight++
		d.jobs[w] <- j // never blocks: an idle worker's channel is empty
	}
}

func (d *dispatcher) complete(c completion) {
	d.busy[c.worker] = false
	d.inFlight--
	d.idle.push(c.worker)
	q := Query{Index: c.job.index, Intended: c.job.intended, Released: c.job.released, Started: c.job.started, Done: c.done, Err: c.err}
	d.m.ended(q)
	if d.cfg.OnQuery != nil {
		d.cfg.OnQuery(q)
	}
}

// pending lists the queries still queued or running at now, as unfinished.
func (d *dispatcher) pending(now time.Duration) []Query {
	var out []Query
	for i, b := range d.busy {
		if b {
			j := d.current[i]
			out = append(out, Query{Index: j.index, Intended: j.intended, Released: j.released, Started: j.started, Done: now, Err: ErrUnfinished})
		}
	}
	for d.queue.len() > 0 {
		j := d.queue.pop()
		out = append(out, Query{Index: j.index, Intended: j.intended, Released: j.released, Done: now, Err: ErrUnfinished})
	}
	if d.cfg.OnQuery != nil {
		for _, q := range out {
			d.cfg.OnQuery(q)
		}
	}
	return out
}

func (d *dispatcher) oldestQueued(now time.Duration) time.Duration {
	if d.queue.len() == 0 {
		return 0
	}
	return now - d.queue.peek().intended
}

// sampleSeconds reads the process's resource use at the end of every
// second after t0 and sends it until stop is closed. It runs in its own
// goroutine so that reading /proc never delays the dispatcher.
func sampleSeconds(t0 time.Time, out chan<- secondSample, stop <-chan struct{}) {
	timer := time.NewTimer(time.Until(t0.Add(time.Second)))
	defer timer.Stop()
	for k := 0; ; k++ {
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		s := secondSample{k: k, at: time.Since(t0), proc: SampleProc()}
		select {
		case <-stop:
			return
		case out <- s:
		}
		timer.Reset(time.Until(t0.Add(time.Duration(k+2) * time.Second)))
	}
}

// ring is a growable FIFO queue.
type ring[T any] struct {
	buf        []T
	head, size int
}

func (r *ring[T]) len() int { return r.size }

func (r *ring[T]) push(v T) {
	if r.size == len(r.buf) {
		nb := make([]T, max(16, 2*len(r.buf)))
		for i := 0; i < r.size; i++ {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.size)%len(r.buf)] = v
	r.size++
}

func (r *ring[T]) pop() T {
	v := r.buf[r.head]
	var zero T
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.size--
	return v
}

func (r *ring[T]) peek() T { return r.buf[r.head] }
