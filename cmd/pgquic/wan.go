package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/loadgen/wan"
)

const wanUsage = `Usage: pgquic wan --listen ADDR --upstream ADDR --rtt D [--jitter D] [--loss P] [flags]
       pgquic wan --netns --upstream ADDR --rtt D [impairments] [-- COMMAND [ARGS...]]

A WAN emulator for any client (psql, pgbench, an application, pgquic edge).

Relay mode (the first form, any user): relays TCP connections and UDP
datagrams (QUIC) arriving on --listen to --upstream, TCP and UDP on the same
port, delaying each direction by half the round trip. A new TCP connection's
first bytes also wait one round trip, the cost of TCP's handshake. TCP is a
byte stream there: --loss drops UDP datagrams only.

Packet mode (--netns; root or CAP_NET_ADMIN+CAP_SYS_ADMIN): IP packets cross
TUN devices between two network namespaces this command creates (pgq-PID-N-c
for clients, pgq-PID-N-s), so the kernel's TCP and QUIC's datagrams meet the
same delay, jitter, loss (--loss, --burst-loss), reordering (--reorder) and
rate limit with a drop-tail queue (--bandwidth, --queue). Addresses come from
198.18.0.0/15 and exist only inside those namespaces; the host's interfaces
and routes are never changed, and the namespaces are removed at exit (those of
a killed run at the next start). With COMMAND, it runs COMMAND in the client
namespace with PGHOST and PGPORT set to the upstream's address there, and
exits with COMMAND's exit code; without, it runs until SIGINT/SIGTERM (reach
it with 'ip netns exec NAME ...').

It logs one line with "ready" (address, mode, namespace) when it runs and one
with its counters when it stops.

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
	var command []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, command = args[:i], args[i+1:]
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
	required := []string{"listen", "upstream", "rtt"}
	if cfg.Packet {
		required = required[1:] // the address is the namespace's
		if given["listen"] {
			errs = append(errs, fmt.Errorf("--listen does not apply to --netns: clients in the namespace reach the upstream at %s and its port", wan.ServerIP))
		}
	} else if len(command) > 0 {
		errs = append(errs, fmt.Errorf("a COMMAND (%s) needs --netns: relay mode has no namespace to run it in", command[0]))
	}
	for _, name := range required {
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
	if cfg.Packet {
		if err := wan.PacketPermitted(); err != nil {
			fmt.Fprintf(stderr, "pgquic wan: %v; run without --netns for relay mode (TCP is then never dropped)\n", err)
			return 1
		}
		if len(command) > 0 {
			return wanCommand(ctx, cfg, command, stdout, stderr)
		}
	}
	if err := wan.Run(ctx, cfg, logger); err != nil {
		logger.Error("wan failed", "err", err)
		return 1
	}
	return 0
}

// wanCommand runs command in the client namespace of a packet-mode path and
// returns its exit code; the path is removed afterwards.
func wanCommand(ctx context.Context, cfg wan.Config, command []string, stdout, stderr io.Writer) int {
	p, err := wan.StartPacket(cfg, nil)
	if err != nil {
		fmt.Fprintf(stderr, "pgquic wan: %v\n", err)
		return 1
	}
	defer func() {
		if err := p.Close(); err != nil {
			fmt.Fprintf(stderr, "pgquic wan: clean-up: %v\n", err)
		}
	}()
	host, port, _ := net.SplitHostPort(p.Addr())
	fmt.Fprintf(stderr, "pgquic wan: packet mode, RTT %v; running %s in network namespace %s; the upstream %s is at %s (PGHOST=%s PGPORT=%s)\n",
		cfg.RTT, command[0], p.ClientNetns(), cfg.Upstream, p.Addr(), host, port)
	cmd := exec.CommandContext(ctx, command[0], command[1:]...)
	cmd.Stdin = os.Stdin
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.Env = append(os.Environ(), "PGHOST="+host, "PGPORT="+port, "PGQUIC_WAN_ADDR="+p.Addr())
	// Forked from a thread inside the namespace, the command starts there.
	if err := wan.InNetns(p.ClientNetns(), cmd.Start); err != nil {
		fmt.Fprintf(stderr, "pgquic wan: %s: %v\n", strings.Join(command, " "), err)
		return 1
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode()
	}
	fmt.Fprintf(stderr, "pgquic wan: %s: %v\n", command[0], err)
	return 1
}
