package loadgen

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5/pgconn"
)

// Histogram bounds: latencies are recorded in microseconds from 1 µs to one
// hour (longer ones are clamped), with 3 significant digits for the whole
// run and 2 (1% resolution, a few KB each) for each one-second window.
const (
	histMin       = 1
	histMax       = int64(time.Hour / time.Microsecond)
	histDigitsRun = 3
	histDigitsWin = 2
)

// Knee rule: a one-second window kept up when completions during it reached
// keptUpShare of the queries due in it (its offer, moved back by the run's
// unloaded latency: the lowest median of any second), its backlog grew by at
// most 1-keptUpShare of its offer, and it did not begin with a backlog above
// that share (a second draining a stall's backlog is catching up, not
// keeping up).
const keptUpShare = 0.98

// Result is what a run measured. Times are offsets from Start.
type Result struct {
	// Start is when the schedule's time 0 was.
	Start time.Time
	// Elapsed is how long the run lasted, to the moment it stopped counting.
	Elapsed time.Duration
	// Schedule is the arrival plan that was run.
	Schedule Schedule
	// Canceled is true when the run was stopped by its context before the
	// schedule and its grace period were over.
	Canceled bool
	// GraceExpired is true when queries were still pending at the end of the
	// grace period after the schedule.
	GraceExpired bool

	// Scheduled counts the queries whose intended time came before the run
	// stopped; Scheduled = Completed + Errors + Unfinished always.
	Scheduled, Completed, Errors, Unfinished int

	// Latency summarizes completed queries, from intended send time to
	// completion.
	Latency LatencySummary
	// PeakQPS is the most queries completed in one full wall-clock second.
	PeakQPS float64
	// KneeQPS is the highest offered rate of a full one-second window that
	// kept up: completions during it reached 98% of the queries due in it
	// (its offer a base latency earlier; see the knee rule) and its backlog
	// grew by at most 2% of its offer. 0 when no window kept up.
	KneeQPS float64
	// KeptUp is true when every full window of the schedule kept up, so the
	// knee, if any, lies beyond the highest rate offered.
	KeptUp bool

	// Lag is the dispatcher's own lateness.
	Lag LagSummary
	// Client is the load generator process's resource use.
	Client ClientSummary

	// ErrorKinds counts failed queries by kind: "SQLSTATE xxxxx" for an
	// error from the server, "connection" for a broken or refused
	// connection, "timeout", or "other".
	ErrorKinds map[string]int
	// FirstError is the text of the first query error, for messages.
	FirstError string

	// Windows holds one entry per second since Start, up to the end of the
	// run (seconds after the schedule show the drain).
	Windows []Window
}

// LatencySummary holds latency percentiles from HdrHistogram (1% or finer
// resolution), the exact maximum and the exact mean.
type LatencySummary struct {
	P50, P90, P99, Max, Mean time.Duration
}

// LagSummary describes how late the dispatcher released queries relative to
// their intended time, not counting time spent in the backlog (that wait is
// the system's, and is part of latency). A generator that falls behind
// offers less load than the schedule says, so such a run says so.
type LagSummary struct {
	// Threshold is the lag beyond which a query counts as late.
	Threshold time.Duration
	// Max and P99 are the largest and the 99th-percentile release lag.
	Max, P99 time.Duration
	// Late counts queries released more than Threshold after their
	// intended time.
	Late int
	// FellBehind is true when more than 1% of the scheduled queries were
	// late.
	FellBehind bool
}

// ClientSummary is the load generator process's resource use over the run.
type ClientSummary struct {
	// CPU is the user plus system CPU time used during the run.
	CPU time.Duration
	// PeakRSS is the highest resident set size seen (bytes).
	PeakRSS int64
	// PeakFDs is the most open file descriptors seen.
	PeakFDs int
}

// Window is one second of a run: second K covers [K, K+1) s after Start.
// Offered, Completed, Errors, Unfinished and the latency figures are keyed
// by intended send time (a query scheduled in second K that completed three
// seconds later counts in second K, with its whole latency); Throughput and
// Failures are keyed by completion time; InFlight, Backlog, OldestQueued and the client
// figures are read at the end of the second.
type Window struct {
	// K is the window's index (seconds since Start).
	K int
	// Offered counts queries scheduled in the window; Completed, Errors and
	// Unfinished what became of them. Offered = Completed + Errors +
	// Unfinished once the run is over.
	Offered, Completed, Errors, Unfinished int
	// Throughput counts queries that completed successfully during the
	// second, whatever their intended time; Failures those that failed
	// during it.
	Throughput, Failures int
	// InFlight and Backlog are the running and waiting queries at the end of
	// the second; OldestQueued the age of the oldest waiting query.
	InFlight, Backlog int
	OldestQueued      time.Duration
	// P50, P99 and Max are the latency of the window's completed queries.
	P50, P99, Max time.Duration
	// MaxLag is the largest release lag of the window's queries.
	MaxLag time.Duration
	// CPU is the client CPU time used during the second; RSS and FDs the
	// client's memory and open descriptors at its end.
	CPU time.Duration
	RSS int64
	FDs int
	// Sampled is true when the end-of-second figures were read (the last,
	// partial window is sampled when the run stops).
	Sampled bool

	hist *hdrhistogram.Histogram
}

// queueState is the dispatcher's queue at one instant.
type queueState struct {
	backlog, inFlight int
	oldest            time.Duration
}

// measurements accumulates a run; only the dispatcher's goroutine uses it.
type measurements struct {
	cfg       RunConfig
	t0        time.Time
	procStart ProcSample
	lastProc  ProcSample

	windows []Window
	all     *hdrhistogram.Histogram
	sum     time.Duration
	max     time.Duration
	lag     *hdrhistogram.Histogram
	maxLag  time.Duration
	late    int

	live                            *hdrhistogram.Histogram
	liveOffered, liveDone, liveErrs int

	scheduled, completed, errs, unfinished int
	errorKinds                             map[string]int
	firstErr                               string
	peakRSS                                int64
	peakFDs                                int

	elapsed time.Duration
	end     runEnd
	procEnd ProcSample
}

func newMeasurements(cfg RunConfig, t0 time.Time, procStart ProcSample) *measurements {
	return &measurements{
		cfg:        cfg,
		t0:         t0,
		procStart:  procStart,
		lastProc:   procStart,
		all:        hdrhistogram.New(histMin, histMax, histDigitsRun),
		lag:        hdrhistogram.New(histMin, histMax, histDigitsWin),
		live:       hdrhistogram.New(histMin, histMax, histDigitsWin),
		errorKinds: map[string]int{},
	}
}

// window returns window k, growing the list as needed.
func (m *measurements) window(k int) *Window {
	for len(m.windows) <= k {
		m.windows = append(m.windows, Window{K: len(m.windows)})
	}
	return &m.windows[k]
}

func windowOf(t time.Duration) int { return int(t / time.Second) }

// micros converts a duration to a histogram value.
func micros(d time.Duration) int64 {
	return min(max(int64(d/time.Microsecond), histMin), histMax)
}

func (m *measurements) released(j job) {
	m.scheduled++
	m.liveOffered++
	w := m.window(windowOf(j.intended))
	w.Offered++
	lag := j.released - j.intended
	_ = m.lag.RecordValue(micros(lag))
	m.maxLag = max(m.maxLag, lag)
	w.MaxLag = max(w.MaxLag, lag)
	if lag > m.cfg.LagThreshold {
		m.late++
	}
}

func (m *measurements) ended(q Query) {
	w := m.window(windowOf(q.Intended))
	if q.Err != nil {
		m.errs++
		m.liveErrs++
		w.Errors++
		m.errorKinds[errorKind(q.Err)]++
		m.window(windowOf(q.Done)).Failures++
		if m.firstErr == "" {
			m.firstErr = q.Err.Error()
		}
		return
	}
	m.completed++
	m.liveDone++
	w.Completed++
	lat := q.Latency()
	v := micros(lat)
	if w.hist == nil {
		w.hist = hdrhistogram.New(histMin, histMax, histDigitsWin)
	}
	_ = w.hist.RecordValue(v)
	_ = m.all.RecordValue(v)
	_ = m.live.RecordValue(v)
	m.sum += lat
	m.max = max(m.max, lat)
	w.Max = max(w.Max, lat)
	m.window(windowOf(q.Done)).Throughput++
}

// second records the end of second s.k and reports progress.
func (m *measurements) second(s secondSample, qs queueState) {
	m.sampleInto(m.window(s.k), s.proc, qs)
	if m.cfg.Progress != nil {
		p := Progress{
			Elapsed:      s.at,
			Offered:      m.liveOffered,
			Done:         m.liveDone,
			Errors:       m.liveErrs,
			InFlight:     qs.inFlight,
			Backlog:      qs.backlog,
			OldestQueued: qs.oldest,
			P50:          time.Duration(m.live.ValueAtQuantile(50)) * time.Microsecond,
			P99:          time.Duration(m.live.ValueAtQuantile(99)) * time.Microsecond,
			CPU:          m.windows[s.k].CPU.Seconds(),
			RSS:          s.proc.RSS,
			FDs:          s.proc.FDs,
			Scheduled:    m.scheduled,
			Completed:    m.completed,
			TotalErrors:  m.errs,
		}
		m.cfg.Progress(p)
	}
	m.live.Reset()
	m.liveOffered, m.liveDone, m.liveErrs = 0, 0, 0
}

func (m *measurements) sampleInto(w *Window, p ProcSample, qs queueState) {
	w.Sampled = true
	w.InFlight, w.Backlog, w.OldestQueued = qs.inFlight, qs.backlog, qs.oldest
	w.CPU = max(p.CPU-m.lastProc.CPU, 0)
	w.RSS, w.FDs = p.RSS, p.FDs
	m.lastProc = p
	m.peakRSS = max(m.peakRSS, p.RSS, p.PeakRSS)
	m.peakFDs = max(m.peakFDs, p.FDs)
}

// finish records the end of the run: the last, partial second and the
// queries left pending.
func (m *measurements) finish(at time.Duration, end runEnd, qs queueState, pending []Query, proc ProcSample) {
	m.elapsed, m.end, m.procEnd = at, end, proc
	// The sampler reports second k at or after (k+1) s, so the window the
	// run stopped in has not been sampled yet: sample it now.
	m.sampleInto(m.window(windowOf(at)), proc, qs)
	for _, q := range pending {
		m.unfinished++
		m.window(windowOf(q.Intended)).Unfinished++
	}
}

func (m *measurements) result() *Result {
	r := &Result{
		Start:        m.t0,
		Elapsed:      m.elapsed,
		Schedule:     m.cfg.Schedule,
		Canceled:     m.end == endCanceled,
		GraceExpired: m.end == endGraceExpired,
		Scheduled:    m.scheduled,
		Completed:    m.completed,
		Errors:       m.errs,
		Unfinished:   m.unfinished,
		ErrorKinds:   m.errorKinds,
		FirstError:   m.firstErr,
		Client: ClientSummary{
			CPU:     max(m.procEnd.CPU-m.procStart.CPU, 0),
			PeakRSS: m.peakRSS,
			PeakFDs: m.peakFDs,
		},
		Lag: LagSummary{
			Threshold:  m.cfg.LagThreshold,
			Max:        m.maxLag,
			P99:        time.Duration(m.lag.ValueAtQuantile(99)) * time.Microsecond,
			Late:       m.late,
			FellBehind: float64(m.late) > lateFraction*float64(m.scheduled),
		},
	}
	if m.completed > 0 {
		r.Latency = LatencySummary{
			P50:  min(histDuration(m.all, 50), m.max),
			P90:  min(histDuration(m.all, 90), m.max),
			P99:  min(histDuration(m.all, 99), m.max),
			Max:  m.max,
			Mean: m.sum / time.Duration(m.completed),
		}
	}
	r.Windows = m.windows
	r.KeptUp = true
	base := time.Duration(-1)
	for k := range r.Windows {
		w := &r.Windows[k]
		if w.hist != nil {
			w.P50 = min(histDuration(w.hist, 50), w.Max)
			w.P99 = min(histDuration(w.hist, 99), w.Max)
			w.hist = nil
		}
		if w.Completed > 0 && (base < 0 || w.P50 < base) {
			base = w.P50
		}
	}
	lagShare := min(max(base, 0), time.Second).Seconds()
	for k := range r.Windows {
		w := &r.Windows[k]
		full := time.Duration(k+1)*time.Second <= m.elapsed
		if !full {
			continue
		}
		r.PeakQPS = max(r.PeakQPS, float64(w.Throughput))
		if w.Offered == 0 || time.Duration(k+1)*time.Second > m.cfg.Schedule.Duration {
			continue
		}
		prevBacklog, prevOffered := 0, 0
		if k > 0 {
			prevBacklog, prevOffered = r.Windows[k-1].Backlog, r.Windows[k-1].Offered
		}
		// Completions trail arrivals by the unloaded latency: on a ramp a
		// second's completions are the arrivals of a second that began
		// that much earlier, fewer than the second's own offer.
		due := float64(w.Offered) - lagShare*float64(w.Offered-prevOffered)
		// A second that began behind (a backlog left by a stall or an
		// overload) completes its own arrivals plus the backlog's: it
		// shows that the system caught up, not that it keeps up with this
		// rate, so it never counts as kept up.
		startedBehind := float64(prevBacklog) > (1-keptUpShare)*float64(w.Offered)
		kept := !startedBehind && float64(w.Throughput) >= keptUpShare*due &&
			float64(w.Backlog-prevBacklog) <= (1-keptUpShare)*float64(w.Offered)
		if kept {
			r.KneeQPS = max(r.KneeQPS, float64(w.Offered))
		} else {
			r.KeptUp = false
		}
	}
	return r
}

// histDuration reads a percentile (0-100) of a microsecond histogram. The
// whole-run maximum is kept exactly, so percentiles never exceed it.
func histDuration(h *hdrhistogram.Histogram, pct float64) time.Duration {
	return time.Duration(h.ValueAtQuantile(pct)) * time.Microsecond
}

// errorKind classifies a query error for Result.ErrorKinds.
func errorKind(err error) string {
	var pgErr *pgconn.PgError
	var netErr net.Error
	switch {
	case errors.As(err, &pgErr):
		return "SQLSTATE " + pgErr.Code
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &netErr), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed):
		return "connection"
	default:
		return "other"
	}
}
