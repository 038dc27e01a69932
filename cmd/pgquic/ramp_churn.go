package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/loadgen"
	"github.com/pgquic/pgquic/loadgen/model"
	"github.com/pgquic/pgquic/loadgen/report"
	"github.com/pgquic/pgquic/loadgen/wan"
)

// runClientConfig is the configuration of one run's sessions: the
// transport's, and with --session-per-query the session path's (plain TCP,
// TCP+TLS, or QUIC with local startup and the edge's certificate).
func (rs *rampSession) runClientConfig(run rampRun) loadgen.ClientConfig {
	cc := rs.clientConfig(run.tr)
	if run.churn == "" {
		return cc
	}
	cc.SessionPerQuery = true
	switch run.churn {
	case model.TCP:
		cc.DisableTLS = true
	case model.TCPTLS:
		cc.DisableTLS = false
	case model.EdgeLocal:
		cc.LocalStartup, cc.CertFile, cc.KeyFile = true, rs.edgeCert, rs.edgeKey
	}
	return cc
}

// runLabel names a run in the output: its transport, or its session path.
func runLabel(run rampRun, cc loadgen.ClientConfig) string {
	if run.churn != "" {
		return string(run.churn)
	}
	return transportLabel(run.tr, cc.TLS())
}

// churnPrediction is the model's view of one session-per-query run.
type churnPrediction struct {
	roundTrips, connectRoundTrips int
	perQuery                      time.Duration
	sessions                      int     // concurrent sessions: the client's, within the pooler's and descriptors' limits
	limit                         string  // what bounds sessions
	ceiling                       float64 // sessions / perQuery
	ports                         float64 // model.PortCeiling across a real path; 0 when it does not apply
}

// churnPredict counts what a new session per query costs on run's path.
// The in-process pooler authenticates with trust; the edge path is trusted
// by certificate.
func (rs *rampSession) churnPredict(run rampRun) churnPrediction {
	cc := rs.runClientConfig(run)
	exec, overhead := rs.modelFor(run.tr)
	var p churnPrediction
	p.roundTrips, _ = model.ChurnRoundTrips(run.churn, model.AuthTrust) // the paths are the model's own
	p.connectRoundTrips, _ = model.ChurnConnectRoundTrips(run.churn, model.AuthTrust)
	p.perQuery = model.ChurnPerQuery(p.roundTrips, rs.rc.rtt, exec, overhead)
	p.sessions, p.limit = cc.Sessions(), "the client's concurrency"
	if m := config.DefaultMaxClientConn; m < p.sessions {
		p.sessions, p.limit = m, "the pooler's max_client_conn"
	}
	// A TCP session holds two descriptors of this process (the client's
	// socket and the in-process pooler's); the edge's share one UDP socket.
	if fds := fdLimit(); run.tr == loadgen.TCP && fds > 0 && fds/2 < p.sessions {
		p.sessions, p.limit = fds/2, "file descriptors (RLIMIT_NOFILE / 2)"
	}
	p.ceiling = model.Ceiling(p.sessions, p.perQuery)
	if run.tr == loadgen.TCP && rs.rc.wanMode == wan.ModePacket {
		p.ports = model.PortCeiling(ephemeralPorts())
	}
	return p
}

// applyChurn adds the session-per-query figures and the churn model's
// predictions to a run's report.
func (rs *rampSession) applyChurn(run rampRun, r *report.Run) {
	p := rs.churnPredict(run)
	exec, overhead := rs.modelFor(run.tr)
	r.SessionPath = string(run.churn)
	r.ModelRoundTrips, r.ModelConnectRoundTrips = p.roundTrips, &p.connectRoundTrips
	r.PredictedLatencyMs = msOf(p.perQuery)
	r.PredictedCeilingQPS = p.ceiling
	r.PredictedPortCeilingQPS = p.ports
	r.ModelExecMs, r.ModelOverheadMs = msOf(exec), msOf(overhead)
}

// printChurnModel prints the churn model for each session path.
func (rs *rampSession) printChurnModel() {
	w := rs.out
	fmt.Fprintln(w, "model, a new session per query (round trips k: connect + startup + query; ceiling: sessions / (k x RTT + execution + overhead)):")
	for _, run := range rs.rc.runs() {
		p := rs.churnPredict(run)
		fmt.Fprintf(w, "  %-10s k = %d (%d before the session is ready): latency %s; %s sessions (%s) / %s = %s q/s",
			run.churn, p.roundTrips, p.connectRoundTrips, fmtMs(p.perQuery), model.FormatQPS(float64(p.sessions)), p.limit,
			fmtMs(p.perQuery), model.FormatQPS(p.ceiling))
		if p.ports > 0 {
			fmt.Fprintf(w, "; ephemeral ports in TIME_WAIT: %s q/s", model.FormatQPS(p.ports))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "  not symmetric: the edge's QUIC connection is warm (opened before the run, as a long-lived edge keeps it), TCP pays its handshake per query;",
		"the pooler's own work per new session (startup, TLS) is not in the model")
}

// fdLimit is this process's soft RLIMIT_NOFILE, 0 when unknown.
func fdLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0
	}
	return int(rl.Cur)
}

// ephemeralPorts is the size of net.ipv4.ip_local_port_range (the
// packet-mode namespaces start with the kernel's default, 32768-60999,
// which the host usually keeps), 0 when unreadable.
func ephemeralPorts() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || hi < lo {
		return 0
	}
	return hi - lo + 1
}
