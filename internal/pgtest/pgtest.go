// Package pgtest gives integration tests throwaway PostgreSQL clusters:
// every test in this project talks to a real PostgreSQL started here, never
// a mock. It is a thin test-facing layer over internal/pgcluster, which the
// pgquic binary uses too.
package pgtest

import (
	"context"
	"testing"

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
