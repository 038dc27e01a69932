// Command pgquic is a PostgreSQL transaction pooler that accepts clients over
// plain TCP and over QUIC, plus the matching client-side edge sidecar.
//
// This package only parses flags, loads the configuration, wires the other
// packages together and runs their lifecycle; the behaviour lives in
// pooler/, backend/, tcpfront/ and quicfront/. See README.md for the flags.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one subcommand: its name, a one-line summary for the top-level
// usage, and its entry point, which returns the process exit code.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

var commands = []command{
	{"ramp", "the TCP vs QUIC comparison: an open-loop ramp across an emulated WAN, beside the ceiling model", runRamp},
	{"serve", "run the pooler (TCP and QUIC fronts)", runServe},
	{"edge", "local TCP listener that carries each client connection as a QUIC stream to a pooler", runEdge},
	{"ceiling", "the model's throughput ceiling of N connections across a round trip (TCP, TLS, QUIC)", runCeiling},
	{"connect-bench", "time to first row of a new session on each path (TCP, TLS, SCRAM, QUIC, edge, edge with local startup) across the WAN relay", runConnectBench},
	{"wan", "WAN emulator: relays TCP and UDP to an upstream with delay, jitter and UDP loss", runWan},
}

func main() {
	// The first SIGINT or SIGTERM starts a graceful shutdown; stopping the
	// notification afterwards lets a second signal kill the process at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches to a subcommand and returns the exit code: 0 on success
// (including --help), 2 for usage errors, 1 for failures.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "pgquic: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprint(w, "pgquic: a PostgreSQL pooler with TCP and QUIC fronts\n\nUsage:\n  pgquic <command> [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-7s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'pgquic <command> --help' for a command's flags.\n")
}
