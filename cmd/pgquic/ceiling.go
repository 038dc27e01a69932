package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/loadgen/model"
)

const ceilingUsage = `Usage: pgquic ceiling --conns N [--streams S] --rtt D [--exec D] [--overhead D]
                      [--target-qps Q] [--pool-size P] [--auth M] [--json]

Prints the throughput ceiling of N connections across a round trip, for TCP,
TCP with TLS and QUIC side by side. PostgreSQL runs one query at a time per
session, so by Little's law the ceiling is
  sessions / (RTT + execution time + pooler overhead per query)
where a TCP connection is one session and a QUIC connection carries S
sessions as streams. The pooler's own ceiling, pool_size / (execution time +
overhead), caps both. Also printed: the round trips (and time) a new
connection and a new session cost, the client's file descriptors and kernel
socket buffers, and with --target-qps the connections or streams a rate needs.

Example: pgquic ceiling --conns 10 --rtt 30ms   # 333 q/s

Flags:
`

// ceilingConfig is what the ceiling subcommand's flags describe.
type ceilingConfig struct {
	in      model.Input
	jsonOut bool
}

// runCeiling is the ceiling subcommand: it needs no server and never
// blocks, so ctx is unused.
func runCeiling(_ context.Context, args []string, stdout, stderr io.Writer) int {
	cc, err := parseCeilingFlags(args, stdout, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if !errors.Is(err, errUsage) {
			fmt.Fprintf(stderr, "pgquic ceiling: %v\nRun 'pgquic ceiling --help' for the flags.\n", err)
		}
		return 2
	}
	res, err := model.Compute(cc.in, model.LocalSocketSizes())
	if err != nil {
		// parseCeilingFlags checked every flag, so this is a bug.
		fmt.Fprintf(stderr, "pgquic ceiling: %v\n", err)
		return 1
	}
	if cc.jsonOut {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			fmt.Fprintf(stderr, "pgquic ceiling: %v\n", err)
			return 1
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		if err != nil {
			return 1
		}
		return 0
	}
	if err := res.WriteText(stdout); err != nil {
		return 1
	}
	return 0
}

// durationFlag is a time.Duration flag whose parse error tells how to write
// one, which flag.DurationVar's bare "parse error" does not.
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return "0s"
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("not a duration (write it with a unit, such as 30ms or 1.5s)")
	}
	*f.d = d
	return nil
}

// qpsFlag is a rate flag that refuses NaN and infinities, which
// strconv.ParseFloat accepts.
type qpsFlag struct{ q *float64 }

func (f qpsFlag) String() string {
	if f.q == nil {
		return "0"
	}
	return strconv.FormatFloat(*f.q, 'f', -1, 64)
}

func (f qpsFlag) Set(s string) error {
	q, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(q) || math.IsInf(q, 0) {
		return errors.New("not a number of queries per second")
	}
	*f.q = q
	return nil
}

func parseCeilingFlags(args []string, stdout, stderr io.Writer) (ceilingConfig, error) {
	fs := flag.NewFlagSet("ceiling", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cc ceilingConfig
	in := &cc.in
	fs.IntVar(&in.Conns, "conns", 0, "client connections (required)")
	fs.IntVar(&in.Streams, "streams", 1, "sessions (streams) per QUIC connection; TCP carries one per connection")
	fs.Var(durationFlag{&in.RTT}, "rtt", "network round-trip `time`, such as 30ms (required, positive)")
	fs.Var(durationFlag{&in.Exec}, "exec", "query execution `time` on the server")
	fs.Var(durationFlag{&in.Overhead}, "overhead", "the pooler's own `time` per query")
	fs.Var(qpsFlag{&in.TargetQPS}, "target-qps", "target `rate` in queries per second: print the connections or streams it needs")
	fs.IntVar(&in.PoolSize, "pool-size", config.DefaultPoolSize, "server connections the pooler lends out; 0 leaves the pool ceiling out")
	fs.StringVar(&in.Auth, "auth", model.AuthTrust, "authentication `method` counted in the startup round trips: trust, password, md5 or scram-sha-256")
	fs.BoolVar(&cc.jsonOut, "json", false, "print JSON instead of a table")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), ceilingUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return cc, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var errs []error
	switch {
	case !set["conns"]:
		errs = append(errs, errors.New("--conns is required"))
	case in.Conns < 1:
		errs = append(errs, fmt.Errorf("--conns must be at least 1 (got %d)", in.Conns))
	}
	if in.Streams < 1 {
		errs = append(errs, fmt.Errorf("--streams must be at least 1 (got %d)", in.Streams))
	}
	switch {
	case !set["rtt"]:
		errs = append(errs, errors.New("--rtt is required (a positive duration such as 30ms)"))
	case in.RTT <= 0:
		errs = append(errs, fmt.Errorf("--rtt must be positive (got %v): the model is about the round trip", in.RTT))
	}
	if in.Exec < 0 {
		errs = append(errs, fmt.Errorf("--exec must not be negative (got %v)", in.Exec))
	}
	if in.Overhead < 0 {
		errs = append(errs, fmt.Errorf("--overhead must not be negative (got %v)", in.Overhead))
	}
	if in.TargetQPS < 0 {
		errs = append(errs, fmt.Errorf("--target-qps must not be negative (got %v)", in.TargetQPS))
	}
	if in.PoolSize < 0 {
		errs = append(errs, fmt.Errorf("--pool-size must not be negative (got %d)", in.PoolSize))
	}
	if _, err := model.StartupRoundTrips(in.Auth); err != nil {
		errs = append(errs, fmt.Errorf("--auth %q is not one of trust, password, md5, scram-sha-256", in.Auth))
	}
	return cc, errors.Join(errs...)
}
