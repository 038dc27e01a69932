package pooler_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// TestMain checks that no goroutine outlives the tests: every session, relay,
// pool and pgx connection a test started must be gone once its harness
// closed. The shared cluster is stopped before the check.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(shared.Run(m))
}

// shared is one PostgreSQL cluster reused by the tests that do not restart
// or break it, so the package does not pay initdb once per test.
var shared pgtest.Shared

// sharedCluster returns the package's shared cluster, starting it on first
// use. It skips (or fails under CI) like pgtest.New when PostgreSQL is absent.
func sharedCluster(t testing.TB) *pgtest.Cluster {
	t.Helper()
	return shared.Get(t)
}

// testCtx returns a context with a generous deadline for one test.
func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
