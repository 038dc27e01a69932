package zerohist

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

var opts = prometheus.HistogramOpts{
	Namespace: "t", Name: "wait_seconds", Help: "Waits.",
	Buckets: []float64{.0001, .001, .01, 1},
}

// gather returns what a scrape of c shows, every series' creation time
// (which differs between two histograms made one after the other) checked
// and left out.
func gather(t *testing.T, c prometheus.Collector) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetHistogram().GetCreatedTimestamp() == nil {
				t.Fatalf("%s: no creation time", mf.GetName())
			}
			m.GetHistogram().CreatedTimestamp = nil
		}
	}
	return mfs
}

// TestHistogramSameAsObserveZero checks that a scrape of a Histogram fed
// with ObserveZero shows exactly what a plain histogram fed Observe(0)
// does, with and without other observations, at every step.
func TestHistogramSameAsObserveZero(t *testing.T) {
	z := New(opts)
	h := prometheus.NewHistogram(opts)
	steps := []float64{0, 0, .0005, 0, 2, .00005, 0}
	check := func(step int) {
		t.Helper()
		got, want := gather(t, z), gather(t, h)
		if len(got) != 1 || len(want) != 1 || !proto.Equal(got[0], want[0]) {
			t.Fatalf("after %d observations:\n got %v\nwant %v", step, got, want)
		}
	}
	check(0)
	for i, v := range steps {
		if v == 0 {
			z.ObserveZero()
		} else {
			z.Observe(v)
		}
		h.Observe(v)
		check(i + 1)
	}
}

// TestWithZerosVec checks the merging of zeros into one series of a
// labelled histogram, the others left alone.
func TestWithZerosVec(t *testing.T) {
	vo := opts
	zv := prometheus.NewHistogramVec(vo, []string{"database", "user"})
	hv := prometheus.NewHistogramVec(vo, []string{"database", "user"})
	zv.WithLabelValues("a", "u").Observe(.5)
	hv.WithLabelValues("a", "u").Observe(.5)
	zv.WithLabelValues("b", "u").Observe(.005)
	hv.WithLabelValues("b", "u").Observe(.005)
	for range 3 {
		hv.WithLabelValues("b", "u").Observe(0)
	}
	merged := collector{zv, func(ch chan<- prometheus.Metric) {
		c := make(chan prometheus.Metric, 4)
		zv.Collect(c)
		close(c)
		for m := range c {
			var pb dto.Metric
			if err := m.Write(&pb); err != nil {
				t.Fatal(err)
			}
			n := uint64(0)
			if LabelValue(&pb, "database") == "b" {
				n = 3
			}
			ch <- WithZeros(m, n, "database", "user")
		}
	}}
	got, want := gather(t, merged), gather(t, hv)
	if len(got) != 1 || len(want) != 1 || !proto.Equal(got[0], want[0]) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}

// TestWithZerosNotHistogram checks that a metric that is no histogram
// fails the scrape instead of being reported wrong.
func TestWithZerosNotHistogram(t *testing.T) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "c", Help: "C."})
	var pb dto.Metric
	if err := WithZeros(c, 1).Write(&pb); err == nil {
		t.Fatal("a counter with zeros merged in wrote no error")
	}
	if WithZeros(c, 0) != prometheus.Metric(c) {
		t.Fatal("no zeros should leave the metric alone")
	}
}

// collector is described as d and collected by f.
type collector struct {
	d prometheus.Collector
	f func(chan<- prometheus.Metric)
}

func (c collector) Describe(ch chan<- *prometheus.Desc) { c.d.Describe(ch) }
func (c collector) Collect(ch chan<- prometheus.Metric) { c.f(ch) }
