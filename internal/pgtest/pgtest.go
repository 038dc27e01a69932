// Package pgtest gives integration tests throwaway PostgreSQL clusters:
// every test in this project talks to a real PostgreSQL started here, never
// a mock. It is a thin test-facing layer over internal/pgcluster, which the
// pgquic binary uses too.
package pgtest

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/pgcluster"
)

// Cluster is a running throwaway PostgreSQL; see pgcluster.Cluster.
type Cluster = pgcluster.Cluster

// Options configure a cluster; see pgcluster.Options.
type Options = pgcluster.Options

// User is a login role created at start; see pgcluster.User.
type User = pgcluster.User

// Authentication methods for Options.Auth; see pgcluster.
const (
	AuthTrust    = pgcluster.AuthTrust
	AuthSCRAM    = pgcluster.AuthSCRAM
	AuthMD5      = pgcluster.AuthMD5
	AuthPassword = pgcluster.AuthPassword
)

// ErrNoBinaries reports that initdb and postgres were not found.
var ErrNoBinaries = pgcluster.ErrNoBinaries

// ErrStopped reports a use of a stopped cluster.
var ErrStopped = pgcluster.ErrStopped

// New starts a cluster for a test and stops it in t.Cleanup. Without
// PostgreSQL binaries the test is skipped, except under CI (env CI=true),
// where a missing PostgreSQL is a failure rather than a silent skip.
func New(t testing.TB, opts Options) *Cluster { return pgcluster.New(t, opts) }

// Start starts a cluster that the caller stops; see pgcluster.Start.
func Start(ctx context.Context, opts Options) (*Cluster, error) { return pgcluster.Start(ctx, opts) }

// Binaries returns the directory of initdb and postgres; see
// pgcluster.Binaries.
func Binaries() (string, error) { return pgcluster.Binaries() }

// Shared is one cluster reused by the tests of a package that do not
// restart or break it, so the package pays initdb once. Declare it as a
// package variable, call Get in tests and run the package through Run in
// TestMain, which stops the cluster before goleak looks for goroutines.
type Shared struct {
	mu  sync.Mutex
	c   *Cluster
	err error
}

// Get returns the shared cluster, starting it on first use. Without
// PostgreSQL it skips the test, except under CI=true, where it fails.
func (s *Shared) Get(t testing.TB) *Cluster {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil {
		return s.c
	}
	if s.err != nil {
		t.Fatalf("shared cluster failed to start earlier: %v", s.err)
	}
	if _, err := Binaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI: %v", err)
		}
		t.Skipf("PostgreSQL not installed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{})
	if err != nil {
		if errors.Is(err, ErrNoBinaries) && os.Getenv("CI") != "true" {
			t.Skipf("PostgreSQL not installed: %v", err)
		}
		s.err = err
		t.Fatalf("start shared cluster: %v", err)
	}
	s.c = c
	return c
}

// Run wraps m so that m.Run is followed by stopping the shared cluster; pass
// it to goleak.VerifyTestMain. A failure to stop fails the run.
func (s *Shared) Run(m *testing.M) interface{ Run() int } { return sharedRun{s, m} }

type sharedRun struct {
	s *Shared
	m *testing.M
}

func (r sharedRun) Run() int {
	code := r.m.Run()
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.s.c != nil {
		if err := r.s.c.Stop(); err != nil {
			os.Stderr.WriteString("stopping shared cluster: " + err.Error() + "\n")
			code = 1
		}
		r.s.c = nil
	}
	return code
}
