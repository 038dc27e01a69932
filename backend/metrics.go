package backend

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgquic/pgquic/internal/zerohist"
)

// Reasons a server connection is destroyed, used as the "reason" label of
// pgquic_backend_destroyed_total.
const (
	reasonDead     = "dead"     // the server closed it or sent something unsolicited, or a health check failed
	reasonLifetime = "lifetime" // older than ServerLifetime
	reasonIdle     = "idle"     // idle longer than ServerIdleTimeout above MinPool
	reasonError    = "error"    // the holder destroyed it (protocol or I/O error, client vanished mid-transaction)
	reasonTemplate = "template" // its database is a template, whose pool keeps no idle connection (template.go)
)

var destroyReasons = [...]string{reasonDead, reasonLifetime, reasonIdle, reasonError, reasonAdmin, reasonTemplate}

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
//	pgquic_backend_pool_saturation                                    gauge, connections in use / pool size, read at scrape time
//	pgquic_backend_query_duration_seconds                             histogram, from a client's request to its ReadyForQuery (ObserveQuery)
//	pgquic_backend_transaction_duration_seconds                       histogram, from a transaction's first request to the ReadyForQuery ending it (ObserveTransaction)
//
// A series labelled with a database and user exists while a pool with those
// labels does: when the last such pool closes (a wildcard pool retired, a
// Manager closed) its series are deleted, so client-chosen names cannot grow
// the number of series beyond the pools open at once. Unlabelled series
// about the pools themselves:
//
//	pgquic_backend_pools{route="named"|"wildcard"}                    gauge, pools open
//	pgquic_backend_pools_retired_total{reason="login_rejected"|"idle"} counter, wildcard pools retired
//	pgquic_backend_pools_refused_total                                counter, clients refused at MaxPools
type Metrics struct {
	acquires      *prometheus.CounterVec
	acquireWait   *prometheus.HistogramVec
	connects      *prometheus.CounterVec
	connectErrors *prometheus.CounterVec
	destroyed     *prometheus.CounterVec
	queryDur      *prometheus.HistogramVec
	txDur         *prometheus.HistogramVec

	pools        *prometheus.GaugeVec
	poolsRetired *prometheus.CounterVec
	poolsRefused prometheus.Counter

	connsDesc   *prometheus.Desc
	maxDesc     *prometheus.Desc
	waitingDesc *prometheus.Desc
	satDesc     *prometheus.Desc

	mu     sync.Mutex
	open   map[*Pool]struct{} // pools whose gauges Collect reads
	labels map[labelPair]int  // pools open per (database, user)
	// zeroWait counts, per (database, user), the acquires that did not
	// wait: observations of 0 in acquireWait that Collect merges in
	// (zerohist), so TryAcquire adds to a counter instead of observing.
	zeroWait map[labelPair]*atomic.Uint64
}

// labelPair is the database and user labels of a pool's series.
type labelPair struct{ database, user string }

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
			Help: "Server connections closed by the pool, by reason (dead, lifetime, idle, error, admin).",
		}, append(labels, "reason")),
		queryDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "query_duration_seconds",
			Help:    "Time from a client's request (a simple Query, or extended-protocol messages up to Sync) reaching the server connection to the server's ReadyForQuery: execution plus the pooler-to-server round trip.",
			Buckets: durationBuckets,
		}, labels),
		txDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "transaction_duration_seconds",
			Help:    "Time from a transaction's first request to the ReadyForQuery that ends it (an explicit block, or an implicit single-request transaction).",
			Buckets: durationBuckets,
		}, labels),
		connsDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "connections"),
			"Server connections by state (idle, in_use, constructing).", append(labels, "state"), nil),
		maxDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "connections_max"),
			"Maximum server connections of the pool (PoolSize).", labels, nil),
		waitingDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "acquires_waiting"),
			"Acquire calls in progress (waiting for a connection or connecting).", labels, nil),
		satDesc: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "pool_saturation"),
			"Server connections in use divided by the pool size: 1 means every connection is lent out and new transactions wait (see acquires_waiting).", labels, nil),
		pools: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "pools",
			Help: "Pools open, by kind of route (named database or wildcard).",
		}, []string{"route"}),
		poolsRetired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "pools_retired_total",
			Help: "Wildcard pools closed because the server refused their first login (login_rejected) or they went unused (idle).",
		}, []string{"reason"}),
		poolsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "pools_refused_total",
			Help: "Clients refused because a wildcard route already held max_pools pools.",
		}),
		open:     make(map[*Pool]struct{}),
		labels:   make(map[labelPair]int),
		zeroWait: make(map[labelPair]*atomic.Uint64),
	}
	for _, r := range [...]string{routeNamed, routeWildcard} {
		m.pools.WithLabelValues(r)
	}
	for _, r := range retireReasons {
		m.poolsRetired.WithLabelValues(r)
	}
	return m
}

// durationBuckets cover a local query (100 µs) to a long report (30 s).
var durationBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Values of the "route" label of pgquic_backend_pools.
const (
	routeNamed    = "named"
	routeWildcard = "wildcard"
)

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.acquires.Describe(ch)
	m.acquireWait.Describe(ch)
	m.connects.Describe(ch)
	m.connectErrors.Describe(ch)
	m.destroyed.Describe(ch)
	m.queryDur.Describe(ch)
	m.txDur.Describe(ch)
	m.pools.Describe(ch)
	m.poolsRetired.Describe(ch)
	m.poolsRefused.Describe(ch)
	ch <- m.connsDesc
	ch <- m.maxDesc
	ch <- m.waitingDesc
	ch <- m.satDesc
}

// Collect implements prometheus.Collector. Connection gauges are read from the
// pools here, at scrape time, so nothing is updated on the hot path. Pools
// with the same labels are summed so that a scrape never fails on duplicates.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.acquires.Collect(ch)
	m.collectAcquireWait(ch)
	m.connects.Collect(ch)
	m.connectErrors.Collect(ch)
	m.destroyed.Collect(ch)
	m.queryDur.Collect(ch)
	m.txDur.Collect(ch)
	m.pools.Collect(ch)
	m.poolsRetired.Collect(ch)
	m.poolsRefused.Collect(ch)

	m.mu.Lock()
	pools := make([]*Pool, 0, len(m.open))
	for p := range m.open {
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
		sat := 0.0
		if s.Max > 0 {
			sat = float64(s.InUse) / float64(s.Max)
		}
		ch <- prometheus.MustNewConstMetric(m.satDesc, prometheus.GaugeValue, sat, k.db, k.user)
	}
}

// collectAcquireWait collects acquireWait with each series' acquires that
// did not wait merged in as observations of 0.
func (m *Metrics) collectAcquireWait(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	zeros := make(map[labelPair]uint64, len(m.zeroWait))
	for k, n := range m.zeroWait {
		zeros[k] = n.Load()
	}
	m.mu.Unlock()
	hs := make(chan prometheus.Metric, 16)
	go func() {
		m.acquireWait.Collect(hs)
		close(hs)
	}()
	for h := range hs {
		var pb dto.Metric
		if err := h.Write(&pb); err != nil {
			ch <- prometheus.NewInvalidMetric(h.Desc(), err)
			continue
		}
		k := labelPair{zerohist.LabelValue(&pb, "database"), zerohist.LabelValue(&pb, "user")}
		ch <- zerohist.WithZeros(h, zeros[k], "database", "user")
	}
}

// poolMetrics are one pool's metric children with labels already bound. A
// nil *poolMetrics records nothing.
type poolMetrics struct {
	m             *Metrics
	pool          *Pool
	acquires      prometheus.Counter
	acquireWait   prometheus.Observer
	acquireZeros  *atomic.Uint64 // acquireWait's observations of 0 (Metrics.zeroWait)
	connects      prometheus.Counter
	connectErrors prometheus.Counter
	destroyed     map[string]prometheus.Counter
	queryDur      prometheus.Observer
	txDur         prometheus.Observer
}

// forPool binds labels for p and adds p to the scrape-time collector.
func (m *Metrics) forPool(p *Pool) *poolMetrics {
	if m == nil {
		return nil
	}
	db, user := p.database, p.user
	// Under mu so that a pool closing with the same labels cannot delete
	// the children between their creation here and the count below.
	m.mu.Lock()
	defer m.mu.Unlock()
	pm := &poolMetrics{
		m:             m,
		pool:          p,
		acquires:      m.acquires.WithLabelValues(db, user),
		acquireWait:   m.acquireWait.WithLabelValues(db, user),
		connects:      m.connects.WithLabelValues(db, user),
		connectErrors: m.connectErrors.WithLabelValues(db, user),
		destroyed:     make(map[string]prometheus.Counter, len(destroyReasons)),
		queryDur:      m.queryDur.WithLabelValues(db, user),
		txDur:         m.txDur.WithLabelValues(db, user),
	}
	for _, r := range destroyReasons {
		pm.destroyed[r] = m.destroyed.WithLabelValues(db, user, r)
	}
	k := labelPair{db, user}
	if m.zeroWait[k] == nil {
		m.zeroWait[k] = new(atomic.Uint64)
	}
	pm.acquireZeros = m.zeroWait[k]
	m.open[p] = struct{}{}
	m.labels[k]++
	return pm
}

// detach stops reporting the pool's connection gauges and, when no other
// open pool has the same labels, deletes the pool's series. It is called
// once, when the pool closes.
func (pm *poolMetrics) detach() {
	if pm == nil {
		return
	}
	m := pm.m
	db, user := pm.pool.database, pm.pool.user
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.open, pm.pool)
	k := labelPair{db, user}
	if m.labels[k]--; m.labels[k] > 0 {
		return
	}
	delete(m.labels, k)
	delete(m.zeroWait, k)
	m.acquires.DeleteLabelValues(db, user)
	m.acquireWait.DeleteLabelValues(db, user)
	m.connects.DeleteLabelValues(db, user)
	m.connectErrors.DeleteLabelValues(db, user)
	m.queryDur.DeleteLabelValues(db, user)
	m.txDur.DeleteLabelValues(db, user)
	for _, r := range destroyReasons {
		m.destroyed.DeleteLabelValues(db, user, r)
	}
}

// poolOpened counts a pool created by a Manager.
func (m *Metrics) poolOpened(wildcard bool) {
	if m != nil {
		m.pools.WithLabelValues(routeKind(wildcard)).Inc()
	}
}

// poolClosed counts a Manager's pool closed, at retirement or at Close.
func (m *Metrics) poolClosed(wildcard bool) {
	if m != nil {
		m.pools.WithLabelValues(routeKind(wildcard)).Dec()
	}
}

// poolRetired counts a wildcard pool retired for reason.
func (m *Metrics) poolRetired(reason string) {
	if m != nil {
		m.poolsRetired.WithLabelValues(reason).Inc()
	}
}

// poolRefused counts a client refused at MaxPools.
func (m *Metrics) poolRefused() {
	if m != nil {
		m.poolsRefused.Inc()
	}
}

func routeKind(wildcard bool) string {
	if wildcard {
		return routeWildcard
	}
	return routeNamed
}

func (pm *poolMetrics) acquired(start time.Time) {
	if pm == nil {
		return
	}
	pm.acquires.Inc()
	if start.IsZero() { // TryAcquire: no wait
		pm.acquireZeros.Add(1)
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

func (pm *poolMetrics) observeQuery(d time.Duration) {
	if pm != nil {
		pm.queryDur.Observe(d.Seconds())
	}
}

func (pm *poolMetrics) observeTransaction(d time.Duration) {
	if pm != nil {
		pm.txDur.Observe(d.Seconds())
	}
}
