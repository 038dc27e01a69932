package benchtool

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// runRow is one measured pgbench run. Per-query figures are NaN where they
// do not apply (no pooler process for direct) or nothing completed.
type runRow struct {
	round         int
	mode          string
	clients, rate int
	target        string
	status        string // ok, or aborted when pgbench's clients gave up
	tps           float64
	txns, failed  int64
	latencyMs     float64
	connectMs     float64 // pgbench's initial connection time
	poolerUs      float64 // pooler CPU microseconds per query
	pgUs          float64 // all PostgreSQL server processes' CPU per query
	pgbenchUs     float64 // pgbench's CPU per query
	rwSys         float64 // pooler read+write system calls per query (syscr+syscw)
	sys           float64 // pooler system calls of every kind per query (perf)
	ctxsw         float64 // pooler context switches per query, all threads
	busyMean      float64 // busy server connections, mean of 100 ms samples
	busyMax       int
	seconds       float64 // wall time of the pgbench run
}

// tsvColumns name the TSV's columns, in order; the test checks them.
var tsvColumns = []string{"round", "mode", "clients", "rate", "target", "status", "tps", "transactions",
	"failed", "latency_ms", "connect_ms", "pooler_cpu_us_per_q", "postgres_cpu_us_per_q", "pgbench_cpu_us_per_q",
	"pooler_rw_syscalls_per_q", "pooler_syscalls_per_q", "pooler_ctx_switches_per_q",
	"busy_server_conns_mean", "busy_server_conns_max", "seconds"}

// tsvLine formats a row; NaN is written as NA.
func (r runRow) tsvLine() string {
	f := []string{strconv.Itoa(r.round), r.mode, strconv.Itoa(r.clients), strconv.Itoa(r.rate), r.target, r.status,
		num(r.tps, 1), strconv.FormatInt(r.txns, 10), strconv.FormatInt(r.failed, 10), num(r.latencyMs, 3), num(r.connectMs, 1),
		num(r.poolerUs, 2), num(r.pgUs, 2), num(r.pgbenchUs, 2), num(r.rwSys, 3), num(r.sys, 3), num(r.ctxsw, 3),
		num(r.busyMean, 2), strconv.Itoa(r.busyMax), num(r.seconds, 2)}
	return strings.Join(f, "\t")
}

// num formats v with prec decimals, NA for NaN.
func num(v float64, prec int) string {
	if math.IsNaN(v) {
		return "NA"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// dash formats v for people: "-" for NaN.
func dash(v float64, prec int) string {
	if math.IsNaN(v) {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// rowFormat lays out the per-run lines and the medians alike.
const rowFormat = "%-5s %-8s %-22s %-13s %9s %6s %9s %8s %10s %8s %8s %8s %11s\n"

// printRowHeader prints the column names of the per-run lines.
func printRowHeader(w io.Writer) {
	fmt.Fprintf(w, "\nper query: CPU in µs of the pooler, of all PostgreSQL processes and of pgbench; the pooler's\n"+
		"read+write system calls (syscr+syscw), all system calls (perf) and context switches; busy = server\n"+
		"connections not idle, sampled every 100 ms (mean/max)\n\n")
	fmt.Fprintf(w, rowFormat, "round", "mode", "load", "target", "tps", "failed",
		"pooler_us", "pg_us", "pgbench_us", "rw_sys", "sys", "ctxsw", "busy")
}

// printRow prints one run.
func printRow(w io.Writer, r runRow) {
	status := ""
	if r.status != "ok" {
		status = "  (" + r.status + ")"
	}
	round := strconv.Itoa(r.round)
	if r.round == 0 {
		round = "med"
	}
	fmt.Fprintf(w, strings.TrimSuffix(rowFormat, "\n")+"%s\n", round, r.mode,
		load{r.clients, r.rate}.String(), r.target, dash(r.tps, 0), strconv.FormatInt(r.failed, 10),
		dash(r.poolerUs, 1), dash(r.pgUs, 1), dash(r.pgbenchUs, 1), dash(r.rwSys, 2), dash(r.sys, 2),
		dash(r.ctxsw, 2), fmt.Sprintf("%.1f/%d", r.busyMean, r.busyMax), status)
}

// group is the runs of one (mode, load, target) over the rounds, or the
// reason the target does not run the mode (then it has no rows).
type group struct {
	mode    string
	ld      load
	target  string
	rows    []runRow
	skipped string // "not supported by PgBouncer 1.18.0"; empty when run
}

// median of the runs' values of one column, NaN values left out.
func (g group) median(f func(runRow) float64) float64 {
	var v []float64
	for _, r := range g.rows {
		if x := f(r); !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return math.NaN()
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// medians is one group's median row; failed is the sum over the rounds,
// busyMax the maximum.
func (g group) medians() runRow {
	m := runRow{mode: g.mode, clients: g.ld.clients, rate: g.ld.rate, target: g.target, status: "ok"}
	m.tps = g.median(func(r runRow) float64 { return r.tps })
	m.latencyMs = g.median(func(r runRow) float64 { return r.latencyMs })
	m.connectMs = g.median(func(r runRow) float64 { return r.connectMs })
	m.poolerUs = g.median(func(r runRow) float64 { return r.poolerUs })
	m.pgUs = g.median(func(r runRow) float64 { return r.pgUs })
	m.pgbenchUs = g.median(func(r runRow) float64 { return r.pgbenchUs })
	m.rwSys = g.median(func(r runRow) float64 { return r.rwSys })
	m.sys = g.median(func(r runRow) float64 { return r.sys })
	m.ctxsw = g.median(func(r runRow) float64 { return r.ctxsw })
	m.busyMean = g.median(func(r runRow) float64 { return r.busyMean })
	for _, r := range g.rows {
		m.failed += r.failed
		m.txns += r.txns
		m.busyMax = max(m.busyMax, r.busyMax)
		if r.status != "ok" {
			m.status = r.status
		}
	}
	return m
}

// groupRows groups the runs in the order they were planned, with a group
// for every (mode, load) a target skips so the tables say why it is absent.
func (e *env) groupRows(rows []runRow) []group {
	var out []group
	for mi, mode := range e.cfg.Modes {
		for _, ld := range e.cfg.loads(mi) {
			for _, t := range e.targets {
				g := group{mode: mode, ld: ld, target: t.name}
				if r, ok := t.skip[mode]; ok {
					g.skipped = r.short
					out = append(out, g)
					continue
				}
				for _, r := range rows {
					if r.mode == mode && r.clients == ld.clients && r.rate == ld.rate && r.target == t.name {
						g.rows = append(g.rows, r)
					}
				}
				if len(g.rows) > 0 {
					out = append(out, g)
				}
			}
		}
	}
	return out
}

// ratio is a/b, NaN when either is missing or b is 0.
func ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return math.NaN()
	}
	return a / b
}

// ratioPairs are the comparisons printed per (mode, load): each pgquic
// target against PgBouncer, pipelining on against off, when the relay
// ran, the relay against PgBouncer (what a Go proxy pays to move the bytes)
// and pgquic against the relay (what pooling adds), and when a baseline
// build ran, pgquic against it (what a change did).
var ratioPairs = [][2]string{{targetPgquic, targetBouncer}, {targetNoPipe, targetBouncer}, {targetPgquic, targetNoPipe},
	{targetRelay, targetBouncer}, {targetPgquic, targetRelay}, {targetPgquic, targetBaseline}}

// ratioLine compares two targets' medians; cpuRange is the pooler CPU
// ratio's spread over the rounds (roundRange).
func ratioLine(q, b runRow, cpuRange string) string {
	spread := ""
	if cpuRange != "-" {
		spread = " (rounds " + cpuRange + ")"
	}
	return fmt.Sprintf("%s / %s: tps %sx, pooler CPU per query %sx%s, pooler+PostgreSQL CPU per query %sx",
		q.target, b.target, dash(ratio(q.tps, b.tps), 2), dash(ratio(q.poolerUs, b.poolerUs), 2), spread,
		dash(ratio(q.poolerUs+q.pgUs, b.poolerUs+b.pgUs), 2))
}

// roundRange is the smallest and largest pooler CPU ratio of target a to
// target b among rounds that measured both, as "1.12–1.41x": on a noisy
// machine the spread says how far a median ratio can be trusted, since two
// runs of one round ran seconds apart. "-" when fewer than two rounds have
// both.
func roundRange(groups []group, mode string, ld load, a, b string) string {
	per := map[string]map[int]float64{a: {}, b: {}}
	for _, g := range groups {
		if g.mode != mode || g.ld != ld || per[g.target] == nil {
			continue
		}
		for _, r := range g.rows {
			per[g.target][r.round] = r.poolerUs
		}
	}
	var rs []float64
	for round, x := range per[a] {
		if y, ok := per[b][round]; ok {
			if v := ratio(x, y); !math.IsNaN(v) {
				rs = append(rs, v)
			}
		}
	}
	if len(rs) < 2 {
		return "-"
	}
	return fmt.Sprintf("%.2f–%.2fx", slices.Min(rs), slices.Max(rs))
}

// report prints the medians, ratios and the Markdown summary, and writes
// runs.tsv and summary.md.
func (e *env) report(rows []runRow, traces []straceReport) error {
	groups := e.groupRows(rows)
	med := map[string]runRow{} // mode|load|target -> medians
	key := func(mode string, ld load, target string) string { return mode + "|" + ld.String() + "|" + target }
	fmt.Fprintf(e.w, "\nmedians over %d round(s) (failed: sum over rounds; busy: median of means / max):\n\n", e.cfg.Rounds)
	fmt.Fprintf(e.w, rowFormat, "", "mode", "load", "target", "tps", "failed",
		"pooler_us", "pg_us", "pgbench_us", "rw_sys", "sys", "ctxsw", "busy")
	for i, g := range groups {
		if i > 0 && (groups[i-1].mode != g.mode || groups[i-1].ld != g.ld) {
			e.printRatios(groups, med, groups[i-1].mode, groups[i-1].ld, key)
		}
		if g.skipped != "" {
			fmt.Fprintf(e.w, "%-5s %-8s %-22s %-13s %s\n", "med", g.mode, g.ld, g.target, g.skipped)
			continue
		}
		m := g.medians()
		med[key(g.mode, g.ld, g.target)] = m
		printRow(e.w, m)
	}
	if len(groups) > 0 {
		last := groups[len(groups)-1]
		e.printRatios(groups, med, last.mode, last.ld, key)
	}
	for _, l := range e.highRateNotes(med, key) {
		fmt.Fprintln(e.w, l)
	}
	for _, t := range traces {
		t.print(e.w)
	}

	md := e.markdown(groups, med, key)
	fmt.Fprintf(e.w, "\n%s", md)

	tsv := filepath.Join(e.cfg.Out, "runs.tsv")
	var b strings.Builder
	b.WriteString(strings.Join(tsvColumns, "\t") + "\n")
	for _, r := range rows {
		b.WriteString(r.tsvLine() + "\n")
	}
	if err := os.WriteFile(tsv, []byte(b.String()), 0o644); err != nil {
		return err
	}
	mdPath := filepath.Join(e.cfg.Out, "summary.md")
	if err := os.WriteFile(mdPath, []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(e.w, "\nraw runs (TSV): %s\nsummary (Markdown): %s\n", tsv, mdPath)
	return nil
}

// printRatios prints the ratios of one (mode, load).
func (e *env) printRatios(groups []group, med map[string]runRow, mode string, ld load, key func(string, load, string) string) {
	for _, p := range ratioPairs {
		a, okA := med[key(mode, ld, p[0])]
		b, okB := med[key(mode, ld, p[1])]
		switch {
		case okA && okB:
			fmt.Fprintf(e.w, "      %s\n", ratioLine(a, b, roundRange(groups, mode, ld, p[0], p[1])))
		case okA:
			if why, ok := e.skipped(p[1], mode); ok {
				fmt.Fprintf(e.w, "      %s / %s: %s\n", p[0], p[1], why)
			}
		}
	}
}

// skipped returns why the target does not run the query mode, if it is
// one of the targets and skips it.
func (e *env) skipped(target, mode string) (string, bool) {
	for _, t := range e.targets {
		if r, ok := t.skip[mode]; ok && t.name == target {
			return r.short, true
		}
	}
	return "", false
}

// highRateNotes say what rate the high-rate runs reached and how many
// server connections each target kept busy there.
func (e *env) highRateNotes(med map[string]runRow, key func(string, load, string) string) []string {
	if e.cfg.HighRate == 0 {
		return nil
	}
	ld := load{clients: e.cfg.HighRateClients, rate: e.cfg.HighRate}
	var out []string
	for _, t := range e.targets {
		m, ok := med[key(e.cfg.Modes[0], ld, t.name)]
		if !ok || math.IsNaN(m.tps) {
			continue
		}
		reached := ""
		if m.tps < 0.97*float64(ld.rate) {
			reached = fmt.Sprintf(" (the machine reached only %.0f of the %d q/s asked for)", m.tps, ld.rate)
		}
		out = append(out, fmt.Sprintf("at %d clients, %d q/s asked, -M %s: %s ran %.0f q/s%s with %.1f server connections busy on average, %d at most",
			ld.clients, ld.rate, e.cfg.Modes[0], t.name, m.tps, reached, m.busyMean, m.busyMax))
	}
	if len(out) > 0 {
		out = append([]string{""}, out...)
	}
	return out
}

// markdown renders the summary for the README: the setup line, a table of
// medians and a table of ratios against PgBouncer.
func (e *env) markdown(groups []group, med map[string]runRow, key func(string, load, string) string) string {
	var b strings.Builder
	i := e.info
	fmt.Fprintf(&b, "**pgbench -S through a pool of %d server connections**, measured %s with `scripts/bench-pgbouncer`: "+
		"Linux %s, %d CPUs, %s, %s, %s, %s; %d round(s) of %d s per run, targets interleaved, medians; load average %s at the start, %s at the end.\n\n",
		e.cfg.Pool, i.date, i.kernel, i.cpus, i.goVersion, i.pgVersion, i.pgbench, orDash(i.bouncer),
		e.cfg.Rounds, e.cfg.Seconds, i.loadStart, i.loadEnd)
	var poolers []string
	for _, t := range e.targets {
		if t.proc != nil {
			poolers = append(poolers, fmt.Sprintf("%s: %s", t.name, t.flags))
		}
	}
	if len(poolers) > 0 {
		fmt.Fprintf(&b, "Poolers: %s.\n\n", strings.Join(poolers, "; "))
	}
	b.WriteString("| mode | load | target | tps | failed | pooler µs/q | PostgreSQL µs/q | pgbench µs/q | pooler read+write syscalls/q | pooler syscalls/q | pooler ctx switches/q | busy server conns mean / max |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, g := range groups {
		if g.skipped != "" {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | - | - | - | - | - | - | - | - |\n", g.mode, g.ld, g.target, g.skipped)
			continue
		}
		m := med[key(g.mode, g.ld, g.target)]
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %s | %s | %s | %s | %s | %s | %.1f / %d |\n",
			g.mode, g.ld, g.target, thousands(m.tps), m.failed, dash(m.poolerUs, 1), dash(m.pgUs, 1),
			dash(m.pgbenchUs, 1), dash(m.rwSys, 2), dash(m.sys, 2), dash(m.ctxsw, 2), m.busyMean, m.busyMax)
	}
	var ratios []string
	seen := map[string]bool{}
	for _, g := range groups {
		k := g.mode + "|" + g.ld.String()
		if seen[k] {
			continue
		}
		seen[k] = true
		for _, p := range ratioPairs {
			m, okA := med[key(g.mode, g.ld, p[0])]
			bm, okB := med[key(g.mode, g.ld, p[1])]
			if why, skip := e.skipped(p[1], g.mode); okA && skip {
				ratios = append(ratios, fmt.Sprintf("| %s | %s | %s / %s | %s | - | - | - |", g.mode, g.ld, p[0], p[1], why))
			}
			if !okA || !okB {
				continue
			}
			ratios = append(ratios, fmt.Sprintf("| %s | %s | %s / %s | %sx | %sx | %s | %sx |", g.mode, g.ld, p[0], p[1],
				dash(ratio(m.tps, bm.tps), 2), dash(ratio(m.poolerUs, bm.poolerUs), 2),
				roundRange(groups, g.mode, g.ld, p[0], p[1]),
				dash(ratio(m.poolerUs+m.pgUs, bm.poolerUs+bm.pgUs), 2)))
		}
	}
	if len(ratios) > 0 {
		b.WriteString("\n| mode | load | ratio | tps | pooler CPU per query | the same, rounds min–max | pooler+PostgreSQL CPU per query |\n")
		b.WriteString("|---|---|---|---:|---:|---:|---:|\n")
		b.WriteString(strings.Join(ratios, "\n") + "\n")
	}
	notes := slices.Clone(e.notes)
	for _, g := range groups {
		empty := 0
		for _, r := range g.rows {
			if r.txns == 0 {
				empty++
			}
		}
		if empty > 0 {
			notes = append(notes, fmt.Sprintf("%s, -M %s, %s: %d of %d runs completed no transaction in %d s "+
				"(connecting took the whole run): lengthen --duration", g.target, g.mode, g.ld, empty, len(g.rows), e.cfg.Seconds))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n")
		for _, n := range notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	return b.String()
}

// thousands formats a rate as an integer with comma separators.
func thousands(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func orDash(s string) string {
	if s == "" {
		return "PgBouncer not run"
	}
	return s
}
