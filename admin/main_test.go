package admin_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// TestMain checks that no goroutine outlives the tests; the shared cluster
// is stopped first.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(shared.Run(m))
}

// shared is one PostgreSQL cluster for the package's tests.
var shared pgtest.Shared
