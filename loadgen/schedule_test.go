package loadgen

import (
	"errors"
	"math"
	"testing"
	"time"
)

// perSecond counts a schedule's arrivals in each one-second window.
func perSecond(t *testing.T, s Schedule) []int {
	t.Helper()
	counts := make([]int, int(math.Ceil(s.Duration.Seconds())))
	var prev time.Duration = -1
	for i, at := range s.All() {
		if at < prev {
			t.Fatalf("arrival %d at %v is before arrival %d at %v", i, at, i-1, prev)
		}
		if at < 0 || at >= s.Duration {
			t.Fatalf("arrival %d at %v lies outside [0, %v)", i, at, s.Duration)
		}
		prev = at
		counts[int(at/time.Second)]++
	}
	return counts
}

func TestScheduleEvenCounts(t *testing.T) {
	tests := []struct {
		name  string
		s     Schedule
		total int
	}{
		{"default ramp 100 to 5000 over 30s", Ramp(100, 5000, 30*time.Second), 76500},
		{"constant 1000 for 5s", Constant(1000, 5*time.Second), 5000},
		{"constant 7.5 for 4s", Constant(7.5, 4*time.Second), 30},
		{"ramp from zero", Ramp(0, 1000, 10*time.Second), 5000},
		{"ramp down", Ramp(3000, 1000, 4*time.Second), 8000},
		{"fractional total rounds up", Constant(2.5, 3*time.Second), 8},
		{"fractional duration", Constant(100, 2500*time.Millisecond), 250},
		{"zero rate", Constant(0, 3*time.Second), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.s.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := tc.s.Count(); got != tc.total {
				t.Fatalf("Count() = %d, want %d", got, tc.total)
			}
			counts := perSecond(t, tc.s)
			sum := 0
			for k, n := range counts {
				sum += n
				lo := time.Duration(k) * time.Second
				hi := min(lo+time.Second, tc.s.Duration)
				want := tc.s.Integral(hi) - tc.s.Integral(lo)
				if math.Abs(float64(n)-want) > 1 {
					t.Errorf("second %d: %d arrivals, the rate integrates to %.2f", k, n, want)
				}
			}
			if sum != tc.total {
				t.Fatalf("%d arrivals in all, want %d", sum, tc.total)
			}
		})
	}
}

// TestScheduleRampSeconds checks the default ramp second by second: second
// k of a 100 → 5000 q/s ramp over 30 s holds 100 + 163.33·(k + 0.5) queries,
// within rounding.
func TestScheduleRampSeconds(t *testing.T) {
	s := Ramp(100, 5000, 30*time.Second)
	counts := perSecond(t, s)
	if len(counts) != 30 {
		t.Fatalf("%d seconds", len(counts))
	}
	for k, n := range counts {
		want := 100 + (5000-100)/30.0*(float64(k)+0.5)
		if math.Abs(float64(n)-want) > 1 {
			t.Errorf("second %d: %d arrivals, want %.1f", k, n, want)
		}
	}
	// The first query is due at once, the spacing at the start is 1/100 s.
	a := s.Arrivals()
	t0, _ := a.Next()
	t1, _ := a.Next()
	if t0 != 0 || t1 < 9900*time.Microsecond || t1 > 10*time.Millisecond {
		t.Fatalf("first arrivals at %v and %v, want 0 and just under 10ms", t0, t1)
	}
}

func TestSchedulePoisson(t *testing.T) {
	s := Ramp(200, 2000, 20*time.Second)
	s.Poisson = true
	s.Seed = 42
	counts := perSecond(t, s)
	total := 0
	for k, n := range counts {
		total += n
		lo := time.Duration(k) * time.Second
		want := s.Integral(lo+time.Second) - s.Integral(lo)
		// A Poisson count has standard deviation sqrt(mean); 5 sigma.
		if math.Abs(float64(n)-want) > 5*math.Sqrt(want) {
			t.Errorf("second %d: %d arrivals, expected %.0f ± %.0f", k, n, want, 5*math.Sqrt(want))
		}
	}
	if mean := s.Integral(s.Duration); math.Abs(float64(total)-mean) > 5*math.Sqrt(mean) {
		t.Errorf("%d arrivals in all, expected %.0f", total, mean)
	}
	// Same seed, same arrivals; another seed, others.
	again, other := s, s
	other.Seed = 43
	var a, b, c []time.Duration
	for _, at := range s.All() {
		a = append(a, at)
	}
	for _, at := range again.All() {
		b = append(b, at)
	}
	for _, at := range other.All() {
		c = append(c, at)
	}
	if len(a) != len(b) {
		t.Fatalf("same seed: %d then %d arrivals", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("same seed: arrival %d at %v then %v", i, a[i], b[i])
		}
	}
	same := len(a) == len(c)
	for i := 0; same && i < len(a); i++ {
		same = a[i] == c[i]
	}
	if same {
		t.Fatal("seeds 42 and 43 gave the same arrivals")
	}
	// The gaps of a constant-rate Poisson schedule are exponential: their
	// mean is 1/rate and about 1/e of them exceed it.
	cs := Constant(1000, 20*time.Second)
	cs.Poisson, cs.Seed = true, 7
	var prev time.Duration
	n, long := 0, 0
	var sum time.Duration
	for i, at := range cs.All() {
		if i > 0 {
			gap := at - prev
			sum += gap
			n++
			if gap > time.Millisecond {
				long++
			}
		}
		prev = at
	}
	if mean := sum / time.Duration(n); mean < 950*time.Microsecond || mean > 1050*time.Microsecond {
		t.Errorf("mean gap %v, want ~1ms", mean)
	}
	if frac := float64(long) / float64(n); math.Abs(frac-1/math.E) > 0.02 {
		t.Errorf("%.3f of the gaps exceed the mean, want ~%.3f", frac, 1/math.E)
	}
}

func TestScheduleValidate(t *testing.T) {
	bad := []Schedule{
		{From: -1, To: 10, Duration: time.Second},
		{From: 1, To: math.NaN(), Duration: time.Second},
		{From: 1, To: math.Inf(1), Duration: time.Second},
		{From: 1, To: 1},
		{From: 1, To: 1, Duration: -time.Second},
	}
	for _, s := range bad {
		if err := s.Validate(); !errors.Is(err, ErrBadSchedule) {
			t.Errorf("Validate(%+v) = %v, want ErrBadSchedule", s, err)
		}
	}
	if r := Ramp(100, 200, 10*time.Second).Rate(5 * time.Second); r != 150 {
		t.Errorf("Rate at the middle of a 100 → 200 ramp = %v", r)
	}
}
