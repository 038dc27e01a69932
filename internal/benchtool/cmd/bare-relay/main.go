// Command bare-relay is the benchmark's relay target (benchtool.Relay): a
// TCP relay with no pooling, started by scripts/bench-pgbouncer when
// --targets names relay. Like pgquic serve it runs Go code on half the
// CPUs (at least one) unless GOMAXPROCS is set, so the two compare alike.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/pgquic/pgquic/internal/benchtool"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "TCP `address` to accept clients on")
	upstream := flag.String("upstream", "", "TCP `address` every client is relayed to (PostgreSQL)")
	flag.Parse()
	if *upstream == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: bare-relay --listen ADDR --upstream ADDR")
		os.Exit(2)
	}
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(max(1, runtime.GOMAXPROCS(0)/2))
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bare-relay:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "bare-relay: %s -> %s\n", ln.Addr(), *upstream)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := benchtool.Relay(ctx, ln, *upstream); err != nil {
		fmt.Fprintln(os.Stderr, "bare-relay:", err)
		os.Exit(1)
	}
}
