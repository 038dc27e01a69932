package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/loadgen/wan"
)

const wanUsage = `Usage: pgquic wan --listen ADDR --upstream ADDR --rtt D [--jitter D] [--loss P] [flags]

A WAN emulator for any client (psql, pgbench, an application, pgquic edge):
relays TCP connections and UDP datagrams (QUIC) arriving on --listen to
--upstream, TCP and UDP on the same port, delaying each direction by half the
round trip. A new TCP connection's first bytes also wait one round trip, the
cost of TCP's handshake; TLS handshakes are real round trips through the
relay and pay the delay on their own. UDP keeps one upstream socket per
client address, so QUIC endpoints keep their own sockets. --loss drops UDP
datagrams only. It logs one line with "ready" when it listens and one with its
counters when it stops (SIGINT/SIGTERM).

Flags:
`

// runWan is the wan subcommand.
func runWan(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("wan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg wan.Config
	cfg.RegisterFlags(fs)
	logLevel := fs.String("log-level", config.DefaultLogLevel, "log `level`: debug, info, warn or error")
	logFormat := fs.String("log-format", config.DefaultLogFormat, "log `format`: text or json")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), wanUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	for _, name := range []string{"listen", "upstream", "rtt"} {
		if !given[name] {
			errs = append(errs, fmt.Errorf("--%s is required", name))
		}
	}
	if err := errors.Join(append(errs, cfg.Validate())...); err != nil {
		fmt.Fprintf(stderr, "pgquic wan: %v\n", err)
		return 2
	}
	logger, err := newLogger(stderr, *logLevel, *logFormat)
	if err != nil {
		fmt.Fprintf(stderr, "pgquic wan: %v\n", err)
		return 2
	}
	if err := wan.Run(ctx, cfg, logger); err != nil {
		logger.Error("wan failed", "err", err)
		return 1
	}
	return 0
}
