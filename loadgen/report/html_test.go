package report

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"golang.org/x/net/html"
)

// chartQuestions are the titles of the page's charts, one per question a
// reader of a ramp has.
var chartQuestions = []string{
	"How long did queries wait as the offered rate rose?",
	"Did each transport keep up with the offered rate, and where did it saturate?",
	"Did queries queue up waiting for a session?",
	"What did each transport cost in CPU and memory?",
}

// pageFacts is what a test learns from walking a rendered page.
type pageFacts struct {
	svgs      int      // <svg> elements
	figures   []string // data-chart of each figure that holds exactly one <svg>
	h2        []string // text of every <h2>
	resources []string // attributes that could fetch something: src, href, srcset, url(...), @import
}

func parsePage(t *testing.T, page []byte) pageFacts {
	t.Helper()
	doc, err := html.Parse(bytes.NewReader(page))
	if err != nil {
		t.Fatalf("page does not parse: %v", err)
	}
	var f pageFacts
	var text func(*html.Node) string
	text = func(n *html.Node) string {
		if n.Type == html.TextNode {
			return n.Data
		}
		var b strings.Builder
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			b.WriteString(text(c))
		}
		return b.String()
	}
	var countSVG func(*html.Node) int
	countSVG = func(n *html.Node) int {
		k := 0
		if n.Type == html.ElementNode && n.Data == "svg" {
			k++
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			k += countSVG(c)
		}
		return k
	}
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			for _, a := range n.Attr {
				switch strings.ToLower(a.Key) {
				case "src", "href", "xlink:href", "srcset", "action", "poster", "data":
					f.resources = append(f.resources, n.Data+" "+a.Key+"="+a.Val)
				case "style":
					if strings.Contains(a.Val, "url(") {
						f.resources = append(f.resources, n.Data+" style="+a.Val)
					}
				}
			}
			switch n.Data {
			case "svg":
				f.svgs++
			case "h2":
				f.h2 = append(f.h2, strings.TrimSpace(text(n)))
			case "style":
				css := text(n)
				if strings.Contains(css, "url(") || strings.Contains(css, "@import") {
					f.resources = append(f.resources, "style element: "+css)
				}
			case "figure":
				for _, a := range n.Attr {
					if a.Key == "data-chart" && countSVG(n) == 1 {
						f.figures = append(f.figures, a.Val)
					}
				}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	return f
}

func renderPage(t *testing.T, r *Report) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := WriteHTML(&b, r); err != nil {
		t.Fatalf("WriteHTML: %v", err)
	}
	return b.Bytes()
}

// checkPage asserts what every page must be: four charts, each in its own
// figure under its question, and nothing fetched from anywhere.
func checkPage(t *testing.T, page []byte) pageFacts {
	t.Helper()
	f := parsePage(t, page)
	if f.svgs != len(chartQuestions) {
		t.Errorf("%d <svg> charts, want %d", f.svgs, len(chartQuestions))
	}
	if want := []string{"latency", "throughput", "queue", "cost"}; strings.Join(f.figures, ",") != strings.Join(want, ",") {
		t.Errorf("figures %v, want %v", f.figures, want)
	}
	for _, q := range chartQuestions {
		found := false
		for _, h := range f.h2 {
			found = found || h == q
		}
		if !found {
			t.Errorf("no chart titled %q (h2: %q)", q, f.h2)
		}
	}
	if len(f.resources) > 0 {
		t.Errorf("page references resources: %q", f.resources)
	}
	// ZgotmplZ is what html/template writes in place of a value it
	// refused, such as a colour it did not trust in a style attribute.
	for _, s := range []string{"http://", "https://", "//cdn", "<script", "<link", "<img", "<iframe", "ZgotmplZ"} {
		if bytes.Contains(page, []byte(s)) {
			t.Errorf("page contains %q", s)
		}
	}
	return f
}

func TestWriteHTML(t *testing.T) {
	r := Synthetic()
	page := renderPage(t, r)
	checkPage(t, page)
	// The summary puts the model beside the measurement, and the scenario
	// is stated.
	for _, s := range []string{
		"The model beside the measurement",
		"3,322 q/s",                           // TCP's predicted ceiling
		"13,289 q/s",                          // QUIC's
		"40,000 q/s",                          // the pool's
		"3,122 q/s",                           // TCP's knee
		"94% of the prediction",               // knee / prediction
		"kept up to the end",                  // QUIC never saturated
		"76,500 = 67,198 + 0 + 9,302",         // TCP's accounting
		"500 sessions / 150.5 ms = 3,322 q/s", // Little's law with the run's numbers
		"50 connections x 40 streams = 2,000",
		"rising from 100 to 5,000 q/s over 30 s",
		"round trip 150 ms",
		"pool of 20 server connections",
		"SELECT trunc(random() * 100) FROM generate_series(1, 10)",
		"TCP predicted ceiling 3,322 q/s", // legend of the throughput chart
		"QUIC predicted ceiling 13,289 q/s (above the chart)",
		"TCP knee 3,122 q/s",
		"WAN emulator CPU",
	} {
		if !strings.Contains(html.UnescapeString(string(page)), s) {
			t.Errorf("page lacks %q", s)
		}
	}
	if bytes.Contains(page, []byte("fell behind its schedule")) {
		t.Error("page warns of a generator that kept up")
	}
}

func TestWriteHTMLWarnings(t *testing.T) {
	r := Synthetic()
	r.Runs[1].GeneratorFellBehind = true
	r.Runs[1].GeneratorLagMs = 42
	r.Runs[0].Interrupted = true
	page := renderPage(t, r)
	checkPage(t, page)
	for _, s := range []string{"QUIC: the load generator fell behind its schedule (largest lag 42.0 ms)", "TCP: the run was interrupted"} {
		if !bytes.Contains(page, []byte(s)) {
			t.Errorf("page lacks %q", s)
		}
	}
}

func TestWriteHTMLRefusesUnbalancedReport(t *testing.T) {
	r := Synthetic()
	r.Runs[1].Unfinished++
	var b bytes.Buffer
	if err := WriteHTML(&b, r); !errors.Is(err, ErrInvalid) {
		t.Fatalf("WriteHTML = %v, want ErrInvalid", err)
	}
	if b.Len() > 0 {
		t.Errorf("an invalid report was rendered (%d bytes)", b.Len())
	}
}

// TestWriteHTMLEscapes keeps text from the user (the query, a target
// address) from becoming markup.
func TestWriteHTMLEscapes(t *testing.T) {
	r := Synthetic()
	r.Scenario.Query = `SELECT '<script>alert(1)</script>' -- http://example.com`
	r.Runs[0].Target = `<b>pgbouncer</b>:6432`
	page := renderPage(t, r)
	if bytes.Contains(page, []byte("<script>")) || bytes.Contains(page, []byte("<b>pgbouncer")) {
		t.Errorf("user text was not escaped")
	}
	if !bytes.Contains(page, []byte("&lt;script&gt;")) {
		t.Errorf("escaped query missing")
	}
	if f := parsePage(t, page); f.svgs != len(chartQuestions) || len(f.resources) > 0 {
		t.Errorf("svgs %d, resources %q", f.svgs, f.resources)
	}
}

// TestWriteHTMLOddReports renders reports that a real run can produce at
// its edges: no runs, a run stopped before its first second, zero and
// missing values, a single transport, values a log axis cannot show.
func TestWriteHTMLOddReports(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Report)
	}{
		{"no runs", func(r *Report) { r.Runs = nil }},
		{"interrupted before the first second", func(r *Report) {
			r.Runs = []Run{{Transport: TransportTCP, Conns: 500, StreamsPerConn: 1, Scheduled: 40, Unfinished: 40, Interrupted: true}}
		}},
		{"QUIC only, no emulator, pooler measured", func(r *Report) {
			r.Runs = r.Runs[1:]
			r.Runs[0].Emulator = nil
			r.Runs[0].Pooler = &Usage{CPUSeconds: 3}
		}},
		{"all latencies zero", func(r *Report) {
			for i := range r.Runs {
				for j := range r.Runs[i].Seconds {
					s := &r.Runs[i].Seconds[j]
					s.P50Ms, s.P99Ms, s.MaxMs = 0, 0, 0
				}
			}
		}},
		{"no model", func(r *Report) {
			for i := range r.Runs {
				r.Runs[i].PredictedCeilingQPS, r.Runs[i].PredictedPoolCeilingQPS, r.Runs[i].KneeQPS = 0, 0, 0
			}
			r.Scenario.RTTMs = 0
		}},
		{"NaN and infinite samples", func(r *Report) {
			r.Runs[0].Seconds[3].P99Ms = math.NaN()
			r.Runs[0].Seconds[4].MaxMs = math.Inf(1)
		}},
		{"three runs, two of one transport", func(r *Report) {
			r.Runs = append(r.Runs, r.Runs[0])
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Synthetic()
			tt.edit(r)
			checkPage(t, renderPage(t, r))
		})
	}
}

// TestWriteHTMLMigrations: a run whose connections moved gets a summary
// row naming each move and the latency around it; a report without moves
// has no such row.
func TestWriteHTMLMigrations(t *testing.T) {
	r := Synthetic()
	if strings.Contains(string(renderPage(t, r)), "moves to a new local address") {
		t.Error("a report without moves shows the moves row")
	}
	r.Runs[len(r.Runs)-1].Migrations = []Migration{{AtS: 10, TookMs: 151, MaxMsAround: 312.5}, {AtS: 20, TookMs: 149, MaxMsAround: 190, Error: "x"}}
	page := string(renderPage(t, r))
	for _, want := range []string{"moves to a new local address", "at 10.0 s: max 312", "at 20.0 s: max 190", "not every connection moved"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}

// TestWriteHTMLChurn: a session-per-query run shows its session path, its
// new sessions and connect times beside the model's round trips.
func TestWriteHTMLChurn(t *testing.T) {
	r := Synthetic()
	r.Runs = r.Runs[:1]
	run := &r.Runs[0]
	n, zero := int64(2100), 0
	run.SessionPath, run.NewSessions, run.PoolerClientsAfter = "tcp+tls", &n, &zero
	run.ConnectMs = &ConnectLatency{P50: 606.5, P99: 611.4}
	four := 4
	run.ModelRoundTrips, run.ModelConnectRoundTrips, run.PredictedLatencyMs = 5, &four, 750.5
	run.Conns, run.PredictedCeilingQPS, run.PredictedPortCeilingQPS = 100, 133.2, 470.5
	page := renderPage(t, r)
	checkPage(t, page)
	text := html.UnescapeString(string(page))
	for _, s := range []string{
		"TCP+TLS",                              // labelled by its session path
		"5 (4 before the session is ready)",    // the model's round trips
		"5 x 150 + 0.4 + 0.1 = 750.5 ms",       // per query
		"750.5 ms / ",                          // model latency beside the measured p50
		"2,100",                                // new sessions
		"606.5 ms / 611.4 ms (model 600.0 ms)", // connect p50 / p99
		"471 q/s",                              // the port ceiling
		"100 sessions / 750.5 ms = 133 q/s",    // Little's law with k round trips
		"TCP+TLS model 5 RTT = 750.5 ms",       // the latency chart's model line
		"symmetric: the edge's QUIC connection is warm",
	} {
		if !strings.Contains(text, s) {
			t.Errorf("page lacks %q", s)
		}
	}
}
