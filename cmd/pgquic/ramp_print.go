package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgquic/pgquic/loadgen"
	"github.com/pgquic/pgquic/loadgen/model"
	"github.com/pgquic/pgquic/loadgen/report"
	"github.com/pgquic/pgquic/loadgen/wan"
)

// printScenario prints what is about to be run.
func (rs *rampSession) printScenario() {
	rc := rs.rc
	arrivals := "evenly spaced"
	if rc.poisson {
		arrivals = "Poisson"
	}
	fmt.Fprintf(rs.out, "pgquic ramp: %s -> %s q/s over %v (%s arrivals), RTT %v", model.FormatQPS(rc.from),
		model.FormatQPS(rc.to), rc.duration, arrivals, rc.rtt)
	if rc.jitter > 0 {
		fmt.Fprintf(rs.out, " ± %v jitter", rc.jitter)
	}
	if rc.loss > 0 {
		what := "loss per packet each way"
		if rc.wanMode == wan.ModeRelay {
			what = "UDP loss (QUIC only: the relay never drops TCP)"
		}
		fmt.Fprintf(rs.out, ", %.2f%% %s", 100*rc.loss, what)
	}
	if rc.burstLoss > 0 {
		fmt.Fprintf(rs.out, ", burst loss %.2f%% in bursts of %g packets", 100*rc.burstLoss, rc.burstLen)
	}
	if rc.reorder > 0 {
		fmt.Fprintf(rs.out, ", %.2f%% reordered", 100*rc.reorder)
	}
	if rc.bandwidth > 0 {
		fmt.Fprintf(rs.out, ", bottleneck %s bit/s", model.FormatQPS(float64(rc.bandwidth)))
		if rc.queue > 0 {
			fmt.Fprintf(rs.out, " with a %d-byte queue", rc.queue)
		}
	}
	fmt.Fprintf(rs.out, "\nWAN emulation: %s mode", rc.wanMode)
	if rc.wanMode == wan.ModePacket {
		fmt.Fprintf(rs.out, " (IP packets between network namespaces: TCP and QUIC cross the same path)")
	}
	if rc.wanNote != "" {
		fmt.Fprintf(rs.out, " (%s)", rc.wanNote)
	}
	fmt.Fprintf(rs.out, "\nquery: %s\n", rc.query)
	switch {
	case rs.scheduling == "realtime":
		fmt.Fprintln(rs.out, "scheduling: real-time round-robin for this process and its children (emulators, PostgreSQL); --realtime=false for the default scheduler")
	case rc.realtime && rs.env.realtime != nil:
		fmt.Fprintln(rs.out, "scheduling: default (real-time scheduling was not permitted: run as root or with CAP_SYS_NICE); latency tails include waits for CPU time slices between the processes sharing this host")
	}
}

// enterScheduling moves the ramp to real-time scheduling when asked and
// permitted, and records what it runs under.
func (rs *rampSession) enterScheduling() {
	rs.scheduling = "normal"
	if !rs.rc.realtime || rs.env.realtime == nil {
		return
	}
	if err := rs.env.realtime(); err != nil {
		rs.logger.Info("ramp: real-time scheduling not available", "err", err)
		return
	}
	rs.scheduling = "realtime"
}

// printModel prints the calibration and the model's prediction for each
// transport.
func (rs *rampSession) printModel() {
	rc := rs.rc
	w := rs.out
	if rc.calibrate > 0 {
		fmt.Fprintf(w, "calibration (median of up to %d sequential queries, without the WAN):", rc.calibrate)
		if rs.measured {
			fmt.Fprintf(w, " execution %s on PostgreSQL directly;", fmtMs(rs.exec))
		}
		for i, tr := range rc.transports() {
			exec, overhead := rs.modelFor(tr)
			sep := ","
			if i == 0 {
				sep = ""
			}
			label := transportLabel(tr, rs.clientConfig(tr).TLS())
			if rs.measured {
				fmt.Fprintf(w, "%s %s overhead %s", sep, label, fmtMs(overhead))
			} else {
				fmt.Fprintf(w, "%s %s execution + overhead %s", sep, label, fmtMs(exec))
			}
		}
		fmt.Fprintln(w)
		if !rs.measured {
			fmt.Fprintln(w, "  (without --dsn the target's execution time and overhead cannot be told apart)")
		}
	} else {
		fmt.Fprintln(w, "calibration skipped (--calibrate 0): the model counts the round trip only")
	}
	if rc.churn {
		rs.printChurnModel()
		return
	}
	fmt.Fprintln(w, "model (Little's law: sessions / (RTT + execution + overhead)):")
	for _, tr := range rc.transports() {
		cc := rs.clientConfig(tr)
		exec, overhead := rs.modelFor(tr)
		ceiling, _ := rs.predictions(tr)
		fmt.Fprintf(w, "  %-8s %s sessions / %s = %s q/s\n", transportLabel(tr, cc.TLS()),
			sessionsText(cc), fmtMs(rc.rtt+exec+overhead), model.FormatQPS(ceiling))
	}
	if rc.poolSize > 0 {
		for _, tr := range rc.transports() {
			exec, overhead := rs.modelFor(tr)
			_, pool := rs.predictions(tr)
			if pool > 0 {
				depth := ""
				if !rc.targetMode() && rc.pipelineDepth > 1 {
					depth = fmt.Sprintf(" x pipeline depth %d (at most)", rc.pipelineDepth)
				}
				fmt.Fprintf(w, "  %-8s pool_size %d / %s%s = %s q/s (via %s)\n", "pool", rc.poolSize, fmtMs(exec+overhead), depth,
					model.FormatQPS(pool), transportLabel(tr, rs.clientConfig(tr).TLS()))
			}
		}
	}
}

// sessionsText describes a transport's sessions: "500" or "50 x 40 = 2,000".
func sessionsText(cc loadgen.ClientConfig) string {
	if cc.Transport == loadgen.QUIC {
		return fmt.Sprintf("%d x %d = %s", cc.Conns, max(cc.Streams, 1), model.FormatQPS(float64(cc.Sessions())))
	}
	return model.FormatQPS(float64(cc.Sessions()))
}

// printProgress prints the live line of one second of a run. It runs on
// the load generator's dispatcher goroutine, so it only formats and writes.
func printProgress(w io.Writer, label string, p loadgen.Progress) {
	lat := "p50      -  p99      -"
	if p.Done > 0 {
		lat = fmt.Sprintf("p50 %6s  p99 %6s", fmtMs(p.P50), fmtMs(p.P99))
	}
	fmt.Fprintf(w, "%-7s %3ds  offered %6s/s  done %6s/s  in flight %5d  backlog %6d  %s  cpu %.2f\n",
		label, int(p.Elapsed.Round(time.Second)/time.Second), model.FormatQPS(float64(p.Offered)),
		model.FormatQPS(float64(p.Done)), p.InFlight, p.Backlog, lat, p.CPU)
}

// printSummary prints one column per transport: the model beside the
// measurement.
func printSummary(w io.Writer, rep *report.Report, results []rampResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	row := func(name string, cell func(r *rampResult) string) {
		cells := []string{name}
		for i := range results {
			cells = append(cells, cell(&results[i]))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	row("", func(r *rampResult) string { return r.label })
	row("sessions", func(r *rampResult) string {
		if r.run.Transport == report.TransportQUIC {
			return fmt.Sprintf("%d x %d = %s", r.run.Conns, r.run.StreamsPerConn, model.FormatQPS(float64(r.run.Sessions())))
		}
		return model.FormatQPS(float64(r.run.Sessions()))
	})
	churn := len(results) > 0 && results[0].run.NewSessions != nil
	if churn {
		row("model: round trips per query", func(r *rampResult) string {
			return fmt.Sprintf("%d (%d to connect)", r.run.ModelRoundTrips, r.run.ConnectRoundTrips())
		})
		row("model: latency k x RTT + exec", func(r *rampResult) string { return trimFloat(r.run.PredictedLatencyMs) + " ms" })
	}
	row("predicted ceiling", func(r *rampResult) string { return model.FormatQPS(r.run.PredictedCeilingQPS) + " q/s" })
	if churn {
		row("predicted port ceiling", func(r *rampResult) string {
			if r.run.PredictedPortCeilingQPS <= 0 {
				return "-"
			}
			return model.FormatQPS(r.run.PredictedPortCeilingQPS) + " q/s"
		})
	}
	row("predicted pool ceiling", func(r *rampResult) string {
		if r.run.PredictedPoolCeilingQPS <= 0 {
			return "-"
		}
		return model.FormatQPS(r.run.PredictedPoolCeilingQPS) + " q/s"
	})
	row("measured knee", func(r *rampResult) string {
		switch {
		case r.run.KneeQPS <= 0:
			return "none (never kept up)"
		case keptUpToEnd(&r.run, r.res):
			return model.FormatQPS(r.run.KneeQPS) + " q/s (kept up to the end of the ramp)"
		}
		s := model.FormatQPS(r.run.KneeQPS) + " q/s"
		if eff := effectiveCeiling(&r.run); eff > 0 {
			s += fmt.Sprintf(" (%.0f%% of predicted)", 100*r.run.KneeQPS/eff)
		}
		return s
	})
	row("peak completed", func(r *rampResult) string { return model.FormatQPS(r.run.PeakQPS) + " q/s" })
	row("scheduled", func(r *rampResult) string { return model.FormatQPS(float64(r.run.Scheduled)) })
	row("completed", func(r *rampResult) string {
		return fmt.Sprintf("%s (%s)", model.FormatQPS(float64(r.run.Completed)), pct(r.run.Completed, r.run.Scheduled))
	})
	row("errors", func(r *rampResult) string {
		s := model.FormatQPS(float64(r.run.Errors))
		if r.run.Errors > 0 && r.res.FirstError != "" {
			s += " (first: " + truncate(r.res.FirstError, 60) + ")"
		}
		return s
	})
	row("unfinished", func(r *rampResult) string {
		return fmt.Sprintf("%s (%s)", model.FormatQPS(float64(r.run.Unfinished)), pct(r.run.Unfinished, r.run.Scheduled))
	})
	row("latency p50 / p99", func(r *rampResult) string {
		return fmt.Sprintf("%s / %s ms", trimFloat(r.run.LatencyMs.P50), trimFloat(r.run.LatencyMs.P99))
	})
	row("latency max / mean", func(r *rampResult) string {
		return fmt.Sprintf("%s / %s ms", trimFloat(r.run.LatencyMs.Max), trimFloat(r.run.LatencyMs.Mean))
	})
	if churn {
		row("new sessions", func(r *rampResult) string {
			if r.run.NewSessions == nil {
				return "-"
			}
			return model.FormatQPS(float64(*r.run.NewSessions))
		})
		row("connect p50 / p99 (model)", func(r *rampResult) string {
			if r.run.ConnectMs == nil {
				return "-"
			}
			return fmt.Sprintf("%s / %s ms (%s)", trimFloat(r.run.ConnectMs.P50), trimFloat(r.run.ConnectMs.P99),
				trimFloat(float64(r.run.ConnectRoundTrips())*rep.Scenario.RTTMs))
		})
	}
	row("client CPU", func(r *rampResult) string {
		s := fmt.Sprintf("%.1f s", r.run.Client.CPUSeconds)
		if el := r.res.Elapsed.Seconds(); el > 0 {
			s += fmt.Sprintf(" (%.2f cores)", r.run.Client.CPUSeconds/el)
		}
		return s
	})
	row("client peak RSS / fds", func(r *rampResult) string {
		return fmt.Sprintf("%s / %d", model.FormatBytes(r.run.Client.PeakRSSBytes), r.run.Client.FDs)
	})
	row("emulator CPU", func(r *rampResult) string {
		if r.run.Emulator == nil {
			return "-"
		}
		s := fmt.Sprintf("%.1f s", r.run.Emulator.CPUSeconds)
		if el := r.res.Elapsed.Seconds(); el > 0 {
			s += fmt.Sprintf(" (%.2f cores)", r.run.Emulator.CPUSeconds/el)
		}
		return s
	})
	row("emulator lateness / hop", func(r *rampResult) string {
		if r.latePkt == 0 {
			return "-"
		}
		return fmt.Sprintf("%s mean, %s max", fmtMs(r.latency), fmtMs(r.lateMax))
	})
	row("path: sent / retransmitted / lost", func(r *rampResult) string {
		p := r.run.Path
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%d / %d / %d packets", p.SentPackets, p.Retransmits, p.LostPackets)
	})
	row("path: srtt / emulator drops", func(r *rampResult) string {
		p := r.run.Path
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%s ms / %d", trimFloat(p.SRTTMs), p.EmulatorDrops)
	})
	if rep.Scenario.BandwidthBps > 0 {
		row("bottleneck queue delay", func(r *rampResult) string {
			p := r.run.Path
			if p == nil {
				return "-"
			}
			return fmt.Sprintf("%s ms mean, %s ms max, %d dropped", trimFloat(p.QueueDelayMs), trimFloat(p.QueueDelayMaxMs), p.QueueDrops)
		})
	}
	row("generator lag (max)", func(r *rampResult) string {
		s := trimFloat(r.run.GeneratorLagMs) + " ms"
		if r.run.GeneratorFellBehind {
			s += " (fell behind)"
		}
		return s
	})
	_ = tw.Flush()
	var notes []string
	for i := range results {
		r := &results[i]
		if r.run.Interrupted {
			notes = append(notes, r.label+" was interrupted: its counts cover what had been scheduled by then")
		}
		if r.run.GeneratorFellBehind {
			notes = append(notes, r.label+": the load generator fell behind its schedule (more than 1% of queries released over 10 ms late): "+
				"the offered load was burstier than scheduled, and this process was short of CPU")
		}
		if r.run.Reconnects > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d sessions reconnected during the run", r.label, r.run.Reconnects))
		}
		for _, m := range r.run.Migrations {
			notes = append(notes, migrationNote(r.label, m, r.run.LatencyMs.P50))
		}
	}
	if churn {
		notes = append(notes, "a new session per query: latency counts each session's set-up; the edge-local path runs over a warm QUIC connection "+
			"(opened before the run, as a long-lived edge keeps it), the TCP paths pay their handshakes per query")
	}
	notes = append(notes, "WAN emulation: "+rep.Scenario.WAN+" mode")
	if rep.Scenario.WANNote != "" {
		notes[len(notes)-1] += " (" + rep.Scenario.WANNote + ")"
	}
	if len(rep.Runs) > 0 && rep.Runs[0].Target == "" {
		notes = append(notes, "client CPU, RSS and fds include the in-process pooler; the emulator runs as a child process, measured apart")
	}
	for _, n := range notes {
		fmt.Fprintln(w, "note: "+n)
	}
}

// keptUpToEnd reports whether the last full second of the schedule kept
// up: the knee then lies at or beyond the highest rate offered, whatever
// the first seconds of a steep ramp across a long round trip did.
func keptUpToEnd(r *report.Run, res *loadgen.Result) bool {
	if res.Canceled {
		return false
	}
	if res.KeptUp {
		return true
	}
	last := int(res.Schedule.Duration/time.Second) - 1
	if last < 0 || last >= len(r.Seconds) {
		return false
	}
	return r.KneeQPS > 0 && r.KneeQPS >= r.Seconds[last].OfferedQPS
}

// effectiveCeiling is the lower of a run's predicted ceilings.
func effectiveCeiling(r *report.Run) float64 {
	eff := r.PredictedCeilingQPS
	for _, p := range []float64{r.PredictedPoolCeilingQPS, r.PredictedPortCeilingQPS} {
		if p > 0 && (eff == 0 || p < eff) {
			eff = p
		}
	}
	return eff
}

func pct(n, of int64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f%%", 100*float64(n)/float64(of))
}

// fmtMs prints a duration in milliseconds with two decimals below 10 ms.
func fmtMs(d time.Duration) string {
	ms := msOf(d)
	if ms < 10 {
		return fmt.Sprintf("%.2f ms", ms)
	}
	return fmt.Sprintf("%.1f ms", ms)
}

// trimFloat prints a millisecond figure with one decimal.
func trimFloat(x float64) string {
	return strings.TrimSuffix(fmt.Sprintf("%.1f", x), ".0")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
