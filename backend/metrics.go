package backend

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a server connection is destroyed, used as the "reason" label of
// pgquic_backend_destroyed_total.
const (
	reasonDead     = "dead"     // the server closed it or sent something unsolicited, or a health check failed
	reasonLifetime = "lifetime" // older than ServerLifetime
	reasonIdle     = "idle"     // idle longer than ServerIdleTimeout above MinPool
	reasonError    = "error"    // the holder destroyed it (protocol or I/O error, client vanished mid-transaction)
)

var destroyReasons = [...]string{reasonDead, reasonLifetime, reasonIdle, reasonError}

// Metrics holds the backend package's Prometheus metrics. One Metrics serves
// any number of pools; each pool binds its label values once at creation so
// the Acquire path only increments counters. A nil *Metrics is valid and
// records nothing.
//
// Series (labels database and user are the server-side database and user):
//
//	pgquic_backend_connections{state="idle"|"in_use"|"constructing"} gauge, read from the pools at scrape time
//	pgquic_backend_connections_max                                    gauge, the pool size
//	pgquic_backend_acquires_waiting                                   gauge, Acquire calls in progress
//	pgquic_backend_acquires_total                                     counter, successful Acquire calls
//	pgquic_backend_acquire_wait_seconds                               histogram, time spent in Acquire
//	pgquic_backend_connects_total                                     counter, server connections opened
//	pgquic_backend_connect_errors_total                               counter, failed connection attempts
//	pgquic_backend_destroyed_total{reason="dead"|"lifetime"|"idle"|"error"} counter, connections closed
type Metrics struct {
	acquires      *prometheus.CounterVec
	acquireWait   *prometheus.HistogramVec
	connects      *prometheus.CounterVec
	connectErrors *prometheus.CounterVec
	destroyed     *prometheus.CounterVec

	connsDesc   *prometheus.Desc
	maxDesc     *prometheus.Desc
	waitingDesc *prometheus.Desc

	mu    sync.Mutex
	pools map[*Pool]struct{}
}

// NewMetrics creates the backend metrics and registers them with reg,
// panicking if they are already registered there (a wiring bug). A nil reg
// creates working but unregistered metrics (useful in tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := newMetrics()
	if reg != nil {
		reg.MustRegister(m)
	}
	return m
}

// newMetrics creates unregistered metrics.
func newMetrics() *Metrics {
	const ns, sub = "pgquic", "backend"
	labels := []string{"database", "user"}
	m := &Metrics{
		acquires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "acquires_total",
			Help: "Server connections handed out by Acquire.",
		}, labels),
		acquireWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "acquire_wait_seconds",
			Help:    "Time spent in Acquire, including waiting for a free connection and connecting.",
			Buckets: []float64{.00001, .00005, .0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5},
		}, labels),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "connects_total",
			Help: "Server connections opened and authenticated.",
		}, labels),
		connectErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "connect_errors_total",
			Help: "Failed attempts to open a server connection.",
		}, labels),
		destroyed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "destroyed_total",
			Help: "Server connections closed by the pool, by reason (dead, lifetime, idle, error).",
		}, append(labels, "reason")),
		connsDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "connections"),
			"Server connections by state (idle, in_use, constructing).", append(labels, "state"), nil),
		maxDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "connections_max"),
			"Maximum server connections of the pool (PoolSize).", labels, nil),
		waitingDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "acquires_waiting"),
			"Acquire calls in progress (waiting for a connection or connecting).", labels, nil),
		pools: make(map[*Pool]struct{}),
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.acquires.Describe(ch)
	m.acquireWait.Describe(ch)
	m.connects.Describe(ch)
	m.connectErrors.Describe(ch)
	m.destroyed.Describe(ch)
	ch <- m.connsDesc
	ch <- m.maxDesc
	ch <- m.waitingDesc
}

// Collect implements prometheus.Collector. Connection gauges are read from the
// pools here, at scrape time, so nothing is updated on the hot path. Pools
// with the same labels are summed so that a scrape never fails on duplicates.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.acquires.Collect(ch)
	m.acquireWait.Collect(ch)
	m.connects.Collect(ch)
	m.connectErrors.Collect(ch)
	m.destroyed.Collect(ch)

	m.mu.Lock()
	pools := make([]*Pool, 0, len(m.pools))
	for p := range m.pools {
		pools = append(pools, p)
	}
	m.mu.Unlock()

	type key struct{ db, user string }
	sums := make(map[key]Stats, len(pools))
	for _, p := range pools {
		s := p.Stat()
		k := key{s.Database, s.User}
		a := sums[k]
		a.Idle += s.Idle
		a.InUse += s.InUse
		a.Constructing += s.Constructing
		a.Max += s.Max
		a.Waiting += s.Waiting
		sums[k] = a
	}
	for k, s := range sums {
		ch <- prometheus.MustNewConstMetric(m.connsDesc, prometheus.GaugeValue, float64(s.Idle), k.db, k.user, "idle")
		ch <- prometheus.MustNewConstMetric(m.connsDesc, prometheus.GaugeValue, float64(s.InUse), k.db, k.user, "in_use")
		ch <- prometheus.MustNewConstMetric(m.connsDesc, prometheus.GaugeValue, float64(s.Constructing), k.db, k.user, "constructing")
		ch <- prometheus.MustNewConstMetric(m.maxDesc, prometheus.GaugeValue, float64(s.Max), k.db, k.user)
		ch <- prometheus.MustNewConstMetric(m.waitingDesc, prometheus.GaugeValue, float64(s.Waiting), k.db, k.user)
	}
}

// poolMetrics are one pool's metric children with labels already bound. A
// nil *poolMetrics records nothing.
type poolMetrics struct {
	m             *Metrics
	pool          *Pool
	acquires      prometheus.Counter
	acquireWait   prometheus.Observer
	connects      prometheus.Counter
	connectErrors prometheus.Counter
	destroyed     map[string]prometheus.Counter
}

// forPool binds labels for p and adds p to the scrape-time collector.
func (m *Metrics) forPool(p *Pool) *poolMetrics {
	if m == nil {
		return nil
	}
	db, user := p.database, p.user
	pm := &poolMetrics{
		m:             m,
		pool:          p,
		acquires:      m.acquires.WithLabelValues(db, user),
		acquireWait:   m.acquireWait.WithLabelValues(db, user),
		connects:      m.connects.WithLabelValues(db, user),
		connectErrors: m.connectErrors.WithLabelValues(db, user),
		destroyed:     make(map[string]prometheus.Counter, len(destroyReasons)),
	}
	for _, r := range destroyReasons {
		pm.destroyed[r] = m.destroyed.WithLabelValues(db, user, r)
	}
	m.mu.Lock()
	m.pools[p] = struct{}{}
	m.mu.Unlock()
	return pm
}

// detach stops reporting the pool's connection gauges.
func (pm *poolMetrics) detach() {
	if pm == nil {
		return
	}
	pm.m.mu.Lock()
	delete(pm.m.pools, pm.pool)
	pm.m.mu.Unlock()
}

func (pm *poolMetrics) acquired(start time.Time) {
	if pm == nil {
		return
	}
	pm.acquires.Inc()
	if start.IsZero() { // TryAcquire: no wait
		pm.acquireWait.Observe(0)
		return
	}
	pm.acquireWait.Observe(time.Since(start).Seconds())
}

func (pm *poolMetrics) connected() {
	if pm != nil {
		pm.connects.Inc()
	}
}

func (pm *poolMetrics) connectFailed() {
	if pm != nil {
		pm.connectErrors.Inc()
	}
}

func (pm *poolMetrics) destroyedFor(reason string) {
	if pm != nil {
		pm.destroyed[reason].Inc()
	}
}
