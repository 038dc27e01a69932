package driversuite

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// Suite is one driver's test suite.
type Suite interface {
	// Name names the suite and its version in reports.
	Name() string
	// Prepare checks tools and assembles the runnable tree; it is
	// idempotent and cheap once done.
	Prepare(ctx context.Context) error
	// Run runs the suite against e and returns each test's outcome,
	// writing raw logs to logDir.
	Run(ctx context.Context, e Endpoint, m Mode, logDir string) (*Result, error)
}

// RunModes runs s once per mode, each on a fresh cluster (so one mode's
// leftovers, roles or server settings cannot change the next), the
// pooled modes through a fresh pooler. logf reports progress. Results are
// returned in the order of modes.
func RunModes(ctx context.Context, s Suite, modes []Mode, logDir string, logger *slog.Logger, logf func(string, ...any)) ([]*Result, error) {
	if err := s.Prepare(ctx); err != nil {
		return nil, err
	}
	var results []*Result
	for _, m := range modes {
		r, err := runMode(ctx, s, m, logDir, logger, logf)
		if err != nil {
			return results, fmt.Errorf("%s, %s: %w", s.Name(), m, err)
		}
		results = append(results, r)
	}
	return results, nil
}

// runMode runs s in mode m on its own cluster.
func runMode(ctx context.Context, s Suite, m Mode, logDir string, logger *slog.Logger, logf func(string, ...any)) (*Result, error) {
	c, err := StartCluster(ctx, logger)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := c.Stop(); err != nil {
			logf("stop PostgreSQL: %v", err)
		}
	}()
	e := c.Endpoint()
	var p *Pooler
	if m != Direct {
		var plog *slog.Logger
		if logDir != "" {
			f, err := os.Create(filepath.Join(logDir, "pooler-"+suiteFile(s)+"-"+string(m)+".log"))
			if err != nil {
				return nil, err
			}
			defer f.Close()
			plog = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}
		p, err = StartPooler(c, m, plog)
		if err != nil {
			return nil, err
		}
		defer func() {
			if err := p.Close(); err != nil {
				logf("stop pooler: %v", err)
			}
		}()
		e = p.Endpoint()
	}
	logf("%s: %s run (port %d)", s.Name(), m, e.Port)
	start := time.Now()
	r, err := s.Run(ctx, e, m, logDir)
	if err != nil {
		return nil, err
	}
	r.Duration = time.Since(start)
	if p != nil {
		r.Accepted = p.Accepted()
	}
	logf("%s: %s: %s (%s)", s.Name(), m, r.Count(func(id string) bool { return !isCase(id) }), r.Duration.Round(time.Second))
	return r, nil
}

// suiteFile is a file-name-safe short name of s.
func suiteFile(s Suite) string {
	switch s.(type) {
	case *NodePostgres:
		return "node-postgres"
	case *Psycopg:
		return "psycopg"
	}
	return "suite"
}

// WriteJSON writes results as DIR/<suite>.json for later comparison.
func WriteJSON(dir string, s Suite, results []*Result) error {
	b, err := json.MarshalIndent(results, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, suiteFile(s)+".json"), b, 0o644)
}

// ReadJSON reads results written by WriteJSON.
func ReadJSON(file string) ([]*Result, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var rs []*Result
	if err := json.Unmarshal(b, &rs); err != nil {
		return nil, fmt.Errorf("driversuite: %s: %w", file, err)
	}
	return rs, nil
}

// Split separates the direct run from the pooled ones.
func Split(results []*Result) (direct *Result, others []*Result) {
	for _, r := range results {
		if r.Mode == Direct {
			direct = r
		} else {
			others = append(others, r)
		}
	}
	return direct, others
}

// CacheDir is where runnable trees are assembled and kept between runs:
// $XDG_CACHE_HOME/pgquic/driversuite (usually ~/.cache/...).
func CacheDir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "pgquic", "driversuite"), nil
}

// SourcesEnv names the environment variable that points at the directory
// holding the suites' sources: node-postgres-<NodePostgresVersion>/ (with
// packages/pg/test) and psycopg-<PsycopgVersion>/ (with tests/).
const SourcesEnv = "PGQUIC_DRIVER_SUITES_SRC"

// SourcesDir returns $PGQUIC_DRIVER_SUITES_SRC, or src/ under CacheDir,
// where scripts/driver-suites unpacks Debian's source packages.
func SourcesDir() (string, error) {
	if d := os.Getenv(SourcesEnv); d != "" {
		return filepath.Abs(d)
	}
	c, err := CacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(c, "src"), nil
}
