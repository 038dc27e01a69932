// Package benchtool is the benchmark behind scripts/bench-pgbouncer: it
// starts a throwaway PostgreSQL, pgquic (with and without cross-client
// pipelining) and PgBouncer with the same pool size, runs pgbench -S
// against each of them and PostgreSQL directly, interleaved round by round,
// at saturation and at a fixed rate, and reports throughput, CPU per query
// of the pooler, of PostgreSQL and of pgbench, the pooler's system calls and
// context switches per query, and how many server connections the load
// kept busy. Medians, ratios against PgBouncer, a Markdown table for the
// README and a TSV of every raw run come out at the end.
//
// It is a program (Main), not a library: the script builds it and the
// pgquic binary and runs it; the test runs Main in quick mode. Linux only:
// it reads /proc.
package benchtool

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Query modes pgbench supports, the default --modes.
var allModes = []string{"extended", "prepared", "simple"}

// Config is the benchmark's whole setup, filled from the command line.
type Config struct {
	// Rounds is how many times every run is repeated, interleaved; the
	// report shows medians. Default 3 (1 with Quick).
	Rounds int
	// Seconds is each pgbench run's duration. Default 5 (3 with Quick).
	Seconds int
	// Pool is the server connections per pool, the same for every pooler.
	// Default 20.
	Pool int
	// Clients are the client counts of the saturation runs. Default 20, 200.
	Clients []int
	// Rate and RateClients make the fixed-rate run of every mode (pgbench
	// -R); Rate 0 leaves it out. Default 2000 q/s with 20 clients.
	Rate, RateClients int
	// HighRate and HighRateClients make one more fixed-rate run, in the
	// first mode only, that shows how many server connections a heavy load
	// keeps busy; HighRate 0 leaves it out. Default 20000 q/s with 200
	// clients.
	HighRate, HighRateClients int
	// Modes are the pgbench query modes. Default extended, prepared, simple.
	Modes []string
	// Targets are what pgbench connects to, interleaved in this order
	// (rotated each round). Default direct, pgquic, pgquic-nopipe, pgbouncer.
	Targets []string
	// Jobs is pgbench's -j. Default 2.
	Jobs int
	// PgquicBin is the pgquic binary to measure. Required.
	PgquicBin string
	// PgquicFlags are extra `pgquic serve` flags for both pgquic targets.
	PgquicFlags []string
	// RelayBin is the bare-relay binary the relay target runs; needed
	// only when Targets names relay.
	RelayBin string
	// BaselineBin is another pgquic binary (an earlier commit's, say) the
	// baseline target runs with the same flags as pgquic, so a change is
	// measured against what it changed, interleaved in one run; needed
	// only when Targets names baseline.
	BaselineBin string
	// PgbouncerBin, PgbenchBin: default from PATH, then /usr/sbin.
	PgbouncerBin, PgbenchBin string
	// Out is the directory for runs.tsv and summary.md. Default a new
	// directory under the system's temporary directory.
	Out string
	// Strace adds one traced run per pooler (strace -c -f) after the
	// rounds, when strace is installed. Default off.
	Strace bool
	// NoPerf turns off counting every system call of the pooler with
	// `perf stat` (used when perf works here). Default off.
	NoPerf bool
	// Quick is one round of 3 s runs, for a smoke run.
	Quick bool
}

// parseArgs reads the command line into a Config.
func parseArgs(args []string, stderr io.Writer) (Config, error) {
	cfg := Config{}
	fs := flag.NewFlagSet("bench-pgbouncer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var clients, modes, targets, pgquicFlags string
	fs.IntVar(&cfg.Rounds, "rounds", 3, "interleaved rounds; the report shows medians")
	fs.IntVar(&cfg.Seconds, "duration", 5, "seconds per pgbench run")
	fs.IntVar(&cfg.Pool, "pool", 20, "server connections per pool, the same for every pooler")
	fs.StringVar(&clients, "clients", "20 200", "client counts of the saturation runs (space or comma separated)")
	fs.IntVar(&cfg.Rate, "rate", 2000, "fixed rate in queries per second (pgbench -R) run in every mode; 0 leaves it out")
	fs.IntVar(&cfg.RateClients, "rate-clients", 20, "clients of the fixed-rate run")
	fs.IntVar(&cfg.HighRate, "high-rate", 20000, "second fixed rate, in the first mode only, to count busy server connections under heavy load; 0 leaves it out")
	fs.IntVar(&cfg.HighRateClients, "high-rate-clients", 200, "clients of the --high-rate run")
	fs.StringVar(&modes, "modes", strings.Join(allModes, ","), "pgbench query modes: extended, prepared, simple")
	fs.StringVar(&targets, "targets", strings.Join(allTargets, ","), "targets, interleaved: direct, pgquic, pgquic-nopipe (needs `pgquic serve --pipeline-depth`), pgbouncer, relay (not by default: a bare Go relay, no pooling, needs --relay) to tell what moving the bytes costs any Go proxy from what pgquic's pooling adds, and baseline (not by default: another pgquic build, needs --baseline)")
	fs.IntVar(&cfg.Jobs, "jobs", 2, "pgbench threads (-j)")
	fs.StringVar(&cfg.PgquicBin, "pgquic", "", "pgquic binary to measure (scripts/bench-pgbouncer builds one)")
	fs.StringVar(&cfg.RelayBin, "relay", "", "bare-relay binary for the relay target (scripts/bench-pgbouncer builds one)")
	fs.StringVar(&cfg.BaselineBin, "baseline", "", "another pgquic binary for the baseline target, run with the same flags as pgquic (scripts/bench-pgbouncer --baseline-rev REV builds one)")
	fs.StringVar(&pgquicFlags, "pgquic-flags", "", "extra `pgquic serve` flags for both pgquic targets")
	fs.StringVar(&cfg.PgbouncerBin, "pgbouncer", "", "PgBouncer binary (default: PATH, then /usr/sbin/pgbouncer); 1.21 and later also run -M prepared (max_prepared_statements)")
	fs.StringVar(&cfg.PgbenchBin, "pgbench", "", "pgbench binary (default: PATH)")
	fs.StringVar(&cfg.Out, "out", "", "directory for runs.tsv and summary.md (default: a new temporary directory)")
	fs.BoolVar(&cfg.Strace, "strace", false, "after the rounds, one run per pooler under strace -c -f (when strace is installed)")
	fs.BoolVar(&cfg.NoPerf, "no-perf", false, "do not count the pooler's system calls with perf stat")
	fs.BoolVar(&cfg.Quick, "quick", false, "smoke run: 1 round of 3 s runs (unless --rounds/--duration say otherwise)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: scripts/bench-pgbouncer [flags]

Compares pgbench -S directly against PostgreSQL, through pgquic (with and
without cross-client pipelining) and through PgBouncer, all with the same
pool size, interleaved, at saturation and at a fixed rate. Prints tps,
failed transactions, CPU per query (pooler, PostgreSQL, pgbench), the
pooler's system calls and context switches per query and the busy server
connections, then medians, ratios and a Markdown summary; writes every raw
run to a TSV.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if cfg.Quick {
		if !set["rounds"] {
			cfg.Rounds = 1
		}
		if !set["duration"] {
			cfg.Seconds = 3
		}
	}
	var err error
	if cfg.Clients, err = parseInts(clients); err != nil {
		return cfg, fmt.Errorf("--clients: %w", err)
	}
	cfg.Modes = splitList(modes)
	for _, m := range cfg.Modes {
		if !slices.Contains(allModes, m) {
			return cfg, fmt.Errorf("--modes: unknown mode %q (extended, prepared, simple)", m)
		}
	}
	cfg.Targets = splitList(targets)
	for _, t := range cfg.Targets {
		if !slices.Contains(knownTargets, t) {
			return cfg, fmt.Errorf("--targets: unknown target %q (%s)", t, strings.Join(knownTargets, ", "))
		}
	}
	cfg.PgquicFlags = strings.Fields(pgquicFlags)
	switch {
	case cfg.Rounds < 1 || cfg.Seconds < 1 || cfg.Pool < 1 || cfg.Jobs < 1:
		return cfg, errors.New("--rounds, --duration, --pool and --jobs must be at least 1")
	case cfg.Rate < 0 || cfg.HighRate < 0 || cfg.RateClients < 1 || cfg.HighRateClients < 1:
		return cfg, errors.New("rates must be >= 0 and their client counts >= 1")
	case len(cfg.Modes) == 0 || len(cfg.Targets) == 0:
		return cfg, errors.New("--modes and --targets must not be empty")
	case len(cfg.Clients) == 0 && cfg.Rate == 0 && cfg.HighRate == 0:
		return cfg, errors.New("nothing to run: no --clients and no rates")
	}
	return cfg, nil
}

// parseInts reads positive integers separated by spaces or commas.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// splitList splits on commas and spaces, dropping empty items.
func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
}

// Main runs the benchmark with command-line args and returns the exit
// code: 0 done, 1 failed (a message on stderr), 2 bad usage.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench-pgbouncer:", err)
		return 2
	}
	if err := Run(ctx, cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "bench-pgbouncer:", err)
		return 1
	}
	return 0
}
