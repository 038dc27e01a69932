package pooler_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// TestMain checks that no goroutine outlives the tests: every session, relay,
// pool and pgx connection a test started must be gone once its harness
// closed. The shared cluster is stopped before the check.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(stopSharedAfter{m})
}

// stopSharedAfter runs the tests, then stops the shared cluster, so its
// goroutines are gone before goleak looks.
type stopSharedAfter struct{ m *testing.M }

func (s stopSharedAfter) Run() int {
	code := s.m.Run()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		if err := shared.c.Stop(); err != nil {
			os.Stderr.WriteString("stopping shared cluster: " + err.Error() + "\n")
			code = 1
		}
		shared.c = nil
	}
	return code
}

// shared is one PostgreSQL cluster reused by the tests that do not restart or
// break it, so the package does not pay initdb once per test.
var shared struct {
	mu  sync.Mutex
	c   *pgtest.Cluster
	err error
}

// sharedCluster returns the package's shared cluster, starting it on first
// use. It skips (or fails under CI) like pgtest.New when PostgreSQL is absent.
func sharedCluster(t testing.TB) *pgtest.Cluster {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		return shared.c
	}
	if shared.err != nil {
		t.Fatalf("shared cluster failed to start earlier: %v", shared.err)
	}
	if _, err := pgtest.Binaries(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI: %v", err)
		}
		t.Skipf("PostgreSQL not installed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		if errors.Is(err, pgtest.ErrNoBinaries) && os.Getenv("CI") != "true" {
			t.Skipf("PostgreSQL not installed: %v", err)
		}
		shared.err = err
		t.Fatalf("start shared cluster: %v", err)
	}
	shared.c = c
	return c
}

// testCtx returns a context with a generous deadline for one test.
func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
