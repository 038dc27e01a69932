// Package zerohist folds the zero observations of a Prometheus histogram
// into one counter that is merged in at scrape time.
//
// A request that finds a server connection free at once still observes
// a wait of 0 in two histograms (the pooler's and the backend pool's);
// Observe costs a bucket search and four atomic updates, a counter's Add
// one. The zeros are added to every bucket and to the count when the
// histogram is collected, so what a scrape shows is exactly what
// Observe(0) would have made it, at any moment: nothing is batched or
// delayed.
package zerohist

import (
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Histogram is a prometheus.Histogram whose zero observations may go
// through ObserveZero. It is a prometheus.Collector like the histogram
// it wraps.
type Histogram struct {
	prometheus.Histogram
	zeros atomic.Uint64
}

// New returns a Histogram with opts.
func New(opts prometheus.HistogramOpts) *Histogram {
	return &Histogram{Histogram: prometheus.NewHistogram(opts)}
}

// ObserveZero records an observation of 0, as Observe(0) would.
func (h *Histogram) ObserveZero() { h.zeros.Add(1) }

// Collect implements prometheus.Collector: the wrapped histogram with the
// zeros merged in.
func (h *Histogram) Collect(ch chan<- prometheus.Metric) {
	ch <- WithZeros(h.Histogram, h.zeros.Load())
}

// WithZeros returns m, a histogram metric, with n more observations of 0:
// every bucket whose upper bound is at least 0 and the count grow by n,
// the sum stays. variable names m's variable labels in the order of its
// description (none for a plain histogram). It returns m itself when n is
// 0, and an invalid metric (which fails the scrape) when m is not a
// histogram.
func WithZeros(m prometheus.Metric, n uint64, variable ...string) prometheus.Metric {
	if n == 0 {
		return m
	}
	var pb dto.Metric
	if err := m.Write(&pb); err != nil {
		return prometheus.NewInvalidMetric(m.Desc(), err)
	}
	hp := pb.GetHistogram()
	if hp == nil {
		return prometheus.NewInvalidMetric(m.Desc(), fmt.Errorf("zerohist: %s is not a histogram", m.Desc()))
	}
	buckets := make(map[float64]uint64, len(hp.GetBucket()))
	for _, b := range hp.GetBucket() {
		c := b.GetCumulativeCount()
		if b.GetUpperBound() >= 0 {
			c += n
		}
		buckets[b.GetUpperBound()] = c
	}
	values := make([]string, len(variable))
	for i, name := range variable {
		values[i] = LabelValue(&pb, name)
	}
	var c prometheus.Metric
	var err error
	if ct := hp.GetCreatedTimestamp(); ct != nil {
		c, err = prometheus.NewConstHistogramWithCreatedTimestamp(m.Desc(), hp.GetSampleCount()+n, hp.GetSampleSum(), buckets, ct.AsTime(), values...)
	} else {
		c, err = prometheus.NewConstHistogram(m.Desc(), hp.GetSampleCount()+n, hp.GetSampleSum(), buckets, values...)
	}
	if err != nil {
		return prometheus.NewInvalidMetric(m.Desc(), err)
	}
	return c
}

// LabelValue returns the value of m's label name, or "".
func LabelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
