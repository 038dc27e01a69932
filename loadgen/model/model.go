// Package model predicts where a PostgreSQL client saturates across a round
// trip, before anything is measured, so that every measurement of the ramp
// can be printed beside what it should have been.
//
// PostgreSQL runs one query at a time per session, so by Little's law a
// client with C concurrent sessions, each waiting one round trip plus the
// query's execution time plus the pooler's overhead per query, completes at
// most C / (RTT + exec + overhead) queries per second. Over TCP a session is
// a connection; over QUIC a connection carries many sessions as streams, so C
// is connections x streams. The pooler's server side has a ceiling of its own,
// pool_size / (exec + overhead), and a run reaches at most the lower of the
// two. The package also counts what each transport costs to (re)connect and
// to keep open: round trips, file descriptors and kernel socket buffers.
package model

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Transport names a client transport the model covers.
type Transport string

// The transports the model compares.
const (
	// TCP is PostgreSQL's wire protocol over plain TCP.
	TCP Transport = "tcp"
	// TCPTLS is PostgreSQL's wire protocol over TCP with TLS 1.3, negotiated
	// with an SSLRequest as pgquic's TCP front expects.
	TCPTLS Transport = "tcp+tls"
	// QUIC is one PostgreSQL session per bidirectional stream over QUIC
	// (TLS 1.3 built in), without 0-RTT.
	QUIC Transport = "quic"
)

// Transports lists every transport in the order reports show them.
var Transports = []Transport{TCP, TCPTLS, QUIC}

// Auth methods whose startup exchanges the model counts. The names are those
// of pgquic serve's --auth-method.
const (
	AuthTrust    = "trust"
	AuthPassword = "password"
	AuthMD5      = "md5"
	AuthSCRAM    = "scram-sha-256"
)

// StartupRoundTrips returns the round trips of PostgreSQL's startup exchange
// with the given authentication method: StartupMessage to ReadyForQuery is
// one; a password or MD5 challenge adds one; SCRAM-SHA-256 adds two
// (SASLInitialResponse and SASLResponse each wait for the server).
func StartupRoundTrips(auth string) (int, error) {
	switch auth {
	case AuthTrust, "":
		return 1, nil
	case AuthPassword, AuthMD5:
		return 2, nil
	case AuthSCRAM:
		return 3, nil
	}
	return 0, fmt.Errorf("%w: auth method %q is not one of %s, %s, %s, %s",
		ErrInput, auth, AuthTrust, AuthPassword, AuthMD5, AuthSCRAM)
}

// ServerStreamLimit is the number of concurrent streams pgquic serve accepts
// on one QUIC connection by default; asking for more sessions per connection
// than this needs more connections.
const ServerStreamLimit = 1000

// QUICSocketBuffer is the UDP receive and send buffer size quic-go and
// pgquic's Dialer ask the kernel for (7 MiB each).
const QUICSocketBuffer = 7 << 20

// Ceiling returns the Little's-law throughput ceiling, in queries per
// second, of sessions that each wait perQuery for every query. It returns 0
// when perQuery is not positive, since the ceiling is then undefined.
func Ceiling(sessions int, perQuery time.Duration) float64 {
	if perQuery <= 0 {
		return 0
	}
	return float64(sessions) / perQuery.Seconds()
}

// PoolCeiling returns the server side's ceiling: poolSize server connections
// each busy for exec + overhead per query. It returns 0 (unknown) when that
// time is not positive: a pool whose queries cost nothing has no ceiling
// the model can state.
func PoolCeiling(poolSize int, exec, overhead time.Duration) float64 {
	return Ceiling(poolSize, exec+overhead)
}

// PipelinedPoolCeiling is PoolCeiling with cross-client pipelining: a
// server connection then carries up to depth queries at once, their round
// trips between pooler and PostgreSQL overlapped, so the pool carries at
// most depth times as many. It is an upper bound (PostgreSQL still executes
// a connection's queries one after another), not a prediction; without
// pipelining (depth 0 or 1) it is PoolCeiling.
func PipelinedPoolCeiling(poolSize, depth int, exec, overhead time.Duration) float64 {
	return PoolCeiling(poolSize, exec, overhead) * float64(max(depth, 1))
}

// SessionsFor returns the number of concurrent sessions needed to sustain
// qps queries per second when each query holds its session for perQuery:
// ceil(qps x perQuery).
func SessionsFor(qps float64, perQuery time.Duration) int {
	if qps <= 0 || perQuery <= 0 {
		return 0
	}
	// The tolerance keeps an exact product (500 q/s x 20 ms = 10) from
	// becoming 11 through floating-point noise.
	return int(math.Ceil(qps*perQuery.Seconds() - 1e-9))
}

// ErrInput is wrapped by every error about the model's input.
var ErrInput = errors.New("invalid ceiling model input")

// Input is what the model needs. The zero value is not valid: Conns and RTT
// are required.
type Input struct {
	// Conns is the number of client connections (required, at least 1).
	Conns int
	// Streams is the number of sessions each QUIC connection carries; 0
	// means 1. TCP always carries one session per connection.
	Streams int
	// RTT is the network round-trip time (required, positive).
	RTT time.Duration
	// Exec is the query's execution time on the server; 0 by default.
	Exec time.Duration
	// Overhead is the pooler's own time per query; 0 by default.
	Overhead time.Duration
	// PoolSize is the number of server connections the pooler lends out; 0
	// leaves the server-side ceiling out.
	PoolSize int
	// TargetQPS, when positive, asks what it takes to reach that rate.
	TargetQPS float64
	// Auth is the authentication method counted in the startup exchange;
	// empty means trust.
	Auth string
}

// Validate reports every problem with the input, each wrapping ErrInput.
func (in Input) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInput}, args...)...))
	}
	if in.Conns < 1 {
		bad("connections must be at least 1 (got %d)", in.Conns)
	}
	if in.Streams < 0 {
		bad("streams per connection must not be negative (got %d)", in.Streams)
	}
	if in.RTT <= 0 {
		bad("round-trip time must be positive (got %v): with no round trip there is no network to model", in.RTT)
	}
	if in.Exec < 0 {
		bad("execution time must not be negative (got %v)", in.Exec)
	}
	if in.Overhead < 0 {
		bad("pooler overhead must not be negative (got %v)", in.Overhead)
	}
	if in.PoolSize < 0 {
		bad("pool size must not be negative (got %d)", in.PoolSize)
	}
	if in.TargetQPS < 0 || math.IsNaN(in.TargetQPS) || math.IsInf(in.TargetQPS, 0) {
		bad("target rate must be a non-negative number (got %v)", in.TargetQPS)
	}
	if _, err := StartupRoundTrips(in.Auth); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// PerQuery is the time one query holds its client session: RTT + exec +
// overhead.
func (in Input) PerQuery() time.Duration {
	return in.RTT + in.Exec + in.Overhead
}

func (in Input) streams() int {
	return max(in.Streams, 1)
}

// Result is the model's answer for one input.
type Result struct {
	// Input is the input, with Streams defaulted to 1.
	Input Input
	// PerQuery is RTT + exec + overhead.
	PerQuery time.Duration
	// PoolCeilingQPS is pool_size / (exec + overhead); 0 when unknown (no
	// pool size, or exec and overhead both zero).
	PoolCeilingQPS float64
	// Sockets are the kernel buffer sizes the memory figures used.
	Sockets SocketSizes
	// Transports holds one entry per transport, in the order of Transports.
	Transports []TransportResult
}

// TransportResult is the model's answer for one transport.
type TransportResult struct {
	Transport Transport
	// Sessions is the number of concurrent PostgreSQL sessions: Conns for
	// TCP, Conns x Streams for QUIC.
	Sessions int
	// CeilingQPS is the client-side ceiling, Sessions / PerQuery.
	CeilingQPS float64
	// EffectiveQPS is min(CeilingQPS, PoolCeilingQPS), or CeilingQPS when
	// the pool's ceiling is unknown.
	EffectiveQPS float64
	// PoolBound tells that the server side's pool, not the client's
	// sessions, sets EffectiveQPS.
	PoolBound bool
	// Connect is the cost of opening a new connection and its first
	// session; Session is the cost of one more session (a new connection
	// for TCP, a new stream on a live connection for QUIC).
	Connect, Session Handshake
	// FDs is the number of client file descriptors the connections hold.
	FDs int
	// SocketBytes is the kernel socket buffer space those descriptors may
	// hold (the buffers' limits, not memory allocated up front).
	SocketBytes int64
	// Need answers the target rate; nil without one.
	Need *Need
}

// Handshake is a (re)connection cost.
type Handshake struct {
	// RoundTrips is the number of network round trips before the first
	// query can be sent.
	RoundTrips int
	// Time is RoundTrips x RTT.
	Time time.Duration
}

// Need is what a target rate requires of one transport.
type Need struct {
	// Sessions is ceil(target x PerQuery).
	Sessions int
	// Conns is the number of connections needed: Sessions for TCP; for QUIC,
	// enough connections at the given streams per connection.
	Conns int
	// StreamsPerConn is, for QUIC, the streams each of the given connections
	// must carry; when that exceeds ServerStreamLimit, the given connections
	// cannot carry the target and Conns says how many can. It is 1 for TCP.
	StreamsPerConn int
	// PoolSize is the pool size the server side needs for the target,
	// ceil(target x (exec + overhead)); 0 when exec and overhead are zero.
	PoolSize int
	// PoolShort tells that the given pool size is below PoolSize, so the
	// target is out of reach whatever the client does.
	PoolShort bool
}

// Compute runs the model for every transport. It returns an error wrapping
// ErrInput when the input is invalid.
func Compute(in Input, sockets SocketSizes) (Result, error) {
	if err := in.Validate(); err != nil {
		return Result{}, err
	}
	in.Streams = in.streams()
	if in.Auth == "" {
		in.Auth = AuthTrust
	}
	res := Result{
		Input:          in,
		PerQuery:       in.PerQuery(),
		PoolCeilingQPS: PoolCeiling(in.PoolSize, in.Exec, in.Overhead),
		Sockets:        sockets,
	}
	startup, _ := StartupRoundTrips(in.Auth)
	for _, tr := range Transports {
		t := TransportResult{Transport: tr, Sessions: in.Conns}
		var transportRTs int
		switch tr {
		case TCP:
			transportRTs = 1 // SYN, SYN-ACK
		case TCPTLS:
			// TCP's handshake, the SSLRequest and its 'S', then TLS 1.3's
			// single round trip.
			transportRTs = 3
		case QUIC:
			transportRTs = 1 // QUIC and TLS 1.3 together, 0-RTT off
			t.Sessions = in.Conns * in.Streams
		}
		t.Connect = handshake(transportRTs+startup, in.RTT)
		t.Session = t.Connect
		if tr == QUIC {
			// A stream opens without a round trip; only the startup waits.
			t.Session = handshake(startup, in.RTT)
		}
		t.FDs, t.SocketBytes = sockets.cost(tr, in.Conns)
		t.CeilingQPS = Ceiling(t.Sessions, res.PerQuery)
		t.EffectiveQPS = t.CeilingQPS
		if res.PoolCeilingQPS > 0 && res.PoolCeilingQPS < t.CeilingQPS {
			t.EffectiveQPS = res.PoolCeilingQPS
			t.PoolBound = true
		}
		if in.TargetQPS > 0 {
			t.Need = need(tr, in, res.PerQuery)
		}
		res.Transports = append(res.Transports, t)
	}
	return res, nil
}

func handshake(roundTrips int, rtt time.Duration) Handshake {
	return Handshake{RoundTrips: roundTrips, Time: time.Duration(roundTrips) * rtt}
}

func need(tr Transport, in Input, perQuery time.Duration) *Need {
	n := &Need{Sessions: SessionsFor(in.TargetQPS, perQuery), StreamsPerConn: 1}
	n.Conns = n.Sessions
	if tr == QUIC {
		n.StreamsPerConn = ceilDiv(n.Sessions, in.Conns)
		n.Conns = in.Conns
		if n.StreamsPerConn > ServerStreamLimit {
			n.StreamsPerConn = ServerStreamLimit
			n.Conns = ceilDiv(n.Sessions, ServerStreamLimit)
		}
	}
	n.PoolSize = SessionsFor(in.TargetQPS, in.Exec+in.Overhead)
	n.PoolShort = in.PoolSize > 0 && n.PoolSize > in.PoolSize
	return n
}

func ceilDiv(a, b int) int {
	return (a + b - 1) / b
}
