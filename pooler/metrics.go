package pooler

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the pooler's Prometheus series. They are updated at session and
// transaction boundaries only, never per forwarded message.
type metrics struct {
	clients      prometheus.Gauge
	sessions     *prometheus.CounterVec
	transactions prometheus.Counter
	errors       *prometheus.CounterVec
	prepares     prometheus.Counter
	cancels      prometheus.Counter
	waitSeconds  prometheus.Histogram
	pins         *prometheus.CounterVec
	pinned       prometheus.Gauge
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
			Help: "Times a server connection was lent to a client and returned (transactions in transaction mode).",
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
		waitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "server_wait_seconds",
			Help:    "Time clients waited for a server connection.",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5, 30},
		}),
		pins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "pins_total",
			Help: "Times a transaction-mode client was pinned to its server connection, by the kind of session state that pinned it.",
		}, []string{"reason"}),
		pinned: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "pgquic", Subsystem: "pooler", Name: "pinned_clients",
			Help: "Transaction-mode clients currently pinned to their server connection.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.clients, m.sessions, m.transactions, m.errors, m.prepares, m.cancels, m.waitSeconds, m.pins, m.pinned} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
		}
	}
	return m, nil
}
