package loadgen

import (
	"errors"
	"fmt"
	"iter"
	"math"
	"math/rand/v2"
	"time"
)

// Schedule is an open-loop arrival plan: the rate rises (or falls) linearly
// from From to To queries per second over Duration, so a constant rate is
// From == To. Each query's intended send time comes from the schedule alone,
// never from when earlier queries completed, so a slow server cannot slow
// the offered load down (that would hide the very latency being measured).
//
// With Poisson false, query i is due at the instant t where the integral of
// the rate from 0 to t equals i: the arrivals are evenly spaced along the
// rate curve and a 100 → 5,000 q/s ramp over 30 s schedules exactly
// (100+5000)/2 × 30 = 76,500 queries. With Poisson true the same rate curve
// drives a non-homogeneous Poisson process (exponential gaps of mean 1 in
// the integral of the rate, mapped back to time), seeded by Seed so a run
// can be repeated.
type Schedule struct {
	// From is the rate at the start, in queries per second. It must not be
	// negative.
	From float64
	// To is the rate at the end, in queries per second. It must not be
	// negative; From == To is a constant rate.
	To float64
	// Duration is how long queries are scheduled. It must be positive.
	Duration time.Duration
	// Poisson draws exponential inter-arrival gaps instead of even spacing.
	Poisson bool
	// Seed seeds the Poisson draws; the same seed gives the same arrivals.
	Seed uint64
}

// Constant is a schedule of rate queries per second for d.
func Constant(rate float64, d time.Duration) Schedule {
	return Schedule{From: rate, To: rate, Duration: d}
}

// Ramp is a schedule whose rate rises linearly from from to to queries per
// second over d.
func Ramp(from, to float64, d time.Duration) Schedule {
	return Schedule{From: from, To: to, Duration: d}
}

// ErrBadSchedule is wrapped by Validate's errors.
var ErrBadSchedule = errors.New("loadgen: invalid schedule")

// Validate reports an error for a negative or non-finite rate or a
// non-positive duration.
func (s Schedule) Validate() error {
	for _, r := range []float64{s.From, s.To} {
		if r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
			return fmt.Errorf("%w: rate %v q/s must be a finite number >= 0", ErrBadSchedule, r)
		}
	}
	if s.Duration <= 0 {
		return fmt.Errorf("%w: duration %v must be positive", ErrBadSchedule, s.Duration)
	}
	return nil
}

// Rate returns the scheduled rate, in queries per second, at t after the
// start (0 outside [0, Duration)).
func (s Schedule) Rate(t time.Duration) float64 {
	if t < 0 || t >= s.Duration {
		return 0
	}
	return s.From + (s.To-s.From)*t.Seconds()/s.Duration.Seconds()
}

// Integral returns the expected number of queries scheduled in [0, t): the
// integral of the rate. Integral(Duration) is the run's expected total.
func (s Schedule) Integral(t time.Duration) float64 {
	if t <= 0 {
		return 0
	}
	if t > s.Duration {
		t = s.Duration
	}
	x := t.Seconds()
	return s.From*x + (s.To-s.From)/s.Duration.Seconds()*x*x/2
}

// Count returns how many queries an evenly spaced (non-Poisson) schedule
// sends: the integral of the rate over the whole duration, rounded up, since
// query 0 is due at time 0. A Poisson schedule's count varies around it.
func (s Schedule) Count() int {
	return ceilCount(s.Integral(s.Duration))
}

// ceilCount rounds a count up, forgiving floating-point noise just above an
// integer (76500.0000001 is 76500).
func ceilCount(x float64) int {
	return int(math.Ceil(x - 1e-6))
}

// at returns the time at which the integral of the rate reaches v: the
// inverse of Integral on [0, Duration].
func (s Schedule) at(v float64) time.Duration {
	if v <= 0 {
		return 0
	}
	// Solve From·t + k·t²/2 = v with k the rate's slope, in the form that
	// is stable when k is zero or tiny: t = 2v / (From + sqrt(From² + 2kv)).
	k := (s.To - s.From) / s.Duration.Seconds()
	d := s.From*s.From + 2*k*v
	if d < 0 {
		d = 0
	}
	den := s.From + math.Sqrt(d)
	if den <= 0 {
		return s.Duration
	}
	sec := 2 * v / den
	return time.Duration(math.Round(sec * float64(time.Second)))
}

// Arrivals returns a fresh iterator over the schedule's intended send
// times, in increasing order, as offsets from the start.
func (s Schedule) Arrivals() *Arrivals {
	a := &Arrivals{s: s, total: s.Integral(s.Duration)}
	if s.Poisson {
		a.rng = rand.New(rand.NewPCG(s.Seed, s.Seed^0x9e3779b97f4a7c15))
		a.v = a.rng.ExpFloat64()
	}
	return a
}

// All yields (index, intended send time) for every query of the schedule.
func (s Schedule) All() iter.Seq2[int, time.Duration] {
	return func(yield func(int, time.Duration) bool) {
		a := s.Arrivals()
		for {
			t, ok := a.Next()
			if !ok || !yield(a.n-1, t) {
				return
			}
		}
	}
}

// Arrivals iterates over a schedule's intended send times. It is not safe
// for concurrent use: the dispatcher owns it.
type Arrivals struct {
	s     Schedule
	total float64    // integral of the rate over the whole schedule
	n     int        // arrivals returned so far
	v     float64    // the next arrival's position in the integral of the rate
	rng   *rand.Rand // nil unless Poisson
}

// Next returns the next intended send time and true, or false when the
// schedule is exhausted.
func (a *Arrivals) Next() (time.Duration, bool) {
	if a.rng == nil {
		a.v = float64(a.n)
		if a.n >= ceilCount(a.total) {
			return 0, false
		}
	} else if a.v >= a.total {
		return 0, false
	}
	t := a.s.at(a.v)
	if t >= a.s.Duration {
		t = a.s.Duration - 1
	}
	a.n++
	if a.rng != nil {
		a.v += a.rng.ExpFloat64()
	}
	return t, true
}
