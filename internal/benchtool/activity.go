package benchtool

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// sampleEvery is the pg_stat_activity sampling period during a run.
const sampleEvery = 100 * time.Millisecond

// busyQuery counts the bench database's client backends that are not idle
// (running a query or inside a transaction) and all of them, leaving out
// the monitoring connection itself.
const busyQuery = `SELECT count(*) FILTER (WHERE state <> 'idle'), count(*)
FROM pg_stat_activity
WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()`

// monitor is the tool's own connection to PostgreSQL, used to sample
// pg_stat_activity. Its backend's CPU is left out of the cluster's.
type monitor struct {
	conn *pgconn.PgConn
	pid  int // the monitoring backend's pid
	db   string
	mu   sync.Mutex // one query at a time on conn
}

// connectMonitor opens the monitoring connection to database postgres.
func connectMonitor(ctx context.Context, url, benchDB string) (*monitor, error) {
	conn, err := pgconn.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	m := &monitor{conn: conn, db: benchDB}
	v, err := m.one(ctx, "SELECT pg_backend_pid()")
	if err != nil {
		conn.Close(ctx)
		return nil, err
	}
	m.pid, _ = strconv.Atoi(v)
	return m, nil
}

// one runs a query returning one text value.
func (m *monitor) one(ctx context.Context, sql string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	res := m.conn.ExecParams(ctx, sql, nil, nil, nil, nil).Read()
	if res.Err != nil {
		return "", fmt.Errorf("%s: %w", sql, res.Err)
	}
	if len(res.Rows) != 1 || len(res.Rows[0]) < 1 {
		return "", fmt.Errorf("%s: %d rows", sql, len(res.Rows))
	}
	return string(res.Rows[0][0]), nil
}

// counts returns the busy and total client backends of the bench database.
func (m *monitor) counts(ctx context.Context) (busy, total int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	res := m.conn.ExecParams(ctx, busyQuery, [][]byte{[]byte(m.db)}, nil, nil, nil).Read()
	if res.Err != nil {
		return 0, 0, fmt.Errorf("sample pg_stat_activity: %w", res.Err)
	}
	if len(res.Rows) != 1 || len(res.Rows[0]) != 2 {
		return 0, 0, fmt.Errorf("sample pg_stat_activity: %d rows", len(res.Rows))
	}
	busy, _ = strconv.Atoi(string(res.Rows[0][0]))
	total, _ = strconv.Atoi(string(res.Rows[0][1]))
	return busy, total, nil
}

// waitBackendsAtMost polls until the bench database has at most n client
// backends or the deadline passes, so a direct run's exiting backends have
// gone before the cluster's CPU is read.
func (m *monitor) waitBackendsAtMost(ctx context.Context, n int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		_, total, err := m.counts(ctx)
		if err != nil || total <= n {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitBackendsAtLeast polls until the bench database has at least n client
// backends (a direct run's clients have all connected), done is closed or
// the timeout passes.
func (m *monitor) waitBackendsAtLeast(ctx context.Context, n int, timeout time.Duration, done <-chan struct{}) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		_, total, err := m.counts(ctx)
		if err != nil || total >= n {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// busyStats summarises the busy-connection samples of one run.
type busyStats struct {
	mean    float64
	max     int
	samples int
}

// sampler collects busy counts every sampleEvery until stopped.
type sampler struct {
	quit  chan struct{}
	done  chan struct{}
	stats busyStats
	err   error
}

// startSampling begins sampling in its own goroutine. Queries run under
// ctx, not under the sampler's own stop: a query cut short by a cancelled
// context would close the monitoring connection.
func (m *monitor) startSampling(ctx context.Context) *sampler {
	s := &sampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		sum := 0
		defer func() {
			if s.stats.samples > 0 {
				s.stats.mean = float64(sum) / float64(s.stats.samples)
			}
		}()
		for {
			select {
			case <-s.quit:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			busy, _, err := m.counts(ctx)
			if err != nil {
				s.err = err
				return
			}
			sum += busy
			s.stats.samples++
			s.stats.max = max(s.stats.max, busy)
		}
	}()
	return s
}

// stop ends sampling and returns the summary.
func (s *sampler) stop() (busyStats, error) {
	close(s.quit)
	<-s.done
	return s.stats, s.err
}

// close ends the monitoring connection.
func (m *monitor) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m.conn.Close(ctx)
}
