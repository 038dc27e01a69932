package wan

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// LoadTrace reads a Mahimahi link trace: one delivery opportunity per line,
// its time in whole milliseconds since the trace began, non-decreasing; the
// trace repeats with the last time as its period, which must be positive.
// It returns the opportunities' offsets.
func LoadTrace(path string) ([]time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ts []time.Duration
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		if t == "" {
			continue
		}
		ms, err := strconv.ParseUint(t, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %q is not a time in milliseconds", path, line, t)
		}
		d := time.Duration(ms) * time.Millisecond
		if len(ts) > 0 && d < ts[len(ts)-1] {
			return nil, fmt.Errorf("%s:%d: %v comes before the previous line's %v", path, line, d, ts[len(ts)-1])
		}
		ts = append(ts, d)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(ts) == 0 || ts[len(ts)-1] <= 0 {
		return nil, fmt.Errorf("%s: a trace needs at least one opportunity after 0 ms (its last line is its period)", path)
	}
	return ts, nil
}

// ParseRate reads a rate in bits per second: a number with an optional
// decimal suffix k, m or g (also kbit, mbit, gbit, with an optional "/s" or
// "ps"), as tc spells rates. "20mbit" is 20,000,000 bit/s.
func ParseRate(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "/s"), "ps")
	t = strings.TrimSuffix(t, "bit")
	t = strings.TrimSuffix(t, "b")
	mult := 1.0
	switch {
	case strings.HasSuffix(t, "k"):
		mult, t = 1e3, t[:len(t)-1]
	case strings.HasSuffix(t, "m"):
		mult, t = 1e6, t[:len(t)-1]
	case strings.HasSuffix(t, "g"):
		mult, t = 1e9, t[:len(t)-1]
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("rate %q: want bits per second such as 20mbit, 500kbit or 1000000", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("rate %q must not be negative", s)
	}
	return int64(v * mult), nil
}

// ParseBytes reads a size in bytes: a number with an optional suffix K, M
// or G (binary: 64K and 64KB are 65,536 bytes).
func ParseBytes(s string) (int, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "ib"), "b")
	mult := 1
	switch {
	case strings.HasSuffix(t, "k"):
		mult, t = 1<<10, t[:len(t)-1]
	case strings.HasSuffix(t, "m"):
		mult, t = 1<<20, t[:len(t)-1]
	case strings.HasSuffix(t, "g"):
		mult, t = 1<<30, t[:len(t)-1]
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want bytes such as 65536, 64KB or 1MB", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("size %q must not be negative", s)
	}
	return int(v) * mult, nil
}

// RateFlag is a flag.Value of a rate in bits per second (ParseRate).
type RateFlag struct{ P *int64 }

// String prints the rate in bits per second.
func (f RateFlag) String() string {
	if f.P == nil {
		return "0"
	}
	return strconv.FormatInt(*f.P, 10)
}

// Set parses a rate.
func (f RateFlag) Set(s string) error {
	v, err := ParseRate(s)
	if err == nil {
		*f.P = v
	}
	return err
}

// BytesFlag is a flag.Value of a size in bytes (ParseBytes). An explicit 0
// is refused: a queue of no bytes would drop every packet.
type BytesFlag struct{ P *int }

// String prints the size in bytes.
func (f BytesFlag) String() string {
	if f.P == nil {
		return "0"
	}
	return strconv.Itoa(*f.P)
}

// Set parses a size; 0 is refused.
func (f BytesFlag) Set(s string) error {
	v, err := ParseBytes(s)
	if err != nil {
		return err
	}
	if v == 0 {
		return fmt.Errorf("size %q: a queue of 0 bytes would drop every packet; give at least 1500 (one full-size packet)", s)
	}
	*f.P = v
	return nil
}

// probFlag is a flag.Value of a probability in [0, 1).
type probFlag struct{ p *float64 }

func (f probFlag) String() string {
	if f.p == nil {
		return "0"
	}
	return strconv.FormatFloat(*f.p, 'g', -1, 64)
}

func (f probFlag) Set(s string) error {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || v < 0 || v >= 1 {
		return fmt.Errorf("%q: want a probability in [0, 1), such as 0.01 for 1%%", s)
	}
	*f.p = v
	return nil
}

// burstFlag is the flag.Value of --burst-loss P,LEN.
type burstFlag struct{ c *Config }

func (f burstFlag) String() string {
	if f.c == nil {
		return "0,0"
	}
	return strconv.FormatFloat(f.c.BurstLoss, 'g', -1, 64) + "," + strconv.FormatFloat(f.c.BurstLen, 'g', -1, 64)
}

// Set parses "P,LEN"; "P" alone means bursts of one packet.
func (f burstFlag) Set(s string) error {
	ps, ls, ok := strings.Cut(s, ",")
	if !ok {
		ls = "1"
	}
	var p float64
	if err := (probFlag{&p}).Set(ps); err != nil {
		return fmt.Errorf("burst loss %q: P %w", s, err)
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(ls), 64)
	if err != nil || math.IsNaN(n) || n < 1 && !(p == 0 && n == 0) {
		return fmt.Errorf("burst loss %q: LEN must be a mean burst length of at least 1 packet", s)
	}
	f.c.BurstLoss, f.c.BurstLen = p, n
	return nil
}

// ParseBurst parses the --burst-loss value "P,LEN" for callers that keep
// their own flags (the ramp).
func ParseBurst(s string) (p, n float64, err error) {
	var c Config
	if err := (burstFlag{&c}).Set(s); err != nil {
		return 0, 0, err
	}
	return c.BurstLoss, c.BurstLen, nil
}
