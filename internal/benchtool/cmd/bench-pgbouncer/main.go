// Command bench-pgbouncer is the program scripts/bench-pgbouncer builds and
// runs; see package benchtool.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgquic/pgquic/internal/benchtool"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := benchtool.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
