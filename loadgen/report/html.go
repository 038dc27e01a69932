package report

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
	"time"

	"github.com/pgquic/pgquic/loadgen/model"
)

// WriteHTML writes r as one self-contained HTML page: the scenario, a table
// of the model's predictions beside the measurements, and one SVG chart per
// question a reader has (latency over time, achieved against offered rate
// with the predicted ceilings, backlog and in-flight queries, CPU and
// memory). Charts are drawn with gonum/plot and inlined; the page loads
// nothing from the network, so it can be mailed, archived or opened
// offline. A report that breaks the accounting rule (see Validate) is
// refused.
func WriteHTML(w io.Writer, r *Report) error {
	if err := r.Validate(); err != nil {
		return err
	}
	charts, err := renderCharts(r)
	if err != nil {
		return err
	}
	data := pageData{Report: r, Charts: charts}
	for i := range r.Runs {
		data.Runs = append(data.Runs, newRunView(r, i))
	}
	if err := pageTemplate.Execute(w, data); err != nil {
		return fmt.Errorf("write HTML report: %w", err)
	}
	return nil
}

// pageData is what the page template renders.
type pageData struct {
	Report *Report
	Charts []chart
	Runs   []runView
}

// HasChurn tells whether any run opened a new session per query.
func (d pageData) HasChurn() bool {
	for _, r := range d.Report.Runs {
		if r.NewSessions != nil {
			return true
		}
	}
	return false
}

// HasPath tells whether any run measured its path (packet mode).
func (d pageData) HasPath() bool {
	for _, r := range d.Report.Runs {
		if r.Path != nil {
			return true
		}
	}
	return false
}

// HasMigrations tells whether any run moved its connections to a new
// address (`pgquic ramp --migrate-at`).
func (d pageData) HasMigrations() bool {
	for _, r := range d.Report.Runs {
		if len(r.Migrations) > 0 {
			return true
		}
	}
	return false
}

// migrationsText lists a run's moves: when, and the worst latency around
// each, or "-".
func migrationsText(r *Run) string {
	if len(r.Migrations) == 0 {
		return "-"
	}
	var parts []string
	for _, m := range r.Migrations {
		s := fmt.Sprintf("at %.1f s: max %s", m.AtS, msText(m.MaxMsAround))
		if m.Error != "" {
			s += " (not every connection moved)"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// runView holds a run's figures as the page prints them.
type runView struct {
	Name, Color   string
	Sessions      string
	Predicted     string
	Pool          string
	Effective     string
	PerQuery      string
	Knee          string
	KneeNote      string
	Peak          string
	Accounting    string
	Latency       []string // p50, p90, p99, max, mean
	GeneratorLag  string
	FellBehind    bool
	Interrupted   bool
	Errors        int64
	ClientCPU     string
	CPUPerKQuery  string
	PeakRSS       string
	FDs           string
	EmulatorCPU   string
	PoolerCPU     string
	Target        string
	LittleExample string
	PathPackets   string
	PathRTT       string
	LossInflation string
	Bottleneck    string
	Migrations    string
	// Session-per-query runs only.
	Churn          bool
	RoundTrips     string
	PredictedLat   string
	MeasuredLat    string
	NewSessions    string
	ConnectLatency string
	PortCeiling    string
	PoolerClients  string
}

func newRunView(rep *Report, i int) runView {
	r := &rep.Runs[i]
	c := runColor(rep, i)
	v := runView{
		Name:        runLabel(rep, i),
		Color:       fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B),
		Predicted:   qps(r.PredictedCeilingQPS),
		Pool:        qps(r.PredictedPoolCeilingQPS),
		Peak:        qps(r.PeakQPS),
		FellBehind:  r.GeneratorFellBehind,
		Interrupted: r.Interrupted,
		Errors:      r.Errors,
		Target:      r.Target,
		Accounting: fmt.Sprintf("%s = %s + %s + %s", count(r.Scheduled), count(r.Completed),
			count(r.Errors), count(r.Unfinished)),
		GeneratorLag: msText(r.GeneratorLagMs),
		ClientCPU:    fmt.Sprintf("%.1f s", r.Client.CPUSeconds),
		PeakRSS:      model.FormatBytes(r.Client.PeakRSSBytes),
		FDs:          count(int64(r.Client.FDs)),
		EmulatorCPU:  "not measured",
		Migrations:   migrationsText(r),
		PoolerCPU:    "not measured apart",
	}
	if r.StreamsPerConn > 1 || r.Transport == TransportQUIC {
		v.Sessions = fmt.Sprintf("%s connections x %d streams = %s", count(int64(r.Conns)), max(r.StreamsPerConn, 1), count(int64(r.Sessions())))
	} else {
		v.Sessions = fmt.Sprintf("%s connections", count(int64(r.Conns)))
	}
	if r.TLS {
		v.Sessions += ", TLS"
	} else {
		v.Sessions += ", no TLS"
	}
	eff := r.PredictedCeilingQPS
	for _, p := range []float64{r.PredictedPoolCeilingQPS, r.PredictedPortCeilingQPS} {
		if p > 0 && (eff == 0 || p < eff) {
			eff = p
		}
	}
	v.Effective = qps(eff)
	perQuery := rep.Scenario.RTTMs + r.ModelExecMs + r.ModelOverheadMs
	v.PerQuery = fmt.Sprintf("%s + %s + %s = %s ms", trimMs(rep.Scenario.RTTMs), trimMs(r.ModelExecMs),
		trimMs(r.ModelOverheadMs), trimMs(perQuery))
	if r.NewSessions != nil {
		// A new session per query: k round trips, not one.
		k := float64(r.ModelRoundTrips)
		connectRTs := r.ConnectRoundTrips()
		perQuery = k*rep.Scenario.RTTMs + r.ModelExecMs + r.ModelOverheadMs
		v.PerQuery = fmt.Sprintf("%d x %s + %s + %s = %s ms", r.ModelRoundTrips, trimMs(rep.Scenario.RTTMs), trimMs(r.ModelExecMs),
			trimMs(r.ModelOverheadMs), trimMs(perQuery))
		v.Churn = true
		v.RoundTrips = fmt.Sprintf("%d (%d before the session is ready)", r.ModelRoundTrips, connectRTs)
		v.PredictedLat = msText(r.PredictedLatencyMs)
		v.MeasuredLat = msText(r.LatencyMs.P50)
		v.NewSessions = count(*r.NewSessions)
		v.ConnectLatency = "-"
		if c := r.ConnectMs; c != nil {
			v.ConnectLatency = fmt.Sprintf("%s / %s (model %s)", msText(c.P50), msText(c.P99),
				msText(float64(connectRTs)*rep.Scenario.RTTMs))
		}
		v.PortCeiling = qps(r.PredictedPortCeilingQPS)
		v.PoolerClients = "not checked"
		if n := r.PoolerClientsAfter; n != nil {
			v.PoolerClients = count(int64(*n))
		}
	}
	if perQuery > 0 && r.PredictedCeilingQPS > 0 {
		v.LittleExample = fmt.Sprintf("%s: %s sessions / %s ms = %s q/s", v.Name, count(int64(r.Sessions())),
			trimMs(perQuery), model.FormatQPS(model.Ceiling(r.Sessions(), time.Duration(perQuery*float64(time.Millisecond)))))
	}
	v.Knee = qps(r.KneeQPS)
	switch {
	case r.KneeQPS <= 0:
		v.KneeNote = "never kept up"
	case keptUp(r):
		v.KneeNote = "kept up to the end: the ceiling lies beyond the ramp"
	case eff > 0:
		v.KneeNote = fmt.Sprintf("%.0f%% of the prediction", 100*r.KneeQPS/eff)
	}
	l := r.LatencyMs
	for _, x := range []float64{l.P50, l.P90, l.P99, l.Max, l.Mean} {
		v.Latency = append(v.Latency, msText(x))
	}
	if r.Completed > 0 {
		v.CPUPerKQuery = fmt.Sprintf("%.0f ms", 1000*r.Client.CPUSeconds/float64(r.Completed)*1000)
	} else {
		v.CPUPerKQuery = "-"
	}
	if r.Emulator != nil {
		v.EmulatorCPU = fmt.Sprintf("%.1f s", r.Emulator.CPUSeconds)
	}
	if r.Pooler != nil {
		v.PoolerCPU = fmt.Sprintf("%.1f s", r.Pooler.CPUSeconds)
	}
	v.PathPackets, v.PathRTT, v.LossInflation, v.Bottleneck = "-", "-", "-", "-"
	if p := r.Path; p != nil {
		v.PathPackets = fmt.Sprintf("%s / %s / %s", count(int64(p.SentPackets)), count(int64(p.Retransmits)), count(int64(p.LostPackets)))
		v.PathRTT = fmt.Sprintf("%s / %s", msText(p.SRTTMs), count(int64(p.EmulatorDrops)))
		if r.PredictedBandwidthCeilingQPS > 0 {
			v.Bottleneck = fmt.Sprintf("%s / %s, %s / %s", qps(r.PredictedBandwidthCeilingQPS), msText(r.PredictedQueueDelayMaxMs),
				msText(p.QueueDelayMs), msText(p.QueueDelayMaxMs))
		}
	}
	if r.PredictedLossInflationMs > 0 {
		v.LossInflation = msText(r.PredictedLossInflationMs) + fmt.Sprintf(" (measured mean %s)", msText(r.LatencyMs.Mean))
	}
	return v
}

func qps(q float64) string {
	if q <= 0 || math.IsNaN(q) {
		return "-"
	}
	return model.FormatQPS(q) + " q/s"
}

func count(n int64) string {
	return model.FormatQPS(float64(n))
}

// msText prints a latency with the precision it deserves: 0.42 ms,
// 151.2 ms, 3,012 ms.
func msText(x float64) string {
	switch {
	case x >= 1000:
		return model.FormatQPS(x) + " ms"
	case x >= 10:
		return fmt.Sprintf("%.1f ms", x)
	}
	return fmt.Sprintf("%.2f ms", x)
}

func trimMs(x float64) string {
	s := strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", x), "0"), ".")
	if s == "" {
		return "0"
	}
	return s
}

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"svg": func(s string) template.HTML {
		// The SVG comes from gonum/plot, which escapes every text it draws.
		return template.HTML(s)
	},
	"ms":    trimMs,
	"num":   model.FormatQPS,
	"date":  func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 UTC") },
	"upper": strings.ToUpper,
	"frame": func(i int) string {
		// Each chart's frame has its own shade of grey (one unit of blue
		// apart, invisible to a reader), so a screenshot test can find
		// where each chart was drawn.
		return fmt.Sprintf("#c8c8%02x", 200+i)
	},
}).Parse(pageHTML))

const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>pgquic ramp: TCP and QUIC across {{ms .Report.Scenario.RTTMs}} ms</title>
<style>
body { font-family: 'Liberation Sans', Arial, Helvetica, sans-serif; color: #222; background: #fff;
       max-width: 1100px; margin: 24px auto; padding: 0 24px; line-height: 1.4; }
h1 { font-size: 24px; margin-bottom: 4px; }
h2 { font-size: 18px; margin: 28px 0 4px; }
p.how, p.sub { color: #555; margin: 2px 0 8px; font-size: 14px; }
table { border-collapse: collapse; font-size: 14px; margin: 8px 0; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 12px 4px 0; text-align: left; vertical-align: top; }
td.num { font-variant-numeric: tabular-nums; }
th.run { border-bottom: 3px solid; }
code { font-size: 13px; background: #f3f3f3; padding: 1px 4px; }
figure { margin: 0; border: 1px solid; padding: 6px; }
figure svg { width: 100%; height: auto; display: block; }
.warn { color: #a00; font-weight: bold; }
</style>
</head>
<body>
<h1>How many queries per second across {{ms .Report.Scenario.RTTMs}} ms, over TCP and over QUIC?</h1>
{{with .Report.Scenario}}<p class="sub">Offered rate {{if eq .Arrivals "constant"}}constant at {{num .ToQPS}} q/s{{else}}rising from {{num .FromQPS}} to {{num .ToQPS}} q/s{{end}} over {{ms .DurationS}} s{{if .Arrivals}} ({{.Arrivals}} arrivals){{end}};
round trip {{ms .RTTMs}} ms{{if .JitterMs}}, jitter {{ms .JitterMs}} ms{{end}}{{if .UDPLoss}}, UDP loss {{printf "%.2g" .UDPLoss}}{{end}}{{if .Loss}}, loss {{printf "%.2g" .Loss}} per packet each way{{end}}{{if .BurstLoss}}, burst loss {{printf "%.2g" .BurstLoss}} in bursts of {{.BurstLen}}{{end}}{{if .Reorder}}, reordering {{printf "%.2g" .Reorder}}{{end}}{{if .BandwidthBps}}, bottleneck {{.BandwidthBps}} bit/s with a {{.QueueBytes}}-byte queue{{end}}{{if .WAN}}, WAN emulation: {{.WAN}} mode{{if .WANNote}} ({{.WANNote}}){{end}}{{end}}{{if eq .Scheduling "realtime"}}, real-time scheduling{{end}};
pool of {{.PoolSize}} server connections; query <code>{{.Query}}</code>.</p>{{end}}
<p class="sub">{{if not .Report.StartedAt.IsZero}}Measured {{date .Report.StartedAt}}{{else}}Date not recorded{{end}}{{with .Report.Machine}} on {{.CPUs}} CPUs, {{.OS}}/{{.Arch}}{{if .Kernel}}, kernel {{.Kernel}}{{end}}{{if .GoVersion}}, {{.GoVersion}}{{end}}{{end}}.</p>
{{range .Runs}}{{if .FellBehind}}<p class="warn">{{.Name}}: the load generator fell behind its schedule (largest lag {{.GeneratorLag}}): the client, not the system under test, ran short of CPU, so the offered rate is in doubt.</p>{{end}}{{if .Interrupted}}<p class="warn">{{.Name}}: the run was interrupted; figures cover what was scheduled until then.</p>{{end}}{{end}}

<h2>The model beside the measurement</h2>
<table id="summary">
<tr><th></th>{{range .Runs}}<th class="run" style="border-bottom-color: {{.Color}}">{{.Name}}{{if .Target}} ({{.Target}}){{end}}</th>{{end}}</tr>
<tr><th>sessions</th>{{range .Runs}}<td>{{.Sessions}}</td>{{end}}</tr>
<tr><th>per query: RTT + exec + pooler</th>{{range .Runs}}<td class="num">{{.PerQuery}}</td>{{end}}</tr>
{{if .HasChurn}}<tr><th>new session per query: round trips k (model)</th>{{range .Runs}}<td class="num">{{.RoundTrips}}</td>{{end}}</tr>
<tr><th>latency: model k x RTT + exec + pooler / measured p50</th>{{range .Runs}}<td class="num">{{.PredictedLat}} / <b>{{.MeasuredLat}}</b></td>{{end}}</tr>
<tr><th>new sessions</th>{{range .Runs}}<td class="num">{{.NewSessions}}</td>{{end}}</tr>
<tr><th>connect p50 / p99 (to a ready session)</th>{{range .Runs}}<td class="num">{{.ConnectLatency}}</td>{{end}}</tr>
<tr><th>predicted ceiling (ephemeral ports in TIME_WAIT)</th>{{range .Runs}}<td class="num">{{.PortCeiling}}</td>{{end}}</tr>
<tr><th>pooler's client sessions after the run</th>{{range .Runs}}<td class="num">{{.PoolerClients}}</td>{{end}}</tr>
{{end}}<tr><th>predicted ceiling (client)</th>{{range .Runs}}<td class="num">{{.Predicted}}</td>{{end}}</tr>
<tr><th>predicted ceiling (pool)</th>{{range .Runs}}<td class="num">{{.Pool}}</td>{{end}}</tr>
<tr><th>predicted, the lower of the two</th>{{range .Runs}}<td class="num"><b>{{.Effective}}</b></td>{{end}}</tr>
<tr><th>measured knee</th>{{range .Runs}}<td class="num"><b>{{.Knee}}</b>{{if .KneeNote}} ({{.KneeNote}}){{end}}</td>{{end}}</tr>
<tr><th>peak completed</th>{{range .Runs}}<td class="num">{{.Peak}}</td>{{end}}</tr>
<tr><th>scheduled = completed + errors + unfinished</th>{{range .Runs}}<td class="num{{if .Errors}} warn{{end}}">{{.Accounting}}</td>{{end}}</tr>
<tr><th>latency p50 / p90 / p99</th>{{range .Runs}}<td class="num">{{index .Latency 0}} / {{index .Latency 1}} / {{index .Latency 2}}</td>{{end}}</tr>
<tr><th>latency max / mean</th>{{range .Runs}}<td class="num">{{index .Latency 3}} / {{index .Latency 4}}</td>{{end}}</tr>
{{if .HasPath}}<tr><th>path: sent / retransmitted / lost packets</th>{{range .Runs}}<td class="num">{{.PathPackets}}</td>{{end}}</tr>
<tr><th>path: smoothed RTT / emulator drops</th>{{range .Runs}}<td class="num">{{.PathRTT}}</td>{{end}}</tr>
<tr><th>loss: predicted mean latency added</th>{{range .Runs}}<td class="num">{{.LossInflation}}</td>{{end}}</tr>
<tr><th>bottleneck: predicted ceiling / queue delay max, measured queue delay mean / max</th>{{range .Runs}}<td class="num">{{.Bottleneck}}</td>{{end}}</tr>
{{end}}{{if .HasMigrations}}<tr><th>moves to a new local address: latency max of that second and the next</th>{{range .Runs}}<td class="num">{{.Migrations}}</td>{{end}}</tr>
{{end}}<tr><th>load generator's largest lag</th>{{range .Runs}}<td class="num{{if .FellBehind}} warn{{end}}">{{.GeneratorLag}}{{if .FellBehind}}: fell behind{{end}}</td>{{end}}</tr>
</table>
<p class="how">The ceiling is Little's law: a PostgreSQL session runs one query at a time, so a client completes at most
sessions / (round trip + execution + pooler overhead) queries per second{{range .Runs}}{{if .LittleExample}}; {{.LittleExample}}{{end}}{{end}}.
The pool's ceiling is pool size / (execution + overhead), times the pooler's cross-client pipelining depth when it
pipelines (then an upper bound: PostgreSQL still runs a server connection's queries one after another). The knee is the highest offered rate of a one-second window
whose completions kept up (at least 98% of offered) with a backlog that did not grow.{{if .HasChurn}}
With a new session per query, each query costs k round trips (tcp: connect, startup, query = 3; tcp+tls adds the
SSLRequest and TLS 1.3's handshake = 5; an edge with local startup sends startup and query in one flight = 1), so its
latency is about k x RTT and the ceiling is sessions / (k x RTT + execution + overhead). The comparison is not
symmetric: the edge's QUIC connection is warm, opened before the run as a long-lived edge keeps it, while TCP pays its
handshake for every query; across a real path (packet mode) TCP's client ports wait 60 s in TIME_WAIT, which bounds
new connections per second; the pooler's own work per new session is not in the model.{{end}}</p>
{{range $i, $c := .Charts}}
<h2 id="{{$c.ID}}">{{$c.Question}}</h2>
<p class="how">{{$c.HowTo}}</p>
<figure class="chart" data-chart="{{$c.ID}}" style="border-color: {{frame $i}}">
{{svg $c.SVG}}
</figure>
{{end}}
<h2>Resources</h2>
<table id="resources">
<tr><th></th>{{range .Runs}}<th class="run" style="border-bottom-color: {{.Color}}">{{.Name}}</th>{{end}}</tr>
<tr><th>client CPU</th>{{range .Runs}}<td class="num">{{.ClientCPU}}</td>{{end}}</tr>
<tr><th>client CPU per 1,000 completed queries</th>{{range .Runs}}<td class="num">{{.CPUPerKQuery}}</td>{{end}}</tr>
<tr><th>client peak RSS</th>{{range .Runs}}<td class="num">{{.PeakRSS}}</td>{{end}}</tr>
<tr><th>client open file descriptors (peak)</th>{{range .Runs}}<td class="num">{{.FDs}}</td>{{end}}</tr>
<tr><th>WAN emulator CPU</th>{{range .Runs}}<td class="num">{{.EmulatorCPU}}</td>{{end}}</tr>
<tr><th>pooler CPU</th>{{range .Runs}}<td class="num">{{.PoolerCPU}}</td>{{end}}</tr>
</table>
<p class="how">Generated by <code>pgquic ramp</code>; the same figures are in ramp.json.</p>
</body>
</html>
`
