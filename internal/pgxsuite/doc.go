// Package pgxsuite runs pgx's own test suites (github.com/jackc/pgx/v5)
// through an in-process pgquic pooler, so pgx's authors' idea of correct
// PostgreSQL behaviour becomes our compatibility test.
//
// The package has no code of its own outside tests. Its tests start a
// throwaway PostgreSQL (internal/pgtest) set up the way pgx's
// testsetup/postgresql_setup.sql and pg_hba.conf expect, put a real
// pooler (pooler.New over backend.NewManager) on loopback TCP and a Unix
// socket, copy pgx's module out of the module cache and run `go test` on it
// with pgx's PGX_TEST_* variables pointing at the pooler:
//
//   - TestPgbouncerTransactionMode runs pgx's TestPgbouncer* tests in
//     transaction mode (PGX_TEST_PGBOUNCER_CONN_STRING). It runs by default.
//   - TestPgxFullSuiteSession runs all of `go test ./...` for pgx once
//     directly against PostgreSQL and once through the pooler in session
//     mode, and fails when the sets of failed or skipped tests differ. It
//     takes minutes, so it runs only with PGQUIC_PGX_FULL=1.
//
// See README.md for the environment, and scripts/pgx-suite for a runner
// that prints a summary.
package pgxsuite
