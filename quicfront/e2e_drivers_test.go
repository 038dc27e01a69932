package quicfront_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// TestE2EDrivers: pgxpool and database/sql (pgx's stdlib driver) run over
// QUIC unchanged once the pgx configuration carries the Dialer's DialFunc,
// cancellation included.
func TestE2EDrivers(t *testing.T) {
	e := newE2E(t, e2eOpts{})
	d := e.dialer(t, 2, 0)
	ctx := testCtx(t, 2*time.Minute)

	t.Run("pgxpool", func(t *testing.T) {
		pcfg, err := pgxpool.ParseConfig("postgres://postgres:postgres@quic/postgres?sslmode=disable&pool_max_conns=40")
		if err != nil {
			t.Fatal(err)
		}
		pcfg.ConnConfig = pgxConfig(t, d)
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var wg sync.WaitGroup
		errs := make(chan error, 80)
		for w := range 80 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					want := fmt.Sprintf("w%d-%d", w, i)
					var got string
					if err := pool.QueryRow(ctx, "select $1::text", want).Scan(&got); err != nil || got != want {
						errs <- fmt.Errorf("worker %d: got %q, %v", w, got, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		qctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		start := time.Now()
		_, err = pool.Exec(qctx, "select pg_sleep(5)")
		cancel()
		// 57014 comes only from a cancel the server carried out; pgx
		// breaking the connection after its deadline gives another error.
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "57014" {
			t.Fatalf("pg_sleep not cancelled: %v after %s, want SQLSTATE 57014", err, time.Since(start))
		}
		if err := pool.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("database/sql", func(t *testing.T) {
		db := stdlib.OpenDB(*pgxConfig(t, d))
		defer db.Close()
		db.SetMaxOpenConns(20)
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for w := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					var got int
					if err := db.QueryRowContext(ctx, "select $1::int * 2", w*100+i).Scan(&got); err != nil || got != 2*(w*100+i) {
						errs <- fmt.Errorf("worker %d: got %d, %v", w, got, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		tx, err := db.BeginTx(ctx, &sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var pid1, pid2 int
		if err := tx.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&pid1); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&pid2); err != nil {
			t.Fatal(err)
		}
		if pid1 != pid2 {
			t.Fatalf("transaction moved between servers: %d then %d", pid1, pid2)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		qctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		start := time.Now()
		_, err = db.ExecContext(qctx, "select pg_sleep(5)")
		cancel()
		// 57014 comes only from a cancel the server carried out; pgx
		// breaking the connection after its deadline gives another error.
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "57014" {
			t.Fatalf("pg_sleep not cancelled: %v after %s, want SQLSTATE 57014", err, time.Since(start))
		}
		if err := db.PingContext(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
