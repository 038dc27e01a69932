package benchtool

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pgbenchResult is what one pgbench run reported.
type pgbenchResult struct {
	tps       float64       // "tps = N (without initial connection time)"
	txns      int64         // transactions actually processed
	failed    int64         // failed transactions (PostgreSQL 15+ pgbench)
	latencyMs float64       // average latency
	connectMs float64       // initial connection time
	cpu       time.Duration // pgbench's own user + system CPU
	aborted   bool          // pgbench exited non-zero (clients aborted)
	output    string        // stdout and stderr, for error messages
}

var (
	reTPS     = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
	reTxns    = regexp.MustCompile(`(?m)^number of transactions actually processed: ([0-9]+)`)
	reFailed  = regexp.MustCompile(`(?m)^number of failed transactions: ([0-9]+)`)
	reLatency = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
	reConnect = regexp.MustCompile(`(?m)^initial connection time = ([0-9.]+) ms`)
)

// parsePgbench reads pgbench's summary. A missing tps line is an error
// unless no transaction completed; a missing failed-transactions line
// (pgbench before 15) counts as none.
func parsePgbench(out string) (pgbenchResult, error) {
	r := pgbenchResult{output: out}
	txns := reTxns.FindStringSubmatch(out)
	if txns != nil {
		r.txns, _ = strconv.ParseInt(txns[1], 10, 64)
	}
	m := reTPS.FindStringSubmatch(out)
	switch {
	case m != nil:
		r.tps, _ = strconv.ParseFloat(m[1], 64)
	case txns == nil || r.txns > 0:
		// pgbench prints no tps when nothing completed (all the time went
		// into connecting); anything else without it is an error.
		return r, fmt.Errorf("pgbench printed no tps line")
	}
	if m := reFailed.FindStringSubmatch(out); m != nil {
		r.failed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reLatency.FindStringSubmatch(out); m != nil {
		r.latencyMs, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := reConnect.FindStringSubmatch(out); m != nil {
		r.connectMs, _ = strconv.ParseFloat(m[1], 64)
	}
	return r, nil
}

// pgbenchArgs builds a select-only run: -S, no vacuum, the query mode,
// clients, threads, duration and, when rate > 0, a fixed rate.
func pgbenchArgs(mode string, clients, jobs, rate, seconds, port int, db string) []string {
	j := min(jobs, clients)
	args := []string{"-S", "-n", "-M", mode, "-c", strconv.Itoa(clients), "-j", strconv.Itoa(j),
		"-T", strconv.Itoa(seconds), "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "postgres"}
	if rate > 0 {
		args = append(args, "-R", strconv.Itoa(rate))
	}
	return append(args, db)
}

// pgbenchRun is a pgbench started but not yet waited for.
type pgbenchRun struct {
	args []string
	out  *bytes.Buffer // written by exec until the process is waited for
	c    *child
}

// startPgbench starts pgbench with args.
func (e *env) startPgbench(args []string) (*pgbenchRun, error) {
	out := &bytes.Buffer{}
	cmd := exec.Command(e.cfg.PgbenchBin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(cmd.Environ(), "PGPASSWORD=postgres", "PGSSLMODE=disable")
	c, err := e.spawn.start("pgbench", cmd, nil)
	if err != nil {
		return nil, err
	}
	return &pgbenchRun{args: args, out: out, c: c}, nil
}

// wait waits for pgbench to end and parses its summary. A run whose
// clients aborted still returns what pgbench printed, marked aborted.
func (p *pgbenchRun) wait(ctx context.Context) (pgbenchResult, error) {
	select {
	case <-p.c.done:
	case <-ctx.Done():
		p.c.stop(syscall.SIGINT)
		return pgbenchResult{}, ctx.Err()
	}
	r, perr := parsePgbench(p.out.String())
	r.cpu = p.c.rusageCPU()
	r.aborted = p.c.err != nil
	if perr != nil {
		return r, fmt.Errorf("pgbench %s: %w (exit: %v)\n%s", strings.Join(p.args, " "), perr, p.c.err, tail(p.out.String(), 15))
	}
	return r, nil
}

// runPgbench runs pgbench to completion and parses its summary.
func (e *env) runPgbench(ctx context.Context, args []string) (pgbenchResult, error) {
	p, err := e.startPgbench(args)
	if err != nil {
		return pgbenchResult{}, err
	}
	return p.wait(ctx)
}
