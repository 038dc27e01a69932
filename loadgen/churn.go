package loadgen

import (
	"context"
	"fmt"
	"github.com/pgquic/pgquic/loadgen/wan"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// closeTimeout bounds closing one session: Terminate, the socket's close,
// and pgconn's background clean-up after a canceled query.
const closeTimeout = 2 * time.Second

// ChurnStats describes the sessions a SessionPerQuery client opened during
// its runs since Connect (warm-up sessions excluded).
type ChurnStats struct {
	// NewSessions counts sessions opened and ready (ReadyForQuery);
	// ConnectErrors the attempts that failed, except those the end of a
	// run canceled.
	NewSessions, ConnectErrors int64
	// P50 and P99 are the time from the dial to a ready session.
	P50, P99 time.Duration
}

// churnStats collects connect times from the workers.
type churnStats struct {
	mu     sync.Mutex
	times  []time.Duration
	failed int64
	open   sync.WaitGroup // sessions not yet closed, for Close
}

func (s *churnStats) record(d time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.failed++
		return
	}
	s.times = append(s.times, d)
}

// wait blocks until every session a worker opened is closed.
func (s *churnStats) wait() { s.open.Wait() }

func (s *churnStats) snapshot() ChurnStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := ChurnStats{NewSessions: int64(len(s.times)), ConnectErrors: s.failed}
	if n := len(s.times); n > 0 {
		sorted := slices.Sorted(slices.Values(s.times))
		st.P50 = sorted[n/2]
		st.P99 = sorted[min(n-1, (n*99+99)/100-1)]
	}
	return st
}

// ChurnStats returns what the client's session-per-query runs opened; the
// zero value for a client that connects its sessions before the run.
func (c *Clients) ChurnStats() ChurnStats { return c.churn.snapshot() }

// prepareChurn makes the session-per-query workers. It opens and closes
// warm-up sessions first, so that an unreachable target fails Connect
// within ConnectTimeout as before, and so that LocalStartup runs over a
// warm QUIC connection with its greeting cached (the steady state of an
// edge); they are timed in Stats, not in ChurnStats.
func (c *Clients) prepareChurn(ctx context.Context) error {
	start := time.Now()
	warm := 1
	if c.cfg.LocalStartup {
		warm = 2
	}
	if c.warmQUIC != nil && c.cfg.Netns != "" {
		// The Dialer binds its UDP socket on the first stream: inside the
		// namespace, since local-startup streams open from its goroutines.
		wctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
		err := inNetnsDo(c.cfg.Netns, func() error { return c.warmQUIC(wctx) })
		cancel()
		if err != nil {
			return fmt.Errorf("%w to %s over %s: %w", ErrConnect, c.cfg.Addr, c.transportLabel(), err)
		}
	}
	var times []time.Duration
	for range warm {
		t := time.Now()
		conn, err := c.connect(ctx)
		if err != nil {
			return err
		}
		times = append(times, time.Since(t))
		_, err = conn.Exec(ctx, c.cfg.Query).ReadAll()
		closeSession(conn)
		if err != nil {
			return fmt.Errorf("%w: warm-up query over %s: %w", ErrConnect, c.transportLabel(), err)
		}
	}
	n := c.cfg.Sessions()
	c.sessions = make([]*session, n)
	for i := range c.sessions {
		c.sessions[i] = &session{c: c, churn: true}
	}
	c.Stats = ConnectStats{Sessions: warm, Total: time.Since(start), P50: times[len(times)/2], Max: slices.Max(times)}
	if c.liveQUIC != nil {
		c.Stats.QUICConns = c.liveQUIC()
	}
	return nil
}

// doChurn is a SessionPerQuery query: a new session, the query, Terminate.
// Its latency therefore counts the session's set-up, as a serverless
// worker's does; the connect time alone goes to ChurnStats.
func (s *session) doChurn(ctx context.Context) error {
	c := s.c
	t := time.Now()
	conn, err := pgconn.ConnectConfig(ctx, c.pg)
	if err == nil || ctx.Err() == nil {
		// A connect the run's end cut short is not the target's failure.
		c.churn.record(time.Since(t), err)
	}
	if err != nil {
		return fmt.Errorf("%w to %s over %s: %w", ErrConnect, c.cfg.Addr, c.transportLabel(), err)
	}
	_, err = conn.Exec(ctx, c.cfg.Query).ReadAll()
	if ctx.Err() != nil {
		// The run ended with the query in flight: pgconn is already closing
		// the connection (a CancelRequest, then Terminate) in the
		// background; Close waits for that.
		c.churn.open.Add(1)
		go func() {
			defer c.churn.open.Done()
			closeSession(conn)
		}()
		return err
	}
	closeSession(conn)
	return err
}

// closeSession ends a session cleanly: Terminate, then the close, and
// waits (bounded) for pgconn's clean-up of a canceled query, so the pooler
// sees every session end and none accumulates.
func closeSession(conn *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = conn.Close(ctx)
	select {
	case <-conn.CleanupDone():
	case <-ctx.Done():
	}
}

// inNetnsDo runs f on a thread inside namespace ns, or here when ns is "".
func inNetnsDo(ns string, f func() error) error {
	if ns == "" {
		return f()
	}
	return wan.InNetns(ns, f)
}
