package loadgen

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/loadgen/report"
)

// runShort runs a constant-rate schedule on c's sessions, checking the
// accounting of every query.
func runShort(t *testing.T, c *Clients, s Schedule) (*Result, *queryLog) {
	t.Helper()
	log := newQueryLog()
	r, err := Run(context.Background(), RunConfig{Schedule: s, OnQuery: log.add(t)}, c.Workers())
	if err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, r, log)
	return r, log
}

// TestClientsThroughPooler runs a short constant-rate load over TCP with
// TLS, plain TCP and QUIC through the in-process pooler: every query
// completes, with a loopback latency.
func TestClientsThroughPooler(t *testing.T) {
	st := newStack(t)
	cases := []struct {
		name     string
		cfg      ClientConfig
		sessions int
	}{
		{"tcp+tls", ClientConfig{Transport: TCP, Addr: st.tcpAddr, Conns: 8, PinSHA256: st.pin}, 8},
		{"tcp plain", ClientConfig{Transport: TCP, Addr: st.tcpAddr, Conns: 8, DisableTLS: true}, 8},
		{"quic", ClientConfig{Transport: QUIC, Addr: st.quicAddr, Conns: 2, Streams: 5, PinSHA256: st.pin}, 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Password = "postgres"
			c := connect(t, tc.cfg)
			if c.Stats.Sessions != tc.sessions || len(c.Workers()) != tc.sessions || c.Stats.Max <= 0 || c.Stats.P50 > c.Stats.Max || c.Stats.Total < c.Stats.Max {
				t.Fatalf("connect stats %+v, want %d sessions", c.Stats, tc.sessions)
			}
			if tc.cfg.Transport == QUIC && c.Stats.QUICConns != 2 {
				t.Errorf("%d QUIC connections after connecting, want 2", c.Stats.QUICConns)
			}
			r, _ := runShort(t, c, Constant(200, 2*time.Second))
			if r.Scheduled != 400 || r.Completed != 400 || r.Errors != 0 {
				t.Fatalf("scheduled %d completed %d errors %d (%v)", r.Scheduled, r.Completed, r.Errors, r.FirstError)
			}
			// The bound only catches gross stalls: on a 2-core machine whose
			// other test packages run at the same time, a loopback p50 above
			// 100 ms was seen when the process waited for CPU.
			if r.Latency.P50 <= 0 || r.Latency.P50 > 500*time.Millisecond {
				t.Errorf("p50 %v over loopback", r.Latency.P50)
			}
			if c.Reconnects() != 0 {
				t.Errorf("%d reconnects", c.Reconnects())
			}
			checkReport(t, r, c)
		})
	}
}

// TestStallNoCoordinatedOmission stalls the path to the pooler for one
// second in the middle of a constant-rate run over TCP+TLS (a relay the
// test controls stops forwarding in both directions). A closed-loop
// generator would record only the handful of queries in flight as slow and
// send the others late; here every query scheduled during the stall is
// counted, each with a latency from its intended time to after the stall
// ended, so the query scheduled as the stall began waits about a second.
func TestStallNoCoordinatedOmission(t *testing.T) {
	st := newStack(t)
	proxy := newStallProxy(t, st.tcpAddr)
	c := connect(t, ClientConfig{Transport: TCP, Addr: st.tcpAddr, Relay: proxy.addr(), Conns: 10, PinSHA256: st.pin, Password: "postgres"})
	const rate = 200
	s := Constant(rate, 3*time.Second)
	log := newQueryLog()
	var stallDone sync.WaitGroup
	r, err := Run(context.Background(), RunConfig{Schedule: s, OnQuery: log.add(t), Progress: func(p Progress) {
		if p.Elapsed < 2*time.Second && p.Elapsed >= time.Second {
			stallDone.Add(1)
			go func() {
				defer stallDone.Done()
				proxy.gate.shut()
				time.Sleep(time.Second) // the stall's length, not a wait for a state
				proxy.gate.reopen()
			}()
		}
	}}, c.Workers())
	stallDone.Wait()
	if err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, r, log)
	if r.Completed != r.Scheduled || r.Scheduled != 3*rate {
		t.Fatalf("scheduled %d completed %d errors %d unfinished %d (%s)", r.Scheduled, r.Completed, r.Errors, r.Unfinished, r.FirstError)
	}
	from, to := proxy.gate.closed.Sub(r.Start), proxy.gate.opened.Sub(r.Start)
	if to-from < time.Second {
		t.Fatalf("stall lasted %v", to-from)
	}
	inStall, before := 0, 0
	var first *Query
	var sum time.Duration
	for i := range r.Scheduled {
		q := log.qs[i]
		switch {
		case q.Intended >= from && q.Intended < to:
			inStall++
			sum += q.Latency()
			if first == nil {
				first = &q
			}
			// Held until the stall ended: latency >= to - intended.
			if q.Done < to {
				t.Errorf("query %d intended at %v completed at %v, inside the stall [%v, %v)", i, q.Intended, q.Done, from, to)
			}
		case q.Intended < from && q.Done >= to:
			before++ // in flight when the stall began
		}
	}
	// Exactly the queries the schedule put in the stall, counted by
	// intended time, none omitted; besides them only those in flight as
	// it began were held up.
	if want := s.Integral(to) - s.Integral(from); float64(inStall) < want-1 || float64(inStall) > want+1 {
		t.Errorf("%d queries intended during the %v stall, the schedule says %.1f", inStall, to-from, want)
	}
	if before > len(c.Workers()) {
		t.Errorf("%d queries scheduled before the stall completed after it; only those in flight (at most one per session, usually one or two at %d q/s) should", before, rate)
	}
	if first == nil || first.Latency() < to-from-20*time.Millisecond {
		t.Fatalf("first query of the stall: %+v, want a latency of about %v", first, to-from)
	}
	// Intended times spread evenly over the stall: their latencies average
	// half of it.
	if mean := sum / time.Duration(max(inStall, 1)); mean < (to-from)/2-20*time.Millisecond {
		t.Errorf("mean latency of the queries scheduled during the stall %v, want >= %v", mean, (to-from)/2)
	}
	if r.Latency.Max < to-from-20*time.Millisecond {
		t.Errorf("max latency %v for a %v stall", r.Latency.Max, to-from)
	}
	// The second holding the stall's first query, by intended time, shows
	// that query's whole wait. It was intended up to one arrival after the
	// stall began, so the bound is from its own intended time, not from the
	// stall's start (which missed by up to 5 ms at 200 q/s).
	k := windowOf(first.Intended)
	if w := r.Windows[k]; w.Max < to-first.Intended {
		t.Errorf("second %d, where the stall's first query was intended (%v): max latency %v, want >= %v", k, first.Intended, w.Max, to-first.Intended)
	}
}

// TestCancelMidRun cancels a run after a second, as Ctrl-C does: the run
// returns at once with what it measured, queued and running queries
// counted unfinished (not as errors), and the sessions the cancel broke
// reconnect in the next run. Through the pooler over QUIC, and straight to
// PostgreSQL over TCP, where the next run is checked too: through the
// pooler, the CancelRequest pgconn sends for each abandoned query can still
// be in flight when the pooler lends that server connection to another
// session, so a query of the next run may be canceled (a pooler race, not
// the load generator's).
func TestCancelMidRun(t *testing.T) {
	st := newStack(t)
	cl := sharedCluster(t)
	cases := []struct {
		name  string
		cfg   ClientConfig
		again bool
	}{
		{"quic via pooler", ClientConfig{Transport: QUIC, Addr: st.quicAddr, Conns: 2, Streams: 4, PinSHA256: st.pin}, false},
		{"tcp direct", ClientConfig{Transport: TCP, Addr: net.JoinHostPort(cl.Host, strconv.Itoa(cl.Port)), Conns: 8, DisableTLS: true}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Password = "postgres"
			tc.cfg.Query = "SELECT pg_sleep(0.05)"
			c := connect(t, tc.cfg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			log := newQueryLog()
			r, err := Run(ctx, RunConfig{Schedule: Constant(200, 20*time.Second), OnQuery: log.add(t), Progress: func(p Progress) {
				if p.Elapsed >= time.Second {
					cancel()
				}
			}}, c.Workers())
			if err != nil {
				t.Fatal(err)
			}
			checkAccounting(t, r, log)
			if !r.Canceled || r.Elapsed > 3*time.Second {
				t.Fatalf("canceled %v after %v", r.Canceled, r.Elapsed)
			}
			// 8 sessions at 50 ms each serve 160 q/s of the 200 offered: a
			// backlog builds, and the cancel leaves queued and running
			// queries unfinished.
			if r.Unfinished < 8 || r.Completed < 100 || r.Errors != 0 {
				t.Fatalf("completed %d errors %d unfinished %d (%s)", r.Completed, r.Errors, r.Unfinished, r.FirstError)
			}
			if r.Scheduled < 190 || r.Scheduled > 300 {
				t.Errorf("%d scheduled in about a second at 200 q/s", r.Scheduled)
			}
			if !tc.again {
				return
			}
			r2, _ := runShort(t, c, Constant(20, time.Second))
			if r2.Completed != 20 || c.Reconnects() < 1 {
				t.Fatalf("after the cancel: completed %d errors %d (%s), %d reconnects", r2.Completed, r2.Errors, r2.FirstError, c.Reconnects())
			}
		})
	}
}

// TestQueryErrorsCounted runs bad SQL: every query fails with SQLSTATE
// 42601, each failure counted, and the sessions stay usable.
func TestQueryErrorsCounted(t *testing.T) {
	st := newStack(t)
	c := connect(t, ClientConfig{Transport: TCP, Addr: st.tcpAddr, Conns: 4, PinSHA256: st.pin, Password: "postgres", Query: "SELEC 1"})
	r, _ := runShort(t, c, Constant(100, time.Second))
	if r.Errors != 100 || r.Completed != 0 || r.ErrorKinds["SQLSTATE 42601"] != 100 || !strings.Contains(r.FirstError, "syntax error") {
		t.Fatalf("errors %d completed %d kinds %v first %q", r.Errors, r.Completed, r.ErrorKinds, r.FirstError)
	}
	if c.Reconnects() != 0 || r.KneeQPS != 0 {
		t.Errorf("%d reconnects, knee %v: a server error leaves the session usable and nothing kept up", c.Reconnects(), r.KneeQPS)
	}
}

// TestSessionsReconnect connects straight to PostgreSQL (target mode, plain
// TCP) and terminates every load generator backend mid-run: the queries
// that hit a dead connection count as errors, the sessions reconnect, and
// the rest complete.
func TestSessionsReconnect(t *testing.T) {
	cl := sharedCluster(t)
	addr := net.JoinHostPort(cl.Host, strconv.Itoa(cl.Port))
	c := connect(t, ClientConfig{Transport: TCP, Addr: addr, Conns: 4, DisableTLS: true, Password: "postgres"})
	var killed sync.WaitGroup
	log := newQueryLog()
	r, err := Run(context.Background(), RunConfig{Schedule: Constant(100, 2*time.Second), OnQuery: log.add(t), Progress: func(p Progress) {
		if p.Elapsed < 2*time.Second {
			killed.Add(1)
			go func() {
				defer killed.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := cl.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgquic-loadgen'"); err != nil {
					t.Errorf("terminate: %v", err)
				}
			}()
		}
	}}, c.Workers())
	killed.Wait()
	if err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, r, log)
	if c.Reconnects() < 1 || r.Errors > 8 || r.Completed < r.Scheduled-8 || r.Unfinished != 0 {
		t.Fatalf("reconnects %d, completed %d errors %d unfinished %d of %d (%v)", c.Reconnects(), r.Completed, r.Errors, r.Unfinished, r.Scheduled, r.ErrorKinds)
	}
	for kind := range r.ErrorKinds {
		if kind != "SQLSTATE 57P01" && kind != "connection" {
			t.Errorf("unexpected error kind %q: %s", kind, r.FirstError)
		}
	}
}

// TestUnreachableTarget: connecting to a port nobody listens on fails
// quickly with an error naming the address and the transport, never a hang.
func TestUnreachableTarget(t *testing.T) {
	tcpAddr := freeAddr(t, "tcp")
	udpAddr := freeAddr(t, "udp")
	cases := []struct {
		name  string
		cfg   ClientConfig
		limit time.Duration
	}{
		{"tcp", ClientConfig{Transport: TCP, Addr: tcpAddr, Conns: 50, Insecure: true}, 2 * time.Second},
		{"quic", ClientConfig{Transport: QUIC, Addr: udpAddr, Conns: 2, Streams: 10, Insecure: true, ConnectTimeout: time.Second}, 4 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c, err := Connect(context.Background(), tc.cfg, nil)
			if err == nil {
				_ = c.Close()
				t.Fatal("Connect succeeded")
			}
			t.Logf("%v", err)
			if el := time.Since(start); el > tc.limit {
				t.Errorf("failed after %v, want under %v", el, tc.limit)
			}
			if !errors.Is(err, ErrConnect) || !strings.Contains(err.Error(), tc.cfg.Addr) || !strings.Contains(err.Error(), string(tc.cfg.Transport)) {
				t.Errorf("error %q: want ErrConnect naming %s over %s", err, tc.cfg.Addr, tc.cfg.Transport)
			}
		})
	}
}

// TestClientConfigErrors: a configuration mistake is reported before any
// connection is tried.
func TestClientConfigErrors(t *testing.T) {
	bad := []ClientConfig{
		{Transport: "udp", Addr: "127.0.0.1:1", Conns: 1, Insecure: true},
		{Transport: TCP, Addr: "nohost", Conns: 1, Insecure: true},
		{Transport: TCP, Addr: "127.0.0.1:1", Conns: 0, Insecure: true},
		{Transport: TCP, Addr: "127.0.0.1:1", Conns: 1, Streams: 2, Insecure: true},
		{Transport: TCP, Addr: "127.0.0.1:1", Conns: 1},                                  // TLS without a verification mode
		{Transport: QUIC, Addr: "127.0.0.1:1", Conns: 1, DisableTLS: true},               // QUIC is always TLS
		{Transport: TCP, Addr: "127.0.0.1:1", Conns: 1, Insecure: true, PinSHA256: "ab"}, // two modes
		{Transport: TCP, Addr: "127.0.0.1:1", Conns: 1, PinSHA256: "not hex"},
		{Transport: TCP, Addr: "127.0.0.1:1", Conns: 1, Relay: "norelayport", Insecure: true},
	}
	for _, cfg := range bad {
		if _, err := Connect(context.Background(), cfg, nil); !errors.Is(err, ErrBadClientConfig) {
			t.Errorf("Connect(%+v) = %v, want ErrBadClientConfig", cfg, err)
		}
	}
}

// TestPinMismatch: a wrong pin fails the TLS handshake of TCP sessions.
func TestPinMismatch(t *testing.T) {
	st := newStack(t)
	wrong := strings.Repeat("ab", 32)
	_, err := Connect(context.Background(), ClientConfig{Transport: TCP, Addr: st.tcpAddr, Conns: 1, PinSHA256: wrong, Password: "postgres"}, nil)
	if !errors.Is(err, ErrPinMismatch) || !errors.Is(err, ErrConnect) {
		t.Fatalf("Connect with a wrong pin: %v", err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		t.Fatalf("a TLS failure reported as a server error: %v", err)
	}
}

// freeAddr returns a loopback address on which nothing listens.
func freeAddr(t *testing.T, network string) string {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := c.LocalAddr().String()
		_ = c.Close()
		return addr
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// checkReport writes the run as ramp.json and reads it back.
func checkReport(t *testing.T, r *Result, c *Clients) {
	t.Helper()
	cfg := c.Config()
	rep := report.Report{
		Scenario: report.Scenario{FromQPS: r.Schedule.From, ToQPS: r.Schedule.To, DurationS: r.Schedule.Duration.Seconds(), Query: cfg.Query, PoolSize: testPoolSize},
		Runs:     []report.Run{r.ReportRun(c)},
	}
	path := filepath.Join(t.TempDir(), "ramp.json")
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	back, err := report.ReadJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	run := back.Runs[0]
	if run.Transport != string(cfg.Transport) || run.Conns != cfg.Conns || run.StreamsPerConn != max(cfg.Streams, 1) || run.TLS != cfg.TLS() {
		t.Errorf("run header %s %d x %d tls %v, want %s %d x %d tls %v", run.Transport, run.Conns, run.StreamsPerConn, run.TLS, cfg.Transport, cfg.Conns, cfg.Streams, cfg.TLS())
	}
	if run.Scheduled != int64(r.Scheduled) || run.Completed != int64(r.Completed) || run.Connect == nil || run.Connect.Sessions != c.Stats.Sessions {
		t.Errorf("run counts %+v, connect %+v", run, run.Connect)
	}
	if len(run.Seconds) < 2 || run.Seconds[0].OfferedQPS != float64(r.Windows[0].Offered) || run.Seconds[1].T != 1 ||
		run.LatencyMs.P50 <= 0 || run.LatencyMs.P50 != ms(r.Latency.P50) || run.Client.PeakRSSBytes <= 0 {
		t.Errorf("report run: latency %+v client %+v seconds %+v", run.LatencyMs, run.Client, run.Seconds)
	}
}
