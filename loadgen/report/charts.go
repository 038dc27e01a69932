package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"regexp"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/pgquic/pgquic/loadgen/model"
)

// chart is one rendered chart: the reader's question it answers, a line
// on how to read it, and the inline SVG.
type chart struct {
	ID       string
	Question string
	HowTo    string
	SVG      string
}

// Chart canvas size in points; the page scales it to its width.
const (
	chartW vg.Length = 780
	chartH vg.Length = 300
)

var (
	// Colours per transport, from the colour-blind-safe Tableau 10 palette,
	// so TCP and QUIC keep one colour across every chart.
	transportColors = map[string]color.RGBA{
		TransportTCP:  {R: 0xe1, G: 0x57, B: 0x59, A: 0xff}, // red
		TransportQUIC: {R: 0x4e, G: 0x79, B: 0xa7, A: 0xff}, // blue
	}
	otherColors = []color.RGBA{
		{R: 0x59, G: 0xa1, B: 0x4f, A: 0xff}, // green
		{R: 0xb0, G: 0x7a, B: 0xa1, A: 0xff}, // purple
	}
	grey     = color.RGBA{R: 0x6b, G: 0x6b, B: 0x6b, A: 0xff}
	offeredC = color.RGBA{R: 0x22, G: 0x22, B: 0x22, A: 0xff}

	solid  []vg.Length
	dashed = []vg.Length{vg.Points(6), vg.Points(3)}
	dotted = []vg.Length{vg.Points(1.5), vg.Points(2.5)}
)

// runColor is the colour of run i of rep: its transport's colour for the
// first run of each transport, another colour for any later one.
func runColor(rep *Report, i int) color.RGBA {
	r := &rep.Runs[i]
	earlier := 0
	for j := range i {
		if rep.Runs[j].Transport == r.Transport {
			earlier++
		}
	}
	if c, ok := transportColors[r.Transport]; ok && earlier == 0 {
		return c
	}
	return otherColors[(i+earlier)%len(otherColors)]
}

// runLabel names a run in legends: "TCP" or "QUIC" (or, in a
// session-per-query run, its session path such as "EDGE-LOCAL"), with the
// run's index when two runs share that name.
func runLabel(rep *Report, i int) string {
	name := func(r *Run) string {
		if r.SessionPath != "" {
			return r.SessionPath
		}
		return r.Transport
	}
	r := &rep.Runs[i]
	label := strings.ToUpper(name(r))
	for j := range rep.Runs {
		if j != i && name(&rep.Runs[j]) == name(r) {
			return fmt.Sprintf("%s #%d", label, i+1)
		}
	}
	return label
}

// sansFont is Liberation Sans, which gonum/plot ships and which has the
// metrics of Arial and Helvetica, so the page can fall back on those.
func sansFont(size vg.Length) font.Font {
	return font.From(font.Font{Typeface: "Liberation", Variant: "Sans"}, size)
}

// newPlot returns a plot with the page's fonts and a grid.
func newPlot(xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	p.X.Label.Text, p.Y.Label.Text = xLabel, yLabel
	for _, s := range []*font.Font{&p.Title.TextStyle.Font, &p.X.Label.TextStyle.Font, &p.Y.Label.TextStyle.Font, &p.Legend.TextStyle.Font} {
		*s = sansFont(11)
	}
	p.X.Tick.Label.Font = sansFont(9.5)
	p.Y.Tick.Label.Font = sansFont(9.5)
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), -vg.Points(4)
	p.Legend.ThumbnailWidth = vg.Points(26)
	p.Legend.Padding = vg.Points(2.5)
	p.Y.Tick.Marker = commaTicks{plot.DefaultTicks{}}
	p.X.Tick.Marker = commaTicks{plot.DefaultTicks{}}
	g := plotter.NewGrid()
	g.Vertical.Color = color.Gray{Y: 0xe4}
	g.Horizontal.Color = color.Gray{Y: 0xe4}
	p.Add(g)
	return p
}

// commaTicks relabels whole-number ticks with thousands separators.
type commaTicks struct{ plot.Ticker }

func (t commaTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := t.Ticker.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" && ticks[i].Value == math.Trunc(ticks[i].Value) {
			ticks[i].Label = model.FormatQPS(ticks[i].Value)
		}
	}
	return ticks
}

// logTicks labels 1, 2 and 5 times each power of ten, with minor ticks at
// the other multiples: plot.LogTicks labels only powers of ten, which
// leaves a range like 120 to 5,000 ms with a single label.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		base := math.Pow(10, e)
		for m := 1.0; m <= 9; m++ {
			v := m * base
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = model.FormatQPS(v)
				if v < 1 {
					t.Label = strconv.FormatFloat(v, 'g', -1, 64)
				}
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

func line(xys plotter.XYs, c color.Color, width float64, dashes []vg.Length) (*plotter.Line, error) {
	l, err := plotter.NewLine(xys)
	if err != nil {
		return nil, err
	}
	l.LineStyle = draw.LineStyle{Color: c, Width: vg.Points(width), Dashes: dashes}
	return l, nil
}

// hline is a horizontal line across [x0, x1] at y.
func hline(x0, x1, y float64, c color.Color, dashes []vg.Length) (*plotter.Line, error) {
	return line(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y}}, c, 1.3, dashes)
}

// series collects (t, v) points of a run, skipping values a log axis
// cannot show when positive is set. Each point sits at the middle of its
// one-second window.
func series(r *Run, v func(*Second) float64, positive bool) plotter.XYs {
	var xys plotter.XYs
	for i := range r.Seconds {
		s := &r.Seconds[i]
		y := v(s)
		if math.IsNaN(y) || math.IsInf(y, 0) || (positive && y <= 0) {
			continue
		}
		xys = append(xys, plotter.XY{X: float64(s.T) + 0.5, Y: y})
	}
	return xys
}

// timeSpan returns the ramp's time axis range.
func timeSpan(rep *Report) (float64, float64) {
	hi := rep.Scenario.DurationS
	for i := range rep.Runs {
		if n := len(rep.Runs[i].Seconds); n > 0 {
			hi = max(hi, float64(rep.Runs[i].Seconds[n-1].T+1))
		}
	}
	if hi <= 0 {
		hi = 1
	}
	return 0, hi
}

// addLine adds a line and its legend entry when it has points.
func addLine(p *plot.Plot, label string, xys plotter.XYs, c color.Color, width float64, dashes []vg.Length) error {
	if len(xys) == 0 {
		return nil
	}
	l, err := line(xys, c, width, dashes)
	if err != nil {
		return err
	}
	p.Add(l)
	p.Legend.Add(label, l)
	return nil
}

// latencyChart answers: how long did queries take as the offered rate rose?
func latencyChart(rep *Report) (*plot.Plot, error) {
	xLabel := "seconds into the run"
	if sc := rep.Scenario; sc.ToQPS > sc.FromQPS && sc.Arrivals != "constant" {
		xLabel += " (offered rate rising)"
	}
	p := newPlot(xLabel, "latency (ms), from intended send time")
	lo, hi := math.Inf(1), 0.0
	for i := range rep.Runs {
		r := &rep.Runs[i]
		c := runColor(rep, i)
		name := runLabel(rep, i)
		for _, q := range []struct {
			label  string
			v      func(*Second) float64
			width  float64
			dashes []vg.Length
		}{
			{"p50", func(s *Second) float64 { return s.P50Ms }, 2, solid},
			{"p99", func(s *Second) float64 { return s.P99Ms }, 1.5, dashed},
			{"max", func(s *Second) float64 { return s.MaxMs }, 1.2, dotted},
		} {
			xys := series(r, q.v, true)
			for _, xy := range xys {
				lo, hi = min(lo, xy.Y), max(hi, xy.Y)
			}
			if err := addLine(p, name+" "+q.label, xys, c, q.width, q.dashes); err != nil {
				return nil, err
			}
		}
	}
	x0, x1 := timeSpan(rep)
	p.X.Min, p.X.Max = x0, x1
	if rtt := rep.Scenario.RTTMs; rtt > 0 {
		l, err := hline(x0, x1, rtt, grey, dashed)
		if err != nil {
			return nil, err
		}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("round trip %s ms", trimFloat(rtt)), l)
		lo, hi = min(lo, rtt), max(hi, rtt)
	}
	// A new session per query costs k round trips: each such run's model
	// latency, in its colour, beside its measured p50.
	for i := range rep.Runs {
		r := &rep.Runs[i]
		if r.NewSessions == nil || r.PredictedLatencyMs <= 0 {
			continue
		}
		l, err := hline(x0, x1, r.PredictedLatencyMs, runColor(rep, i), dotted)
		if err != nil {
			return nil, err
		}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s model %d RTT = %s ms", runLabel(rep, i), r.ModelRoundTrips, trimFloat(r.PredictedLatencyMs)), l)
		lo, hi = min(lo, r.PredictedLatencyMs), max(hi, r.PredictedLatencyMs)
	}
	if hi <= 0 || math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	// A log axis keeps the round-trip floor readable beside seconds of
	// queueing; a narrow range reads better on a linear one.
	if hi/lo > 20 {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
		p.Y.Min, p.Y.Max = lo*0.8, hi*1.6
		p.Y.Label.Text += ", log scale"
	} else {
		p.Y.Min, p.Y.Max = 0, hi*1.25
	}
	return p, nil
}

// throughputChart answers: did each transport keep up with the offered
// rate, and where did it saturate against the model?
func throughputChart(rep *Report) (*plot.Plot, error) {
	p := newPlot("seconds into the run", "queries per second")
	x0, x1 := timeSpan(rep)
	p.X.Min, p.X.Max, p.Y.Min = x0, x1, 0
	dataMax := 0.0
	var offered plotter.XYs
	var offeredLine *plotter.Line
	if len(rep.Runs) > 0 {
		offered = series(&rep.Runs[0], func(s *Second) float64 { return s.OfferedQPS }, false)
		for _, xy := range offered {
			dataMax = max(dataMax, xy.Y)
		}
	}
	if len(offered) > 0 {
		// Drawn over the completed lines, which hide it wherever a run
		// keeps up, but listed first in the legend.
		l, err := line(offered, offeredC, 1.2, dashed)
		if err != nil {
			return nil, err
		}
		offeredLine = l
		p.Legend.Add("offered", l)
	}
	for i := range rep.Runs {
		r := &rep.Runs[i]
		xys := series(r, func(s *Second) float64 { return s.CompletedQPS }, false)
		for _, xy := range xys {
			dataMax = max(dataMax, xy.Y)
		}
		if err := addLine(p, runLabel(rep, i)+" completed", xys, runColor(rep, i), 2, solid); err != nil {
			return nil, err
		}
	}
	if dataMax <= 0 {
		dataMax = 1
	}
	// Ceilings far above the data would squash it: the axis stretches to
	// show a ceiling up to twice the data's peak, and the legend gives the
	// others' values.
	top := dataMax
	visible := func(q float64) bool { return q > 0 && q <= 2*dataMax }
	var pool float64
	for i := range rep.Runs {
		r := &rep.Runs[i]
		if visible(r.PredictedCeilingQPS) {
			top = max(top, r.PredictedCeilingQPS)
		}
		if r.PredictedPoolCeilingQPS > 0 && (pool == 0 || r.PredictedPoolCeilingQPS < pool) {
			pool = r.PredictedPoolCeilingQPS
		}
	}
	if visible(pool) {
		top = max(top, pool)
	}
	// Set once every plotter is added: Add widens the axes to each
	// plotter's data range, ceilings off the chart included.
	yMax := top * 1.12
	offChart := func(q float64) string {
		if q > yMax {
			return " (above the chart)"
		}
		return ""
	}
	for i := range rep.Runs {
		r := &rep.Runs[i]
		c := runColor(rep, i)
		if q := r.PredictedCeilingQPS; q > 0 {
			l, err := hline(x0, x1, q, c, dotted)
			if err != nil {
				return nil, err
			}
			l.LineStyle.Width = vg.Points(1.8)
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("%s predicted ceiling %s q/s%s", runLabel(rep, i), model.FormatQPS(q), offChart(q)), l)
		}
	}
	if pool > 0 {
		l, err := hline(x0, x1, pool, grey, dotted)
		if err != nil {
			return nil, err
		}
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("pool ceiling %s q/s%s", model.FormatQPS(pool), offChart(pool)), l)
	}
	for i := range rep.Runs {
		r := &rep.Runs[i]
		t, ok := kneeTime(r)
		if !ok {
			continue
		}
		s, err := plotter.NewScatter(plotter.XYs{{X: t, Y: r.KneeQPS}})
		if err != nil {
			return nil, err
		}
		s.GlyphStyle = draw.GlyphStyle{Color: runColor(rep, i), Radius: vg.Points(5.5), Shape: draw.PyramidGlyph{}}
		p.Add(s)
		label := fmt.Sprintf("%s knee %s q/s", runLabel(rep, i), model.FormatQPS(r.KneeQPS))
		if keptUp(r) {
			label += " (kept up to the end)"
		}
		p.Legend.Add(label, s)
	}
	if offeredLine != nil {
		p.Add(offeredLine)
	}
	// Set last: Add widens the axes to each plotter's data range, ceilings
	// off the chart included.
	p.Y.Min, p.Y.Max = 0, yMax
	return p, nil
}

// kneeTime returns the middle of the first window whose offered rate is
// the run's knee.
func kneeTime(r *Run) (float64, bool) {
	if r.KneeQPS <= 0 {
		return 0, false
	}
	best, bestD := 0.0, math.Inf(1)
	for _, s := range r.Seconds {
		if d := math.Abs(s.OfferedQPS - r.KneeQPS); d < bestD {
			best, bestD = float64(s.T)+0.5, d
		}
	}
	return best, !math.IsInf(bestD, 1)
}

// keptUp tells that the knee is the run's highest offered rate: the run
// never saturated, so its real knee lies beyond the ramp.
func keptUp(r *Run) bool {
	peak := 0.0
	for _, s := range r.Seconds {
		peak = max(peak, s.OfferedQPS)
	}
	return r.KneeQPS > 0 && r.KneeQPS >= peak
}

// queueChart answers: did queries queue up waiting for a session, and how
// many were on the wire?
func queueChart(rep *Report) (*plot.Plot, error) {
	p := newPlot("seconds into the run", "queries")
	x0, x1 := timeSpan(rep)
	p.X.Min, p.X.Max, p.Y.Min = x0, x1, 0
	hi := 1.0
	for i := range rep.Runs {
		if err := addRunLines(p, rep, i, &hi, []runLine{
			{"backlog (due, not yet sent)", func(s *Second) float64 { return float64(s.Backlog) }, 2, solid},
			{"in flight", func(s *Second) float64 { return float64(s.InFlight) }, 1.5, dashed},
		}); err != nil {
			return nil, err
		}
	}
	p.Y.Max = hi * 1.15
	return p, nil
}

// runLine is one per-second series of a run drawn in the run's colour.
type runLine struct {
	label  string
	v      func(*Second) float64
	width  float64
	dashes []vg.Length
}

// addRunLines draws run i's lines on p and raises *hi to their highest
// value.
func addRunLines(p *plot.Plot, rep *Report, i int, hi *float64, lines []runLine) error {
	r, c := &rep.Runs[i], runColor(rep, i)
	for _, q := range lines {
		xys := series(r, q.v, false)
		for _, xy := range xys {
			*hi = max(*hi, xy.Y)
		}
		if err := addLine(p, runLabel(rep, i)+" "+q.label, xys, c, q.width, q.dashes); err != nil {
			return err
		}
	}
	return nil
}

// pathChart answers: how much loss recovery did each transport do? Per
// second, TCP's retransmitted segments and QUIC's packets declared lost,
// from the transports' own counters. nil when no run measured its path.
func pathChart(rep *Report) (*plot.Plot, error) {
	p := newPlot("seconds into the run", "packets per second")
	x0, x1 := timeSpan(rep)
	p.X.Min, p.X.Max, p.Y.Min = x0, x1, 0
	hi, found := 1.0, false
	for i := range rep.Runs {
		r := &rep.Runs[i]
		if r.Path == nil {
			continue
		}
		found = true
		if err := addRunLines(p, rep, i, &hi, []runLine{
			{"retransmitted", func(s *Second) float64 {
				if s.Path == nil {
					return 0
				}
				return float64(s.Path.Retransmits)
			}, 2, solid},
			{"lost", func(s *Second) float64 {
				if s.Path == nil {
					return 0
				}
				return float64(s.Path.LostPackets)
			}, 1.5, dashed},
		}); err != nil {
			return nil, err
		}
	}
	if !found {
		return nil, nil
	}
	p.Y.Max = hi * 1.15
	return p, nil
}

// costCharts answers: what did each transport cost in CPU and memory? It
// returns two panels: CPU seconds per component, and the client's peak
// memory.
func costCharts(rep *Report) (*plot.Plot, *plot.Plot, error) {
	type part struct {
		name string
		v    func(*Run) (float64, bool)
	}
	parts := []part{
		{"client", func(r *Run) (float64, bool) { return r.Client.CPUSeconds, true }},
		{"WAN emulator", func(r *Run) (float64, bool) {
			if r.Emulator == nil {
				return 0, false
			}
			return r.Emulator.CPUSeconds, true
		}},
		{"pooler", func(r *Run) (float64, bool) {
			if r.Pooler == nil {
				return 0, false
			}
			return r.Pooler.CPUSeconds, true
		}},
	}
	// Keep only the components some run reports.
	var shown []part
	for _, pt := range parts {
		for i := range rep.Runs {
			if _, ok := pt.v(&rep.Runs[i]); ok {
				shown = append(shown, pt)
				break
			}
		}
	}
	cpu := newPlot("", "CPU seconds over the run")
	mem := newPlot("", "client peak RSS (MiB)")
	n := len(rep.Runs)
	width := vg.Points(min(60, 180/float64(max(n, 1))))
	var names []string
	for _, pt := range shown {
		names = append(names, pt.name+" CPU")
	}
	for i := range rep.Runs {
		r := &rep.Runs[i]
		c := runColor(rep, i)
		offset := vg.Length(float64(i)-float64(n-1)/2) * width
		var vals plotter.Values
		for _, pt := range shown {
			v, _ := pt.v(r)
			vals = append(vals, v)
		}
		if len(vals) > 0 {
			b, err := plotter.NewBarChart(vals, width)
			if err != nil {
				return nil, nil, err
			}
			b.Color, b.LineStyle.Width, b.Offset = c, 0, offset
			cpu.Add(b)
			cpu.Legend.Add(runLabel(rep, i), b)
		}
		b, err := plotter.NewBarChart(plotter.Values{float64(r.Client.PeakRSSBytes) / (1 << 20)}, width)
		if err != nil {
			return nil, nil, err
		}
		b.Color, b.LineStyle.Width, b.Offset = c, 0, offset
		mem.Add(b)
		mem.Legend.Add(runLabel(rep, i), b)
	}
	if len(names) > 0 {
		cpu.NominalX(names...)
	}
	mem.NominalX("client")
	for _, p := range []*plot.Plot{cpu, mem} {
		p.Y.Min = 0
		p.Y.Max = max(p.Y.Max*1.25, 1)
		p.Legend.Left = false
		p.X.Padding = vg.Points(40)
	}
	return cpu, mem, nil
}

// Regular expressions that turn gonum's standalone SVG documents into SVG
// elements for an HTML page: HTML needs no XML prolog or namespace
// declarations, and the font falls back to the metric-compatible Arial and
// Helvetica where Liberation Sans is not installed.
var (
	svgProlog = regexp.MustCompile(`(?s)^.*?(<svg )`)
	svgXMLNS  = regexp.MustCompile(`\s+xmlns(:xlink)?="[^"]*"`)
	svgFont   = regexp.MustCompile(`font-family:Liberation Sans;`)
)

// svgOf renders plots side by side on one canvas of chartW x chartH points
// and returns the SVG element.
func svgOf(plots ...*plot.Plot) (string, error) {
	c := vgsvg.New(chartW, chartH)
	dc := draw.New(c)
	if len(plots) == 1 {
		plots[0].Draw(dc)
	} else {
		tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Points(24)}
		row := [][]*plot.Plot{plots}
		for j, cv := range plot.Align(row, tiles, dc)[0] {
			plots[j].Draw(cv)
		}
	}
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return "", fmt.Errorf("render chart: %w", err)
	}
	s := svgProlog.ReplaceAllString(b.String(), "$1")
	s = svgXMLNS.ReplaceAllString(s, "")
	s = svgFont.ReplaceAllString(s, `font-family:'Liberation Sans',Arial,Helvetica,sans-serif;`)
	return s, nil
}

// renderCharts draws every chart of the page, one per question a reader
// of a ramp has.
func renderCharts(rep *Report) (charts []chart, err error) {
	// gonum/plot reports some drawing problems (a bad range, a font it
	// cannot find) by panicking; a report must fail with an error instead.
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("render charts: %v", v)
		}
	}()
	lat, err := latencyChart(rep)
	if err != nil {
		return nil, err
	}
	thr, err := throughputChart(rep)
	if err != nil {
		return nil, err
	}
	q, err := queueChart(rep)
	if err != nil {
		return nil, err
	}
	cpu, mem, err := costCharts(rep)
	if err != nil {
		return nil, err
	}
	path, err := pathChart(rep)
	if err != nil {
		return nil, err
	}
	latHow := "Latency counts from each query's intended send time, so time spent queued for a session is included. The grey line is the round trip: no query can beat it."
	for _, r := range rep.Runs {
		if r.NewSessions != nil {
			latHow += " With a new session per query, a dotted line in a run's colour is the model's k round trips (plus execution and overhead), which its p50 should sit on until the run saturates."
			break
		}
	}
	specs := []struct {
		id, question, howTo string
		plots               []*plot.Plot
	}{
		{"latency", "How long did queries wait as the offered rate rose?", latHow, []*plot.Plot{lat}},
		{"throughput", "Did each transport keep up with the offered rate, and where did it saturate?",
			"Completed queries per second against the offered rate. Dotted lines are the model's ceilings (sessions / per-query time, and the pool's); a triangle marks the measured knee, the highest offered rate that was kept up with.",
			[]*plot.Plot{thr}},
		{"queue", "Did queries queue up waiting for a session?",
			"Backlog counts queries that were due but not yet sent; in flight counts queries sent and not yet answered. A backlog that keeps growing means the transport is past its ceiling.",
			[]*plot.Plot{q}},
		{"cost", "What did each transport cost in CPU and memory?",
			"CPU seconds spent over the whole run by the load generator (client), the WAN emulator and, when measured apart, the pooler; and the client's peak resident memory.",
			[]*plot.Plot{cpu, mem}},
	}
	if path != nil {
		specs = append(specs, struct {
			id, question, howTo string
			plots               []*plot.Plot
		}{"path", "How much loss recovery did each transport do?",
			"Per second of the run, from the transports' own counters: TCP's retransmitted segments (TCP_INFO, summed over its connections) and the packets each declared lost (QUIC's loss detection; for TCP, retransmissions the receiver did not report as duplicates). Packet mode only.",
			[]*plot.Plot{path}})
	}
	for _, s := range specs {
		svg, err := svgOf(s.plots...)
		if err != nil {
			return nil, err
		}
		charts = append(charts, chart{ID: s.id, Question: s.question, HowTo: s.howTo, SVG: svg})
	}
	return charts, nil
}

// trimFloat prints a number without a trailing ".0".
func trimFloat(v float64) string {
	return strings.TrimSuffix(fmt.Sprintf("%.1f", v), ".0")
}
