package loadgen

import (
	"time"

	"github.com/pgquic/pgquic/loadgen/report"
)

// ReportRun describes the measurement in the ramp report's terms. c, the
// clients the run used, fills the transport, connection counts, TLS and
// connect times; it may be nil. The model's predictions, the target and
// the emulator's and pooler's CPU are left for the caller, which knows them.
func (r *Result) ReportRun(c *Clients) report.Run {
	run := report.Run{
		KneeQPS:             r.KneeQPS,
		Scheduled:           int64(r.Scheduled),
		Completed:           int64(r.Completed),
		Errors:              int64(r.Errors),
		Unfinished:          int64(r.Unfinished),
		Interrupted:         r.Canceled,
		PeakQPS:             r.PeakQPS,
		GeneratorLagMs:      ms(r.Lag.Max),
		GeneratorFellBehind: r.Lag.FellBehind,
		LatencyMs: report.Latency{
			P50:  ms(r.Latency.P50),
			P90:  ms(r.Latency.P90),
			P99:  ms(r.Latency.P99),
			Max:  ms(r.Latency.Max),
			Mean: ms(r.Latency.Mean),
		},
		Client: report.Client{
			PeakRSSBytes: r.Client.PeakRSS,
			CPUSeconds:   r.Client.CPU.Seconds(),
			FDs:          r.Client.PeakFDs,
		},
		Seconds: make([]report.Second, len(r.Windows)),
	}
	if len(r.ErrorKinds) > 0 {
		run.ErrorKinds = make(map[string]int64, len(r.ErrorKinds))
		for k, n := range r.ErrorKinds {
			run.ErrorKinds[k] = int64(n)
		}
	}
	if c != nil {
		cfg := c.Config()
		run.Transport = string(cfg.Transport)
		run.Conns = cfg.Conns
		run.StreamsPerConn = cfg.Streams
		run.TLS = cfg.TLS()
		run.Reconnects = c.Reconnects()
		run.Connect = &report.Connect{
			Sessions:  c.Stats.Sessions,
			TotalMs:   ms(c.Stats.Total),
			P50Ms:     ms(c.Stats.P50),
			MaxMs:     ms(c.Stats.Max),
			QUICConns: c.Stats.QUICConns,
		}
		if cfg.SessionPerQuery {
			st := c.ChurnStats()
			run.NewSessions = &st.NewSessions
			run.ConnectMs = &report.ConnectLatency{P50: ms(st.P50), P99: ms(st.P99)}
		}
	}
	for i, w := range r.Windows {
		run.Seconds[i] = report.Second{
			T:                w.K,
			OfferedQPS:       float64(w.Offered),
			CompletedQPS:     float64(w.Throughput),
			InFlight:         int64(w.InFlight),
			Backlog:          int64(w.Backlog),
			P50Ms:            ms(w.P50),
			P99Ms:            ms(w.P99),
			MaxMs:            ms(w.Max),
			ErrorsQPS:        float64(w.Failures),
			OldestQueuedMs:   ms(w.OldestQueued),
			GeneratorLagMs:   ms(w.MaxLag),
			ClientCPUSeconds: w.CPU.Seconds(),
			ClientRSSBytes:   w.RSS,
			ClientFDs:        w.FDs,
		}
	}
	return run
}

// ms converts a duration to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
