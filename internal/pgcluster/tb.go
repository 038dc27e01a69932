package pgcluster

import (
	"context"
	"errors"
	"os"
	"time"
)

// TB is the part of testing.TB that New uses. Declaring it here keeps the
// testing package out of the binaries that start clusters with Start.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Cleanup(func())
}

// startTimeout bounds New's start-up, generous for a small, noisy machine
// running several test binaries at once.
const startTimeout = 3 * time.Minute

// New starts a cluster for a test and stops it in t.Cleanup. Without
// PostgreSQL binaries the test is skipped, except under CI (env CI=true),
// where a missing PostgreSQL is a failure rather than a silent skip.
func New(t TB, opts Options) *Cluster {
	t.Helper()
	if _, err := Binaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("pgcluster: PostgreSQL is required under CI: %v", err)
		}
		t.Skipf("pgcluster: skipping, PostgreSQL not installed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		if errors.Is(err, ErrNoBinaries) && os.Getenv("CI") != "true" {
			t.Skipf("pgcluster: skipping: %v", err)
		}
		t.Fatalf("pgcluster: start PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("pgcluster: stop PostgreSQL: %v", err)
		}
	})
	return c
}
