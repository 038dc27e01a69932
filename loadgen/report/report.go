// Package report holds the result of a ramp comparison: the scenario that was
// run and, for each transport, what the ceiling model predicted beside what
// was measured, second by second.
//
// The JSON form (ramp.json) is a contract that users script against, so the
// field names of the contract never change; fields may be added. Every run
// accounts for every query it scheduled: scheduled = completed + errors +
// unfinished. Validate checks that, and WriteJSON and ReadJSON refuse a report
// that breaks it, because a comparison in which queries vanish cannot be
// trusted.
package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// Transports named in Run.Transport.
const (
	// TransportTCP is PostgreSQL's own wire protocol over TCP, one query at a
	// time per connection, with or without TLS.
	TransportTCP = "tcp"
	// TransportQUIC is one PostgreSQL session per bidirectional QUIC stream,
	// several streams per connection, always with TLS 1.3.
	TransportQUIC = "quic"
)

// Report is the whole result of one ramp: the scenario shared by every run
// and one Run per transport measured.
type Report struct {
	// Scenario is what every run was asked to do.
	Scenario Scenario `json:"scenario"`
	// Runs holds one entry per transport measured, in the order they ran.
	Runs []Run `json:"runs"`
	// StartedAt is when the first run began; zero when unknown. The README
	// quotes tables with their date, so the report carries it.
	StartedAt time.Time `json:"started_at,omitzero"`
	// Machine describes where the measurement ran, since every number in a
	// report depends on it; nil when unknown.
	Machine *Machine `json:"machine,omitempty"`
}

// Scenario is the load and the network every run of a report shares, so that
// the runs are compared under the same conditions.
type Scenario struct {
	// RTTMs is the emulated round-trip time in milliseconds.
	RTTMs float64 `json:"rtt_ms"`
	// JitterMs is the emulated jitter in milliseconds (0 for none).
	JitterMs float64 `json:"jitter_ms"`
	// FromQPS is the offered rate at the start of the ramp, in queries per second.
	FromQPS float64 `json:"from_qps"`
	// ToQPS is the offered rate at the end of the ramp, in queries per second.
	ToQPS float64 `json:"to_qps"`
	// DurationS is the length of the ramp in seconds.
	DurationS float64 `json:"duration_s"`
	// Query is the SQL every scheduled query runs.
	Query string `json:"query"`
	// PoolSize is the number of server connections the pooler lends out;
	// it bounds the server side's throughput (see Run.PredictedPoolCeilingQPS).
	PoolSize int `json:"pool_size"`
	// Arrivals names the arrival process ("linear", "constant", "poisson");
	// empty means the default linear ramp.
	Arrivals string `json:"arrivals,omitempty"`
	// UDPLoss is the emulated UDP loss rate as a fraction (0.01 is 1%) that
	// reports wrote before Loss and WAN existed (relay mode: QUIC only).
	// The ramp no longer writes it; it is read so old reports still load.
	UDPLoss float64 `json:"udp_loss,omitempty"`
	// WAN is the emulation mode that ran: "packet" (IP packets between
	// network namespaces: TCP and QUIC meet the same path) or "relay" (a
	// user-space relay: TCP is never dropped). Empty in older reports.
	WAN string `json:"wan,omitempty"`
	// WANNote says why the mode is not the default one (packet mode not
	// permitted), so a reader of the report knows what the numbers mean.
	WANNote string `json:"wan_note,omitempty"`
	// Loss is the --loss probability per packet and direction, as the flag.
	Loss float64 `json:"loss"`
	// BurstLoss and BurstLen are the Gilbert-Elliott burst loss (long-run
	// fraction, mean burst length in packets); 0 for none.
	BurstLoss float64 `json:"burst_loss,omitempty"`
	BurstLen  float64 `json:"burst_len,omitempty"`
	// Reorder is the probability a packet is held back so later ones pass.
	Reorder float64 `json:"reorder,omitempty"`
	// BandwidthBps is the bottleneck's rate in bits per second per
	// direction, QueueBytes its drop-tail queue; 0 for no limit.
	BandwidthBps int64 `json:"bandwidth_bps,omitempty"`
	QueueBytes   int   `json:"queue_bytes,omitempty"`
	// Scheduling is how the host's CPU scheduler ran the measuring
	// processes: "realtime" (real-time round-robin, so the client, pooler,
	// emulator and PostgreSQL sharing the host do not wait on each other's
	// time slices) or "normal"; empty when not recorded.
	Scheduling string `json:"scheduling,omitempty"`
}

// Machine describes the host a report was measured on.
type Machine struct {
	// CPUs is the number of logical CPUs the host has.
	CPUs int `json:"cpus"`
	// OS and Arch are Go's runtime.GOOS and runtime.GOARCH.
	OS   string `json:"os"`
	Arch string `json:"arch"`
	// Kernel is the kernel release (uname -r), when known.
	Kernel string `json:"kernel,omitempty"`
	// GoVersion is the Go release the load generator was built with.
	GoVersion string `json:"go_version,omitempty"`
}

// Run is one transport's measurement beside the model's prediction for it.
type Run struct {
	// Transport is TransportTCP or TransportQUIC.
	Transport string `json:"transport"`
	// Target is the address measured in target mode (an existing pooler or
	// server); empty when the run used the in-process pooler.
	Target string `json:"target,omitempty"`
	// Conns is the number of client connections.
	Conns int `json:"conns"`
	// StreamsPerConn is the number of PostgreSQL sessions each connection
	// carries: 1 for TCP, the stream count for QUIC.
	StreamsPerConn int `json:"streams_per_conn"`
	// TLS tells whether the connections were encrypted (always true for QUIC).
	TLS bool `json:"tls"`

	// PredictedCeilingQPS is the client-side ceiling of the model:
	// Conns x StreamsPerConn / (RTT + execution + pooler overhead).
	PredictedCeilingQPS float64 `json:"predicted_ceiling_qps"`
	// PredictedPoolCeilingQPS is the server-side ceiling of the model:
	// pool_size / (execution + pooler overhead), times the pooler's
	// cross-client pipelining depth when it pipelines (the in-process
	// pooler's --pipeline-depth: a server connection then has up to that
	// many queries in flight, so the figure is an upper bound); 0 when not
	// computed. The run cannot exceed the lower of the two ceilings.
	PredictedPoolCeilingQPS float64 `json:"predicted_pool_ceiling_qps,omitempty"`
	// ModelExecMs and ModelOverheadMs are the execution time and pooler
	// overhead per query, in milliseconds, that the predictions used.
	ModelExecMs     float64 `json:"model_exec_ms,omitempty"`
	ModelOverheadMs float64 `json:"model_overhead_ms,omitempty"`
	// KneeQPS is the highest offered rate of a one-second window whose
	// completions kept up (at least 98% of offered) with a backlog that did
	// not grow.
	KneeQPS float64 `json:"knee_qps"`

	// Scheduled is the number of queries the schedule asked for; it always
	// equals Completed + Errors + Unfinished.
	Scheduled int64 `json:"scheduled"`
	// Completed is the number of queries that returned a result.
	Completed int64 `json:"completed"`
	// Errors is the number of queries that returned an error.
	Errors int64 `json:"errors"`
	// Unfinished is the number of queries still queued or in flight when the
	// run ended.
	Unfinished int64 `json:"unfinished"`
	// Interrupted tells that the run was stopped early (Ctrl-C); its counts
	// cover what had been scheduled by then.
	Interrupted bool `json:"interrupted,omitempty"`

	// PeakQPS is the highest completed rate of any one-second window.
	PeakQPS float64 `json:"peak_qps"`
	// LatencyMs summarizes the latency of completed queries over the whole
	// run, measured from each query's intended send time.
	LatencyMs Latency `json:"latency_ms"`
	// Client is what the load generator's own process used.
	Client Client `json:"client"`
	// Emulator is the CPU the WAN emulator spent relaying this run, reported
	// apart from the client's; nil when no emulator ran.
	Emulator *Usage `json:"emulator,omitempty"`
	// Pooler is the CPU the pooler spent during this run, when it can be
	// told apart (an in-process pooler shares the client's process); nil
	// when unknown.
	Pooler *Usage `json:"pooler,omitempty"`
	// Path is what the transport's own loss recovery saw over the run
	// (TCP: TCP_INFO summed over the connections; QUIC: quic-go's
	// connection stats) and what the emulator dropped and queued; nil when
	// not measured.
	Path *Path `json:"path,omitempty"`
	// PredictedLossInflationMs is the model's expected latency added per
	// query by retransmissions at the scenario's loss, for this transport.
	PredictedLossInflationMs float64 `json:"predicted_loss_inflation_ms,omitempty"`
	// PredictedBandwidthCeilingQPS is the model's ceiling from the
	// bottleneck's rate and this run's measured bytes per query; 0 without
	// a rate limit.
	PredictedBandwidthCeilingQPS float64 `json:"predicted_bandwidth_ceiling_qps,omitempty"`
	// PredictedQueueDelayMaxMs is the longest wait in a full bottleneck
	// queue (queue bytes / rate), beside Path.QueueDelayMaxMs.
	PredictedQueueDelayMaxMs float64 `json:"predicted_queue_delay_max_ms,omitempty"`

	// GeneratorLagMs is the largest delay, in milliseconds, between a
	// query's intended send time and the moment the generator handed it
	// over. Latency is measured from the intended time either way; a large
	// lag means the generator itself, not the system under test, was short
	// of CPU.
	GeneratorLagMs float64 `json:"generator_lag_ms"`
	// GeneratorFellBehind tells that the generator lagged enough for the
	// offered rate to be in doubt; the summary says so too.
	GeneratorFellBehind bool `json:"generator_fell_behind"`

	// Connect describes how the sessions were opened before the ramp began
	// (connection set-up is never counted in the ramp); nil when unknown.
	Connect *Connect `json:"connect,omitempty"`
	// Reconnects counts sessions re-opened during the run after their
	// connection broke.
	Reconnects int64 `json:"reconnects,omitempty"`
	// Migrations lists the moves of the QUIC clients to a new local
	// address during the run (`pgquic ramp --migrate-at`), with the
	// latency around each.
	Migrations []Migration `json:"migrations,omitempty"`
	// SessionPath names, in a session-per-query run, how each new session
	// was opened: "tcp", "tcp+tls" or "edge-local" (through an edge with
	// local startup over a warm QUIC connection); empty in other runs.
	SessionPath string `json:"session_path,omitempty"`
	// NewSessions counts the sessions a session-per-query run opened
	// (about completed + errors: one per query that started); nil in other
	// runs.
	NewSessions *int64 `json:"new_sessions,omitempty"`
	// ConnectMs is the time from the dial to a ready session
	// (ReadyForQuery) in a session-per-query run, in milliseconds; nil in
	// other runs.
	ConnectMs *ConnectLatency `json:"connect_ms,omitempty"`
	// ModelRoundTrips is, in a session-per-query run, the network round
	// trips the model counts per query (new session and query, see
	// model.ChurnRoundTrips), ModelConnectRoundTrips those before the
	// session is ready; PredictedLatencyMs is ModelRoundTrips x RTT + exec +
	// overhead, beside LatencyMs.P50.
	// (ModelConnectRoundTrips is a pointer so that edge-local's 0 is
	// written.)
	ModelRoundTrips        int     `json:"model_round_trips,omitempty"`
	ModelConnectRoundTrips *int    `json:"model_connect_round_trips,omitempty"`
	PredictedLatencyMs     float64 `json:"predicted_latency_ms,omitempty"`
	// PredictedPortCeilingQPS is, for a TCP session-per-query run across a
	// real path (packet mode), the new connections per second the client's
	// ephemeral ports allow while each closed one waits in TIME_WAIT
	// (model.PortCeiling); 0 when it does not apply.
	PredictedPortCeilingQPS float64 `json:"predicted_port_ceiling_qps,omitempty"`
	// PoolerClientsAfter is, for a session-per-query run against the
	// in-process pooler, the client sessions the pooler still held once
	// the run's sessions were closed and it had a few seconds to see them
	// end: 0 when every session ended cleanly; nil when not checked.
	PoolerClientsAfter *int `json:"pooler_clients_after,omitempty"`
	// ErrorKinds counts failed queries by kind: "SQLSTATE xxxxx" for an
	// error from the server, "connection", "timeout" or "other", so a run
	// full of errors says what they were.
	ErrorKinds map[string]int64 `json:"error_kinds,omitempty"`
	// Seconds holds one entry per one-second window of intended send time.
	Seconds []Second `json:"seconds"`
}

// Migration is one move of a run's QUIC connections to a new local
// address (new UDP port): the path is probed, then switched to, while the
// sessions go on.
type Migration struct {
	// AtS is when it started, in seconds since the run began.
	AtS float64 `json:"at_s"`
	// Kind is "move" (the clients moved, Dialer.Migrate) or "rebind" (a
	// NAT in front of the pooler gave every flow a new port); empty in
	// reports written before there were kinds.
	Kind string `json:"kind,omitempty"`
	// TookMs is how long probing and switching every connection took.
	TookMs float64 `json:"took_ms"`
	// Error says why a connection could not move ("" when all did); it
	// then stayed on its old path.
	Error string `json:"error,omitempty"`
	// MaxMsAround is the largest max_ms of the one-second windows it
	// started in and the next: the latency blip, beside LatencyMs.P50.
	MaxMsAround float64 `json:"max_ms_around"`
}

// Connect is the set-up of a run's sessions, done before its ramp.
type Connect struct {
	// Sessions is the number of PostgreSQL sessions opened.
	Sessions int `json:"sessions"`
	// TotalMs is the wall time to open them all, in milliseconds.
	TotalMs float64 `json:"total_ms"`
	// P50Ms and MaxMs are per-session connect times (dial, TLS or QUIC
	// handshake, startup and authentication), in milliseconds.
	P50Ms float64 `json:"p50_ms"`
	MaxMs float64 `json:"max_ms"`
	// QUICConns is the number of live QUIC connections after connecting
	// (QUIC only).
	QUICConns int `json:"quic_conns,omitempty"`
}

// ConnectLatency is the time to a ready new session, in milliseconds.
type ConnectLatency struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

// Latency is a latency summary in milliseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// Client is the load generator's own resource use over a run.
type Client struct {
	// PeakRSSBytes is the highest resident set size sampled.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// CPUSeconds is the user plus system CPU time the process spent.
	CPUSeconds float64 `json:"cpu_seconds"`
	// FDs is the highest number of open file descriptors sampled.
	FDs int `json:"fds"`
}

// Path is a transport's view of the network path over a run or a window,
// with the emulator's counts beside it.
type Path struct {
	// Retransmits counts retransmitted TCP segments (QUIC retransmits
	// frames, not packets: 0 there, see LostPackets).
	Retransmits uint64 `json:"retransmits"`
	// SentPackets counts packets (TCP segments) the client sent.
	SentPackets uint64 `json:"sent_packets"`
	// LostPackets counts packets the client's transport declared lost
	// (QUIC) or retransmitted without the receiver reporting a duplicate
	// (TCP).
	LostPackets uint64 `json:"lost_packets"`
	// SRTTMs is the smoothed round-trip time, averaged over connections.
	SRTTMs float64 `json:"srtt_ms"`
	// EmulatorDrops counts packets the emulator dropped, both directions
	// (random and burst loss, queue overflow), from the start of the run
	// (after the sessions connected) to its end; run totals only.
	EmulatorDrops uint64 `json:"emulator_drops,omitempty"`
	// QueueDrops counts the bottleneck queue's share of them.
	QueueDrops uint64 `json:"queue_drops,omitempty"`
	// QueueDelayMs is the mean time a packet waited for the bottleneck,
	// QueueDelayMaxMs the longest; 0 without a rate limit.
	QueueDelayMs    float64 `json:"queue_delay_ms,omitempty"`
	QueueDelayMaxMs float64 `json:"queue_delay_max_ms,omitempty"`
}

// Usage is the CPU one component spent over a run.
type Usage struct {
	// CPUSeconds is the user plus system CPU time spent.
	CPUSeconds float64 `json:"cpu_seconds"`
}

// Second is one one-second window of a run. Queries belong to the window of
// their intended send time, not of their completion, so a stall shows up as
// latency in the windows whose queries it delayed.
type Second struct {
	// T is the window's start, in whole seconds since the run began.
	T int `json:"t"`
	// OfferedQPS is the number of queries scheduled in the window.
	OfferedQPS float64 `json:"offered_qps"`
	// CompletedQPS is the number of queries that completed during the window.
	CompletedQPS float64 `json:"completed_qps"`
	// InFlight is the number of queries sent and not yet answered at the
	// window's end.
	InFlight int64 `json:"in_flight"`
	// Backlog is the number of queries due but not yet sent (waiting for a
	// free session) at the window's end.
	Backlog int64 `json:"backlog"`
	// P50Ms, P99Ms and MaxMs are the latency of the window's queries.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`

	// ErrorsQPS is the number of queries that failed during the window.
	ErrorsQPS float64 `json:"errors_qps,omitempty"`
	// OldestQueuedMs is the age of the oldest query in the backlog at the
	// window's end, in milliseconds (0 with an empty backlog).
	OldestQueuedMs float64 `json:"oldest_queued_ms"`
	// GeneratorLagMs is the generator's largest lag during the window.
	GeneratorLagMs float64 `json:"generator_lag_ms,omitempty"`
	// ClientCPUSeconds is the CPU the client spent during the window.
	ClientCPUSeconds float64 `json:"client_cpu_seconds,omitempty"`
	// ClientRSSBytes is the client's resident set size sampled at the
	// window's end.
	ClientRSSBytes int64 `json:"client_rss_bytes,omitempty"`
	// ClientFDs is the client's open file descriptor count sampled at the
	// window's end.
	ClientFDs int `json:"client_fds,omitempty"`
	// EmulatorCPUSeconds is the CPU the WAN emulator spent during the window.
	EmulatorCPUSeconds float64 `json:"emulator_cpu_seconds,omitempty"`
	// Path holds the path counters' increase during the window (SRTTMs as
	// sampled at its end); nil when not measured.
	Path *Path `json:"path,omitempty"`
}

// ErrInvalid is wrapped by every error Validate returns, so callers can tell
// a report that breaks the contract from an I/O failure with errors.Is.
var ErrInvalid = errors.New("invalid ramp report")

// Validate checks the contract every report keeps: each run names a known
// transport, has no negative count, and accounts for every query it
// scheduled (scheduled = completed + errors + unfinished). It returns every
// problem found, each wrapping ErrInvalid.
func (r *Report) Validate() error {
	var errs []error
	for i := range r.Runs {
		run := &r.Runs[i]
		name := fmt.Sprintf("run %d (%s)", i, run.Transport)
		switch run.Transport {
		case TransportTCP, TransportQUIC:
		default:
			errs = append(errs, fmt.Errorf("%w: run %d: transport %q is neither %q nor %q",
				ErrInvalid, i, run.Transport, TransportTCP, TransportQUIC))
		}
		if run.Scheduled < 0 || run.Completed < 0 || run.Errors < 0 || run.Unfinished < 0 {
			errs = append(errs, fmt.Errorf("%w: %s: negative count (scheduled %d, completed %d, errors %d, unfinished %d)",
				ErrInvalid, name, run.Scheduled, run.Completed, run.Errors, run.Unfinished))
		}
		if sum := run.Completed + run.Errors + run.Unfinished; sum != run.Scheduled {
			errs = append(errs, fmt.Errorf("%w: %s: scheduled %d != completed %d + errors %d + unfinished %d (= %d)",
				ErrInvalid, name, run.Scheduled, run.Completed, run.Errors, run.Unfinished, sum))
		}
	}
	return errors.Join(errs...)
}

// Run returns the first run of the given transport, or nil.
func (r *Report) Run(transport string) *Run {
	for i := range r.Runs {
		if r.Runs[i].Transport == transport {
			return &r.Runs[i]
		}
	}
	return nil
}

// Sessions is the number of concurrent PostgreSQL sessions the run had:
// connections times streams per connection (at least one per connection).
func (r *Run) Sessions() int {
	return r.Conns * max(r.StreamsPerConn, 1)
}

// ConnectRoundTrips is the model's round trips before a session-per-query
// run's session is ready (ModelConnectRoundTrips), 0 when not set.
func (r *Run) ConnectRoundTrips() int {
	if r.ModelConnectRoundTrips == nil {
		return 0
	}
	return *r.ModelConnectRoundTrips
}

// MarshalIndent returns the report as indented JSON after validating it.
func (r *Report) MarshalIndent() ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode ramp report: %w", err)
	}
	return append(b, '\n'), nil
}

// WriteJSON validates the report and writes it to path as indented JSON. It
// writes a temporary file in the same directory and renames it, so a reader
// never sees half a report.
func (r *Report) WriteJSON(path string) error {
	b, err := r.MarshalIndent()
	if err != nil {
		return err
	}
	if err := writeFileAtomic(path, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	}); err != nil {
		return fmt.Errorf("write ramp report %s: %w", path, err)
	}
	return nil
}

// WriteHTMLFile renders the report (see WriteHTML) into path, through a
// temporary file in the same directory and a rename, so a reader never sees
// half a page.
func (r *Report) WriteHTMLFile(path string) error {
	if err := writeFileAtomic(path, func(w io.Writer) error { return WriteHTML(w, r) }); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// writeFileAtomic writes path by way of a temporary file that is renamed
// into place once write succeeded, and removed otherwise.
func writeFileAtomic(path string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// CreateTemp makes the file 0600; a report is meant to be shared.
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// ReadJSON reads a report written by WriteJSON (or by anything that follows
// the contract) and validates it. Unknown fields are ignored, so reports
// from newer versions still load.
func ReadJSON(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read ramp report: %w", err)
	}
	var r Report
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&r); err != nil {
		return nil, fmt.Errorf("decode ramp report %s: %w", path, err)
	}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("ramp report %s: %w", path, err)
	}
	return &r, nil
}
