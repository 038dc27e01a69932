package backend

import (
	"cmp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Read-only statistics and the PAUSE/KILL hooks the admin console uses.
// Nothing here runs on the path of a transaction.

// reasonAdmin labels connections closed by the admin console (PAUSE, KILL).
const reasonAdmin = "admin"

// ServerInfo describes one open server connection.
type ServerInfo struct {
	// PID is the server's process ID.
	PID uint32
	// Address is where the connection was dialed (host:port or a socket
	// path).
	Address string
	// TLS reports an encrypted connection.
	TLS bool
	// ConnectTime is when the connection was opened.
	ConnectTime time.Time
}

// Servers returns the pool's open server connections, idle or lent out,
// ordered by process ID. Connections still being opened are not listed
// (Stats.Constructing counts them).
func (p *Pool) Servers() []ServerInfo {
	p.targetsMu.Lock()
	out := make([]ServerInfo, 0, len(p.live))
	for c := range p.live {
		out = append(out, ServerInfo{PID: c.PID, Address: c.address, TLS: c.tlsConfig != nil, ConnectTime: c.createdAt})
	}
	p.targetsMu.Unlock()
	slices.SortFunc(out, func(a, b ServerInfo) int { return cmp.Compare(a.PID, b.PID) })
	return out
}

// track and untrack keep the set Servers lists; construct and destruct
// call them.
func (p *Pool) track(c *Conn) {
	p.targetsMu.Lock()
	if p.live == nil {
		p.live = make(map[*Conn]struct{})
	}
	p.live[c] = struct{}{}
	p.targetsMu.Unlock()
}

func (p *Pool) untrack(c *Conn) {
	p.targetsMu.Lock()
	delete(p.live, c)
	p.targetsMu.Unlock()
}

// Settings is the configuration a pool runs with, for SHOW DATABASES.
type Settings struct {
	// Host and Port are the first server address of the connection string.
	Host string
	Port uint16
	// PoolSize, MinPool and ServerLifetime are the PoolConfig values in
	// force, defaults applied; MinPool is 0 for a template database, whose
	// pool keeps no idle connection (template.go).
	PoolSize, MinPool int
	ServerLifetime    time.Duration
}

// Settings returns the pool's configuration.
func (p *Pool) Settings() Settings {
	minPool := p.cfg.MinPool
	if p.template.Load() {
		minPool = 0
	}
	return Settings{
		Host:           p.pgcfg.Host,
		Port:           p.pgcfg.Port,
		PoolSize:       p.cfg.PoolSize,
		MinPool:        minPool,
		ServerLifetime: p.cfg.ServerLifetime,
	}
}

// Counters are cumulative totals since the pool was opened.
type Counters struct {
	// Acquires counts server connections lent out (PgBouncer's
	// server_assignment_count).
	Acquires int64
	// AcquireWait is the total time Acquire calls spent, waiting included.
	AcquireWait time.Duration
	// Queries and QueryTime count the requests the holders recorded with
	// Conn.ObserveQuery and their total duration; Transactions and
	// TransactionTime likewise for Conn.ObserveTransaction. They are read
	// from the pool's duration histograms, so they are 0 for a pool built
	// without metrics, and pools with the same database and user labels
	// share them.
	Queries, Transactions      uint64
	QueryTime, TransactionTime time.Duration
}

// Counters returns the pool's cumulative totals.
func (p *Pool) Counters() Counters {
	s := p.pp.Stat()
	c := Counters{Acquires: s.AcquireCount(), AcquireWait: s.AcquireDuration()}
	if pm := p.metrics; pm != nil {
		c.Queries, c.QueryTime = histogramTotals(pm.queryDur)
		c.Transactions, c.TransactionTime = histogramTotals(pm.txDur)
	}
	return c
}

// histogramTotals reads a histogram's sample count and sum (in seconds).
func histogramTotals(o prometheus.Observer) (uint64, time.Duration) {
	m, ok := o.(prometheus.Metric)
	if !ok {
		return 0, 0
	}
	var d dto.Metric
	if err := m.Write(&d); err != nil || d.GetHistogram() == nil {
		return 0, 0
	}
	h := d.GetHistogram()
	return h.GetSampleCount(), time.Duration(h.GetSampleSum() * float64(time.Second))
}

// Pause closes the pool's idle server connections and stops the
// background loop from opening new ones to keep MinPool, until Resume; the
// admin console's PAUSE calls it once no client holds a connection, so the
// server can be restarted. Acquire still works: holding clients back is
// the pooler's job.
func (p *Pool) Pause() int {
	p.paused.Store(true)
	return p.CloseIdle()
}

// Resume lets the background loop keep MinPool connections open again.
func (p *Pool) Resume() { p.paused.Store(false) }

// Paused reports whether Pause is in force.
func (p *Pool) Paused() bool { return p.paused.Load() }

// CloseIdle closes every idle server connection and returns how many it
// closed. Connections lent out are not touched.
func (p *Pool) CloseIdle() int {
	idle := p.pp.AcquireAllIdle()
	for _, res := range idle {
		p.destroyRes(res, reasonAdmin)
	}
	return len(idle)
}

// NamedPool is a pool with the names clients use to reach it.
type NamedPool struct {
	// Database is the database clients ask for: the route's database, or
	// for a wildcard route the server database.
	Database string
	// User is the route's user, or for wildcard pools the server user;
	// "*" for a named route serving any user.
	User string
	// Forced reports a route with a named database: every client of the
	// pool connects as the pool's own server user (PgBouncer's force_user).
	Forced bool
	// Pool is the pool itself.
	*Pool
}

// NamedPools returns every open pool with its client-facing names, ordered
// by database and user.
func (m *Manager) NamedPools() []NamedPool {
	m.mu.RLock()
	out := make([]NamedPool, 0, len(m.pools))
	for k, p := range m.pools {
		r := m.routes[k.route]
		np := NamedPool{Database: r.Database, User: r.User, Forced: r.Database != Wildcard, Pool: p}
		if r.Database == Wildcard {
			np.Database, np.User = p.database, p.user
		}
		if np.User == "" {
			np.User = Wildcard
		}
		out = append(out, np)
	}
	m.mu.RUnlock()
	slices.SortFunc(out, func(a, b NamedPool) int {
		return cmp.Or(cmp.Compare(a.Database, b.Database), cmp.Compare(a.User, b.User))
	})
	return out
}
