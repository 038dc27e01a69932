package report

import "math"

// Synthetic returns a made-up but plausible report of the default scenario
// (500 TCP connections against 50 QUIC connections x 40 streams, 100 to
// 5,000 q/s over 30 s across 150 ms): TCP saturates near its Little's-law
// ceiling of about 3,300 q/s while QUIC keeps up. It exists so that tests
// and previews of the HTML page need no measurement; nothing in it was
// measured.
func Synthetic() *Report {
	sc := Scenario{
		RTTMs: 150, FromQPS: 100, ToQPS: 5000, DurationS: 30, PoolSize: 20,
		Query: "SELECT trunc(random() * 100) FROM generate_series(1, 10)",
	}
	const execMs, overheadMs = 0.4, 0.1
	perQuery := (sc.RTTMs + execMs + overheadMs) / 1000
	pool := float64(sc.PoolSize) / ((execMs + overheadMs) / 1000)
	mk := func(transport string, conns, streams int, tls bool, cpu float64, rss int64, emuCPU float64) Run {
		sessions := float64(conns * streams)
		run := Run{
			Transport: transport, Conns: conns, StreamsPerConn: streams, TLS: tls,
			PredictedCeilingQPS:     sessions / perQuery,
			PredictedPoolCeilingQPS: pool,
			ModelExecMs:             execMs, ModelOverheadMs: overheadMs,
			Client:   Client{PeakRSSBytes: rss, CPUSeconds: cpu, FDs: conns + 12},
			Emulator: &Usage{CPUSeconds: emuCPU},
		}
		// The service rate sits 2% under the prediction, as a real run's would.
		capacity := 0.98 * min(run.PredictedCeilingQPS, pool)
		var backlog float64
		var lat []float64
		for t := 0; t < int(sc.DurationS); t++ {
			offered := math.Round(sc.FromQPS + (sc.ToQPS-sc.FromQPS)*(float64(t)+0.5)/sc.DurationS)
			done := math.Round(min(backlog+offered, capacity))
			backlog += offered - done
			wait := 1000 * backlog / capacity
			s := Second{
				T: t, OfferedQPS: offered, CompletedQPS: done,
				InFlight: int64(math.Round(done * perQuery)), Backlog: int64(backlog),
				P50Ms: sc.RTTMs + 0.6 + wait/2, P99Ms: sc.RTTMs + 4 + wait, MaxMs: sc.RTTMs + 9 + wait*1.05,
				OldestQueuedMs:   wait,
				GeneratorLagMs:   0.2,
				ClientCPUSeconds: cpu / sc.DurationS * (0.3 + 1.4*float64(t)/sc.DurationS),
				ClientRSSBytes:   rss * int64(t+10) / int64(sc.DurationS+9),
				ClientFDs:        conns + 12,
			}
			if backlog == 0 && done >= 0.98*offered && offered > run.KneeQPS {
				run.KneeQPS = offered
			}
			run.PeakQPS = max(run.PeakQPS, done)
			run.Scheduled += int64(offered)
			run.Completed += int64(done)
			run.Seconds = append(run.Seconds, s)
			lat = append(lat, s.P50Ms)
		}
		run.Unfinished = run.Scheduled - run.Completed
		run.GeneratorLagMs = 0.4
		n := len(lat)
		run.LatencyMs = Latency{P50: lat[n/2], P90: lat[n*9/10], P99: run.Seconds[n-1].P99Ms, Max: run.Seconds[n-1].MaxMs, Mean: lat[n/2] * 1.1}
		return run
	}
	return &Report{
		Scenario: sc,
		Runs: []Run{
			mk(TransportTCP, 500, 1, true, 21.5, 180<<20, 9.1),
			mk(TransportQUIC, 50, 40, true, 14.2, 95<<20, 6.3),
		},
		Machine: &Machine{CPUs: 2, OS: "linux", Arch: "amd64"},
	}
}
