// Command driversuite runs node-postgres' and psycopg's own test suites
// directly against a throwaway PostgreSQL and through pgquic in session and
// transaction mode, and prints the tests that pass directly but not through
// pgquic, mode by mode. scripts/driver-suites installs what it needs and runs
// it; see internal/driversuite/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pgquic/pgquic/internal/driversuite"
)

func main() {
	os.Exit(run())
}

// run parses flags, runs the suites and prints the report. Exit status: 0
// done, 1 regressions under -strict (any in session mode, those not on the
// written list in transaction mode), 2 a suite could not run.
func run() int {
	suites := flag.String("suite", "all", "suites to run: node-postgres, psycopg or all")
	modesFlag := flag.String("modes", "direct,session,transaction", "modes to run, comma-separated (direct first to compare)")
	out := flag.String("out", "", "directory for logs, JUnit files and <suite>.json (default: a new temporary directory)")
	testdata := flag.String("src", "", "directory holding the suites' sources, node-postgres-"+driversuite.NodePostgresVersion+"/ and psycopg-"+driversuite.PsycopgVersion+"/ (default: $"+driversuite.SourcesEnv+", else src/ in the runner's cache directory)")
	nodeSrc := flag.String("node-src", "", "node-postgres source tree with packages/pg/test (default: SRC/node-postgres-"+driversuite.NodePostgresVersion+")")
	psycopgSrc := flag.String("psycopg-src", "", "psycopg source tree with tests/ (default: SRC/psycopg-"+driversuite.PsycopgVersion+")")
	nodeFiles := flag.String("node-files", "", "comma-separated node-postgres files under test/integration (default: all)")
	psycopgArgs := flag.String("psycopg-args", "", "space-separated pytest selection for psycopg (default: tests)")
	subset := flag.Bool("ci", false, "run only the curated CI subset of each suite")
	work := flag.String("work", "", "directory where the runnable trees are assembled (default: the user cache directory's pgquic/driversuite); give concurrent runs different ones")
	psyMarker := flag.String("psycopg-m", "", "pytest -m expression for psycopg (e.g. \"not slow\")")
	psyTimeout := flag.Duration("psycopg-timeout", 0, "bound on one psycopg pytest run (default 60m); a run cut short reports the tests it reached")
	strict := flag.Bool("strict", false, "exit 1 when a test passes directly but not through pgquic in session mode, or in transaction mode unless it is on the written list (transaction-expected.txt)")
	flag.Parse()

	expected, err := driversuite.TransactionExpected()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	modes, err := parseModes(*modesFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if *out == "" {
		if *out, err = os.MkdirTemp("", "driver-suites-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cache := *work
	if cache == "" {
		if cache, err = driversuite.CacheDir(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	td := *testdata
	if td == "" {
		td, err = driversuite.SourcesDir()
	} else {
		td, err = filepath.Abs(td)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if *nodeSrc == "" {
		*nodeSrc = filepath.Join(td, "node-postgres-"+driversuite.NodePostgresVersion)
	}
	if *psycopgSrc == "" {
		*psycopgSrc = filepath.Join(td, "psycopg-"+driversuite.PsycopgVersion)
	}
	node := &driversuite.NodePostgres{Src: *nodeSrc, Work: filepath.Join(cache, "node-postgres-"+driversuite.NodePostgresVersion)}
	psy := &driversuite.Psycopg{Src: *psycopgSrc, Work: filepath.Join(cache, "psycopg-"+driversuite.PsycopgVersion)}
	psy.Timeout = *psyTimeout
	if *subset {
		node.Files = driversuite.CINodePostgresFiles
		psy.Args = driversuite.CIPsycopgModules
	}
	if *nodeFiles != "" {
		node.Files = strings.Split(*nodeFiles, ",")
	}
	if *psycopgArgs != "" {
		psy.Args = strings.Fields(*psycopgArgs)
	}
	if *psyMarker != "" {
		if len(psy.Args) == 0 {
			psy.Args = []string{"tests"}
		}
		psy.Args = append([]string{"-m", *psyMarker}, psy.Args...)
	}
	var chosen []driversuite.Suite
	switch *suites {
	case "all":
		chosen = []driversuite.Suite{node, psy}
	case "node-postgres":
		chosen = []driversuite.Suite{node}
	case "psycopg":
		chosen = []driversuite.Suite{psy}
	default:
		fmt.Fprintf(os.Stderr, "unknown -suite %q\n", *suites)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s driversuite: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	logf("logs in %s", *out)
	status := 0
	for _, s := range chosen {
		results, err := driversuite.RunModes(ctx, s, modes, *out, slog.New(slog.DiscardHandler), logf)
		if len(results) > 0 {
			if werr := driversuite.WriteJSON(*out, s, results); werr != nil {
				err = errors.Join(err, werr)
			}
			direct, others := driversuite.Split(results)
			driversuite.WriteReport(os.Stdout, direct, others)
			if direct != nil {
				for _, r := range others {
					switch r.Mode {
					case driversuite.Session:
						if len(driversuite.Regressions(direct, r)) > 0 && *strict {
							status = max(status, 1)
						}
					case driversuite.Transaction:
						driversuite.WriteVerdict(os.Stdout, direct, r, expected)
						if unexpected, _, _ := driversuite.SplitExpected(direct, r, expected); len(unexpected) > 0 && *strict {
							status = max(status, 1)
						}
					}
				}
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "driversuite: %v\n", err)
			status = 2
		}
	}
	fmt.Printf("\nlogs, JUnit files and per-suite JSON: %s\n", *out)
	return status
}

// parseModes parses the -modes list.
func parseModes(s string) ([]driversuite.Mode, error) {
	var modes []driversuite.Mode
	for _, f := range strings.Split(s, ",") {
		m, err := driversuite.ParseMode(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		modes = append(modes, m)
	}
	return modes, nil
}
