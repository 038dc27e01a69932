package benchtool

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// straceTop is how many system calls the strace summary lists by name.
const straceTop = 10

// straceReport is the system-call table of one traced run.
type straceReport struct {
	target string
	mode   string
	ld     load
	txns   int64
	rows   []straceRow
}

// print writes the calls per query of the traced run, most frequent first.
func (s straceReport) print(w io.Writer) {
	fmt.Fprintf(w, "\nstrace -c -f of %s, -M %s, %s (%d queries; tracing slows the pooler, so only the counts mean anything):\n",
		s.target, s.mode, s.ld, s.txns)
	var total int64
	for _, r := range s.rows {
		total += r.calls
	}
	fmt.Fprintf(w, "  %-20s %10s %10s\n", "syscall", "calls", "per query")
	var rest int64
	for i, r := range s.rows {
		if i >= straceTop {
			rest += r.calls
			continue
		}
		fmt.Fprintf(w, "  %-20s %10d %10s\n", r.name, r.calls, dash(perQuery(float64(r.calls), s.txns), 3))
	}
	if rest > 0 {
		fmt.Fprintf(w, "  %-20s %10d %10s\n", "(others)", rest, dash(perQuery(float64(rest), s.txns), 3))
	}
	fmt.Fprintf(w, "  %-20s %10d %10s\n", "total", total, dash(perQuery(float64(total), s.txns), 3))
}

// straceRuns runs, after the rounds, one more pgbench per pooler with
// strace -c -f attached to it, at the fixed rate (or the first saturation
// load) in the first mode.
func (e *env) straceRuns(ctx context.Context) ([]straceReport, error) {
	ld := load{clients: e.cfg.RateClients, rate: e.cfg.Rate}
	if e.cfg.Rate == 0 {
		ld = e.cfg.loads(0)[0]
	}
	mode := e.cfg.Modes[0]
	var out []straceReport
	for _, t := range e.targets {
		if t.pid == nil {
			continue
		}
		if _, skip := t.skip[mode]; skip {
			continue
		}
		fmt.Fprintf(e.w, "strace run: %s, -M %s, %s\n", t.name, mode, ld)
		file := filepath.Join(e.workDir, t.name+".strace")
		cmd := exec.Command(e.straceBin, "-c", "-f", "-p", strconv.Itoa(t.pid()), "-o", file)
		c, err := e.spawn.start("strace", cmd, nil)
		if err != nil {
			return out, err
		}
		if err := waitTraced(ctx, t.pid(), c); err != nil {
			c.stop(syscall.SIGINT)
			return out, err
		}
		res, err := e.runPgbench(ctx, pgbenchArgs(mode, ld.clients, e.cfg.Jobs, ld.rate, e.cfg.Seconds, t.port, benchDB))
		c.stop(syscall.SIGINT)
		if err != nil {
			return out, err
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return out, fmt.Errorf("strace output: %w", err)
		}
		rows := parseStrace(string(b))
		sort.Slice(rows, func(i, j int) bool { return rows[i].calls > rows[j].calls })
		out = append(out, straceReport{target: t.name, mode: mode, ld: ld, txns: res.txns, rows: rows})
	}
	return out, nil
}

// waitTraced polls until every thread of pid has a tracer, so the traced
// run starts with strace attached everywhere.
func waitTraced(ctx context.Context, pid int, tracer *child) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		paths, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
		traced := 0
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err == nil && !strings.Contains(string(b), "TracerPid:\t0\n") {
				traced++
			}
		}
		if len(paths) > 0 && traced == len(paths) {
			return nil
		}
		if tracer.exited() || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("strace did not attach to pid %d: %v", pid, tracer.err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
