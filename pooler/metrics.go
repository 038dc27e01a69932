package pooler

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/zerohist"
)

// metrics are the pooler's Prometheus series. They are updated at session and
// transaction boundaries only, never per forwarded message.
type metrics struct {
	clients      prometheus.Gauge
	sessions     *prometheus.CounterVec
	transactions prometheus.Counter
	assignments  prometheus.Counter
	pipelined    prometheus.Counter
	errors       *prometheus.CounterVec
	prepares     prometheus.Counter
	cancels      prometheus.Counter
	waitSeconds  *zerohist.Histogram // a free connection at once is ObserveZero
	serverErrors *prometheus.CounterVec
	pins         *prometheus.CounterVec
	pinned       prometheus.Gauge
	zeroRTT      *prometheus.CounterVec // requests received in 0-RTT (zerortt.go)
	// catalogReads counts reads of a database's catalog for code behind
	// names by result; hidden the requests read as opaque for such code
	// (catalog.go), hiddenNamed and hiddenUnknown its two series.
	catalogReads  *prometheus.CounterVec
	hidden        *prometheus.CounterVec
	hiddenNamed   prometheus.Counter
	hiddenUnknown prometheus.Counter
	// sequenceDiscards counts the DISCARD SEQUENCES sent ahead of a
	// request that may read another client's nextval (sequences.go).
	sequenceDiscards prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		clients: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "clients",
			Help: "Client sessions currently open.",
		}),
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "sessions_total",
			Help: "Client sessions started, by front-end transport.",
		}, []string{"transport"}),
		transactions: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "transactions_total",
			Help: "Transactions clients completed (explicit blocks and implicit single-statement ones), in either pooling mode.",
		}),
		assignments: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "server_assignments_total",
			Help: "Times a server connection was lent to a client and returned (per transaction in transaction mode, per session in session mode).",
		}),
		pipelined: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "pipelined_requests_total",
			Help: "Client requests (complete implicit transactions) written on a busy server connection behind other clients' requests instead of waiting for a free one (cross-client pipelining).",
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "errors_total",
			Help: "Errors the pooler itself sent to clients, by SQLSTATE.",
		}, []string{"sqlstate"}),
		prepares: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "statement_prepares_total",
			Help: "Parse messages the pooler replayed on a server connection that lacked a client's prepared statement.",
		}),
		cancels: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "cancel_requests_total",
			Help: "CancelRequest packets received.",
		}),
		waitSeconds: zerohist.New(prometheus.HistogramOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "server_wait_seconds",
			Help:    "Time clients waited for a server connection.",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5, 30},
		}),
		serverErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "server_errors_total",
			Help: "ErrorResponses the server sent to clients (forwarded by the pooler), by SQLSTATE class (the code's first two characters: 23 integrity, 42 syntax or access, 57 operator intervention...).",
		}, []string{"class"}),
		pins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "pins_total",
			Help: "Times a transaction-mode client was pinned to its server connection, by the kind of session state that pinned it.",
		}, []string{"reason"}),
		pinned: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "pinned_clients",
			Help: "Transaction-mode clients currently pinned to their server connection.",
		}),
		catalogReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "catalog_reads_total",
			Help: "Reads of a database's catalog for the relations, types and operators whose use runs code the query text does not show, by result: ok (read in full), unchanged (its fingerprint showed no change since the last read), failed (also: no server connection free for the read within 10 s), or discarded (DDL came meanwhile).",
		}, []string{"result"}),
		hidden: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "hidden_code_requests_total",
			Help: "Transaction-mode statements treated as running code their text does not show, and so probed afterwards and never pipelined: named (the text names a relation, type or operator carrying such code) or catalog_unknown (the catalog was not known at the time).",
		}, []string{"reason"}),
		sequenceDiscards: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "sequence_discards_total",
			Help: "DISCARD SEQUENCES sent ahead of a transaction-mode request that may read sequence state (lastval, currval, or code the pooler cannot see) on a server connection other clients' requests ran on since.",
		}),
	}
	defer func() { // the series of the vectors kept, adopted or not
		m.hiddenNamed = m.hidden.WithLabelValues("named")
		m.hiddenUnknown = m.hidden.WithLabelValues("catalog_unknown")
	}()
	if reg == nil {
		return m, nil
	}
	// Several poolers may share one registry (tests, or a program running
	// two): the second one adopts the series the first registered, so both
	// count into what /metrics shows instead of into unregistered copies.
	var errs []error
	adopt(reg, &m.clients, &errs)
	adopt(reg, &m.sessions, &errs)
	adopt(reg, &m.transactions, &errs)
	adopt(reg, &m.assignments, &errs)
	adopt(reg, &m.pipelined, &errs)
	adopt(reg, &m.errors, &errs)
	adopt(reg, &m.prepares, &errs)
	adopt(reg, &m.cancels, &errs)
	adopt(reg, &m.waitSeconds, &errs)
	adopt(reg, &m.serverErrors, &errs)
	adopt(reg, &m.pins, &errs)
	adopt(reg, &m.pinned, &errs)
	adopt(reg, &m.catalogReads, &errs)
	adopt(reg, &m.hidden, &errs)
	adopt(reg, &m.sequenceDiscards, &errs)
	m.zeroRTT = newZeroRTTCounter()
	adopt(reg, &m.zeroRTT, &errs)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

// adopt registers *c with reg, replacing it by the collector already
// registered under the same description if there is one, and appends any
// other error to errs.
func adopt[C prometheus.Collector](reg prometheus.Registerer, c *C, errs *[]error) {
	var err error
	if *c, err = register(reg, *c); err != nil {
		*errs = append(*errs, err)
	}
}

// register registers c with reg and returns it, or the collector already
// registered under the same description when there is one of c's type.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("pooler: register metrics: %w", err)
}
