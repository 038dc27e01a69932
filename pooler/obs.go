package pooler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Client states of pgquic_pooler_clients_by_state, as PgBouncer's SHOW
// POOLS splits its clients (cl_active, cl_waiting).
const (
	stateLogin   = "login"   // not yet authenticated
	stateActive  = "active"  // holds a server connection
	stateWaiting = "waiting" // waits for a server connection
	stateIdle    = "idle"    // between transactions, holding nothing
)

var clientStates = [...]string{stateLogin, stateActive, stateWaiting, stateIdle}

// stateCollector reports how many clients are in each state, per front, read
// from the poolers' sessions at scrape time so that the hot path updates
// nothing. Poolers sharing a registry share one collector.
type stateCollector struct {
	desc           *prometheus.Desc
	received, sent *prometheus.Desc

	mu      sync.Mutex
	poolers []*Pooler
}

func newStateCollector() *stateCollector {
	return &stateCollector{desc: prometheus.NewDesc("pgquic_pooler_clients_by_state",
		"Client sessions open, by front-end transport and state: login (authenticating), active (holding a server connection), waiting (for a server connection), idle.",
		[]string{"transport", "state"}, nil),
		received: prometheus.NewDesc("pgquic_pooler_client_received_bytes_total",
			"Protocol bytes received from clients (after TLS decryption), by front-end transport.", []string{"transport"}, nil),
		sent: prometheus.NewDesc("pgquic_pooler_client_sent_bytes_total",
			"Protocol bytes sent to clients (before TLS encryption), by front-end transport.", []string{"transport"}, nil),
	}
}

// registerStates adds p to the registry's state collector, registering one
// if there is none yet.
func registerStates(reg prometheus.Registerer, p *Pooler) error {
	c := newStateCollector()
	err := reg.Register(c)
	if err != nil {
		var are prometheus.AlreadyRegisteredError
		existing, ok := (*stateCollector)(nil), false
		if errors.As(err, &are) {
			existing, ok = are.ExistingCollector.(*stateCollector)
		}
		if !ok {
			return fmt.Errorf("pooler: register metrics: %w", err)
		}
		c = existing
	}
	c.mu.Lock()
	c.poolers = append(c.poolers, p)
	c.mu.Unlock()
	return nil
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.received
	ch <- c.sent
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	poolers := append([]*Pooler(nil), c.poolers...)
	c.mu.Unlock()
	counts := map[string]*[len(clientStates)]int{}
	bytes := map[string]*[2]uint64{}
	for _, p := range poolers {
		p.mu.Lock()
		for _, s := range p.sessions {
			n := counts[s.peer.Transport]
			if n == nil {
				n = new([len(clientStates)]int)
				counts[s.peer.Transport] = n
			}
			n[s.state()]++
		}
		// Bytes: the sessions registered now plus those that ended, both
		// under p.mu, so a session moves from one to the other at once and
		// the counters never go back.
		add := func(transport string, in, out uint64) {
			b := bytes[transport]
			if b == nil {
				b = new([2]uint64)
				bytes[transport] = b
			}
			b[0] += in
			b[1] += out
		}
		for s := range p.live {
			add(s.peer.Transport, s.ctr.Received.Load(), s.ctr.Sent.Load())
		}
		for transport, b := range p.endedBytes {
			add(transport, b[0], b[1])
		}
		p.mu.Unlock()
	}
	for transport, n := range counts {
		for i, st := range clientStates {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n[i]), transport, st)
		}
	}
	for transport, b := range bytes {
		ch <- prometheus.MustNewConstMetric(c.received, prometheus.CounterValue, float64(b[0]), transport)
		ch <- prometheus.MustNewConstMetric(c.sent, prometheus.CounterValue, float64(b[1]), transport)
	}
}

// state returns the index in clientStates of what s is doing now. It reads
// only atomics, so a scrape never waits for a session.
func (s *session) state() int {
	switch {
	case !s.authed.Load():
		return 0
	case s.busy.Load():
		return 1
	case s.waiting.Load():
		return 2
	}
	return 3
}

// countedStream counts the protocol bytes a client sends and receives (after
// TLS decryption) into the session's own counters: one uncontended atomic
// add per read or write call, not per message. The per-transport series and
// SHOW STATS sum them when read.
type countedStream struct {
	io.ReadWriteCloser
	ctr *DatabaseCounters
}

func (c *countedStream) Read(b []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(b)
	if n > 0 {
		c.ctr.Received.Add(uint64(n))
	}
	return n, err
}

func (c *countedStream) Write(b []byte) (int, error) {
	n, err := c.ReadWriteCloser.Write(b)
	if n > 0 {
		c.ctr.Sent.Add(uint64(n))
	}
	return n, err
}

// countBytes wraps a client stream of s's transport in a countedStream.
func (s *session) countBytes(rwc io.ReadWriteCloser) io.ReadWriteCloser {
	return &countedStream{rwc, &s.ctr}
}

// DatabaseCounters are cumulative counts of the client sessions of one
// database, for the admin console's SHOW STATS: protocol bytes from and to
// clients, logins, the Parse and Bind messages clients sent, and the Parse
// messages the pooler sent servers to create statements they lacked.
type DatabaseCounters struct {
	Received, Sent, Logins, ClientParses, Binds, ServerParses atomic.Uint64
}

// add adds o's counts to c.
func (c *DatabaseCounters) add(o *DatabaseCounters) {
	c.Received.Add(o.Received.Load())
	c.Sent.Add(o.Sent.Load())
	c.Logins.Add(o.Logins.Load())
	c.ClientParses.Add(o.ClientParses.Load())
	c.Binds.Add(o.Binds.Load())
	c.ServerParses.Add(o.ServerParses.Load())
}

// DatabaseCounters returns, per client-facing database, the counts of its
// sessions so far: those that ended and those still open.
func (p *Pooler) DatabaseCounters() map[string]*DatabaseCounters {
	out := map[string]*DatabaseCounters{}
	sum := func(db string, c *DatabaseCounters) {
		t := out[db]
		if t == nil {
			t = new(DatabaseCounters)
			out[db] = t
		}
		t.add(c)
	}
	p.mu.Lock()
	for db, c := range p.ended {
		sum(db, c)
	}
	p.mu.Unlock()
	for _, s := range p.snapshotSessions() {
		sum(s.database, &s.ctr)
	}
	return out
}

// noteEnded adds an ended logged-in session's counts to its database's.
// The map is bounded like the pools: one entry per database name a client
// logged in to (wildcard pools for unknown names are refused at login).
func (p *Pooler) noteEnded(s *session) {
	if !s.listed.Load() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s.listed.Store(false) // counted here from now on, not among the live sessions
	c := p.ended[s.database]
	if c == nil {
		if p.ended == nil {
			p.ended = map[string]*DatabaseCounters{}
		}
		c = new(DatabaseCounters)
		p.ended[s.database] = c
	}
	c.add(&s.ctr)
}

// sqlstateClass returns the class (first two characters) of an
// ErrorResponse's SQLSTATE, or "other" for one that is not five characters
// of digits and capitals, so a server cannot create arbitrary label values.
func sqlstateClass(body []byte) string {
	code := errorCode(body)
	if len(code) != 5 {
		return "other"
	}
	for i := range 5 {
		if c := code[i]; (c < '0' || c > '9') && (c < 'A' || c > 'Z') {
			return "other"
		}
	}
	return code[:2]
}

// noteRequest stamps the reply e stands for with when its request began,
// for the query and transaction duration histograms. Every request the
// client sends (a Query, or Parse/Bind/Execute... up to Sync) starts a batch
// at its first message; the entry awaiting the batch's ReadyForQuery carries
// the batch's start. The pooler's own quiet queries are not timed. s.mu must
// be held.
func (s *session) noteRequest(a *attachment, e *entry) {
	if e.quiet || e.kind == eSynthetic {
		return
	}
	if a.batchStart.IsZero() {
		a.batchStart = time.Now()
		if a.stampAttach {
			// The request the connection was attached for: one clock
			// read serves both.
			s.lastRequest, a.stampAttach = a.batchStart, false
		}
	}
	switch e.kind {
	case eSync, eQuery, eFunc:
		e.start, a.batchStart = a.batchStart, time.Time{}
		s.armQueryLocked()
	}
}

// noteReady records a client request answered by ReadyForQuery with the
// given status: one query in the pool's histogram, and a transaction when
// the status says no block is open any more. s.mu must be held.
func (s *session) noteReady(a *attachment, head *entry, status byte) {
	if head.quiet || head.start.IsZero() {
		return
	}
	now := time.Now()
	a.readyAt = now // finishRelease's release time, a moment later
	took := now.Sub(head.start)
	a.conn.ObserveQuery(took)
	s.slowReplies = took > flushOnReadAfter
	if a.txStart.IsZero() {
		a.txStart = head.start
	}
	if status == 'I' {
		a.conn.ObserveTransaction(now.Sub(a.txStart))
		a.txStart = time.Time{}
		s.p.m.transactions.Inc()
		s.txns.Add(1)
	}
}

// logEnd writes the one line a session leaves behind when it ends: front,
// database and user, how long it lasted, its transactions, and how it
// ended (the session's logger already carries the front, client address,
// database and user). Sessions that never logged in (port scans, health checks, refused
// logins, cancel requests) log at debug level only.
func (s *session) logEnd(d time.Duration, err error) {
	level := slog.LevelInfo
	if !s.authed.Load() {
		level = slog.LevelDebug
	}
	outcome := "closed by client"
	if err != nil {
		outcome = err.Error()
	}
	s.log.Log(context.Background(), level, "session ended",
		"duration", d.Round(time.Millisecond), "transactions", s.txns.Load(), "outcome", outcome)
}
