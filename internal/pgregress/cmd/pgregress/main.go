// Command pgregress runs PostgreSQL's regression suite (pg_regress, parallel
// schedule) directly and through pgquic in session and transaction mode,
// each against a fresh throwaway cluster, prints counts and failures per
// mode, and with -check fails when a pooled mode fails a test that is not on
// the written list of expected failures, a test hangs, or the run changed
// anything outside its own database. scripts/pg-regress installs what it
// needs and runs it; see internal/pgregress/README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pgquic/pgquic/internal/pgregress"
)

func main() {
	os.Exit(run())
}

// run parses flags, runs the modes and prints the report. Exit status: 0
// done (and, under -check, as expected), 1 the check failed, 2 a run could
// not be done.
func run() int {
	var o pgregress.Options
	flag.StringVar(&o.RegressDir, "regress-dir", os.Getenv("PGQUIC_PG_REGRESS_DIR"), "the suite: sql/, expected/, data/, parallel_schedule (default $PGQUIC_PG_REGRESS_DIR)")
	flag.StringVar(&o.LibDir, "lib", "", "directory holding regress.so, autoinc.so and refint.so")
	flag.StringVar(&o.PgRegress, "pg-regress", "", "the pg_regress program")
	flag.StringVar(&o.BinDir, "bindir", "", "directory holding psql (default: where the server binaries are found)")
	flag.StringVar(&o.Out, "out", "", "directory for each mode's pg_regress output and diffs (default: a new temporary directory)")
	flag.IntVar(&o.PoolSize, "pool-size", 20, "the pooler's server connections per (database, user)")
	flag.IntVar(&o.MaxConcurrent, "max-concurrent-tests", 20, "tests pg_regress runs at once")
	flag.DurationVar(&o.TestTimeout, "test-timeout", 3*time.Minute, "one test's limit: its psql is killed after it and the test counted as hung")
	modesFlag := flag.String("modes", "direct,session,transaction", "modes to run, comma-separated, direct first to compare")
	expectedFile := flag.String("expected", "", "the written list of expected failures (MODE TEST REASON per line)")
	check := flag.Bool("check", false, "exit 1 when a pooled mode fails a test not on the list, a test hangs, or objects outside the test database changed")
	verbose := flag.Bool("v", false, "log the pooler's warnings to standard error")
	flag.Parse()

	var modes []pgregress.Mode
	for _, f := range strings.Split(*modesFlag, ",") {
		m, err := pgregress.ParseMode(strings.TrimSpace(f))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		modes = append(modes, m)
	}
	expected := pgregress.Expected{}
	if *expectedFile != "" {
		f, err := os.Open(*expectedFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		expected, err = pgregress.ParseExpected(f)
		f.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	if o.Out == "" {
		var err error
		if o.Out, err = os.MkdirTemp("", "pg-regress-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	if *verbose {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	report, err := os.Create(filepath.Join(o.Out, "report.txt"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer report.Close()
	w := io.MultiWriter(os.Stdout, report)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s pgregress: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	logf("output in %s", o.Out)
	status := 0
	var direct *pgregress.Result
	for _, m := range modes {
		logf("%s: running", m)
		r, err := pgregress.Run(ctx, o, m)
		if err != nil {
			fmt.Fprintf(os.Stderr, "pgregress: %s: %v\n", m, err)
			return 2
		}
		ok, failed := r.Counts()
		logf("%s: %d ok, %d failed, %d hung (%s)", m, ok, failed, len(r.Hung), r.Duration.Round(time.Second))
		if m == pgregress.Direct {
			direct = r
			pgregress.WriteReport(w, r, nil, expected)
			if len(r.Harm) > 0 && *check {
				status = 1
			}
			continue
		}
		v := pgregress.Judge(r, direct, expected)
		pgregress.WriteReport(w, r, v, expected)
		if !v.OK() && *check {
			status = 1
		}
	}
	fmt.Fprintf(w, "\npg_regress output and diffs per mode: %s\n", o.Out)
	if status != 0 {
		fmt.Fprintln(w, "pgregress: FAILED: see the HUNG, UNEXPECTED and CHANGED lines above")
	}
	return status
}
