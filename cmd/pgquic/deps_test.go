package main

import (
	"testing"

	"github.com/pgquic/pgquic/internal/depcheck"
)

// TestBinaryDoesNotLinkTesting keeps the test framework out of the
// production binary: the throwaway PostgreSQL it starts comes from
// internal/pgcluster, not from the test helpers in internal/pgtest.
func TestBinaryDoesNotLinkTesting(t *testing.T) {
	depcheck.Forbid(t, "github.com/pgquic/pgquic/cmd/pgquic", "testing", "github.com/pgquic/pgquic/internal/pgtest")
}
