package tcpfront

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the front's Prometheus series, listed in README.md.
type metrics struct {
	connections prometheus.Gauge
	accepted    prometheus.Counter
	refused     prometheus.Counter
	// cancelsAtLimit counts CancelRequests served beyond MaxConns.
	cancelsAtLimit prometheus.Counter
}

func newMetrics() metrics {
	return metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pgquic_tcp_connections",
			Help: "TCP client connections currently admitted (running a session).",
		}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pgquic_tcp_accepted_total",
			Help: "TCP connections accepted, including those then refused.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pgquic_tcp_connections_refused_total",
			Help: "TCP connections refused with SQLSTATE 53300 because the front was at its connection limit.",
		}),
		cancelsAtLimit: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pgquic_tcp_cancels_at_limit_total",
			Help: "CancelRequests served on connections beyond the front's connection limit.",
		}),
	}
}

func (m metrics) register(reg prometheus.Registerer) error {
	var errs []error
	for _, c := range []prometheus.Collector{m.connections, m.accepted, m.refused, m.cancelsAtLimit} {
		errs = append(errs, reg.Register(c))
	}
	return errors.Join(errs...)
}
