package admin

import (
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/pooler"
)

// The SHOW commands. Column names, order and types follow PgBouncer's
// src/admin.c and src/stats.c; the comments say where pgquic has no such
// concept and what it reports instead.

// show runs SHOW what.
func (c *Console) show(what string) (*result, error) {
	switch what {
	case "pools":
		return c.showPools(), nil
	case "clients":
		return c.showClients(), nil
	case "servers":
		return c.showServers(), nil
	case "stats":
		return c.showStats(), nil
	case "stats_totals":
		return c.showStatsTotals(), nil
	case "databases":
		return c.showDatabases(), nil
	case "config":
		return c.showConfig(), nil
	case "version":
		r := &result{cols: cols("s", "version")}
		r.add("pgquic " + c.cfg.Version)
		return r, nil
	case "lists":
		return c.showLists(), nil
	case "state":
		return c.showState(), nil
	case "help", "":
		r := &result{cols: cols("s", "command")}
		for _, h := range helpLines {
			r.add(h)
		}
		return r, nil
	}
	return nil, errorf(codeSyntaxError, "invalid command %q, use SHOW HELP;", "SHOW "+what)
}

var helpLines = []string{
	"SHOW HELP|POOLS|CLIENTS|SERVERS|STATS|STATS_TOTALS|DATABASES|CONFIG|VERSION|LISTS|STATE",
	"PAUSE [<db>]", "RESUME [<db>]", "KILL [<db>]", "SHUTDOWN", "RELOAD",
}

// byPool groups the client snapshot by pool, console sessions left out.
func byPool(clients []pooler.ClientInfo) map[*backend.Pool][]pooler.ClientInfo {
	m := make(map[*backend.Pool][]pooler.ClientInfo)
	for _, ci := range clients {
		if !ci.Console && ci.Pool != nil {
			m[ci.Pool] = append(m[ci.Pool], ci)
		}
	}
	return m
}

// showPools is SHOW POOLS: one row per server pool. cl_active counts the
// logged-in clients not waiting (with or without a server connection, as
// PgBouncer counts them), cl_waiting those waiting for a server connection
// (pool exhausted, or database paused); sv_active, sv_idle and sv_login
// are the pool's connections lent out, idle and being opened. pgquic has
// no separate cancel lists nor used/tested states: those columns are 0.
func (c *Console) showPools() *result {
	r := &result{cols: cols("ssiiiiiiiiiiiiiss",
		"database", "user",
		"cl_active", "cl_waiting",
		"cl_active_cancel_req", "cl_waiting_cancel_req",
		"sv_active", "sv_active_cancel", "sv_being_canceled",
		"sv_idle", "sv_used", "sv_tested", "sv_login",
		"maxwait", "maxwait_us", "pool_mode", "load_balance_hosts")}
	now := time.Now()
	clients := c.p.Clients()
	grouped := byPool(clients)
	for _, np := range c.pools.NamedPools() {
		var active, waiting int
		var maxWait time.Duration
		for _, ci := range grouped[np.Pool] {
			if ci.State == pooler.ClientWaiting {
				waiting++
				maxWait = max(maxWait, now.Sub(ci.WaitSince))
			} else {
				active++
			}
		}
		st := np.Pool.Stat()
		r.add(np.Database, np.User, active, waiting, 0, 0,
			st.InUse, 0, 0, st.Idle, 0, 0, st.Constructing,
			int(maxWait/time.Second), int((maxWait%time.Second)/time.Microsecond),
			c.cfg.Mode, null)
	}
	// The console's own pseudo-pool, as PgBouncer lists its pgbouncer one.
	n := 0
	for _, ci := range clients {
		if ci.Console {
			n++
		}
	}
	r.add(Databases[0], Databases[0], n, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, "statement", null)
	return r
}

// socketCols are the columns of SHOW CLIENTS and SHOW SERVERS: PgBouncer's
// (SKF_STD in src/admin.c), then pgquic's transport ("tcp", "quic", or
// "unix" for servers) and connection (which QUIC connection carries a
// client's stream; empty for TCP).
func socketCols() []column {
	return cols("ssssssisiTTiiississiiss",
		"type", "user", "database", "replication", "state",
		"addr", "port", "local_addr", "local_port",
		"connect_time", "request_time",
		"wait", "wait_us", "close_needed",
		"ptr", "link", "remote_pid", "tls",
		"application_name", "prepared_statements", "id",
		"transport", "connection")
}

// clientPtr and serverPtr stand in for PgBouncer's socket pointers, so
// link columns pair clients with servers.
func clientPtr(id uint64) string  { return "c" + strconv.FormatUint(id, 16) }
func serverPtr(pid uint32) string { return "s" + strconv.FormatUint(uint64(pid), 16) }

// splitAddr returns the IP address and port of a peer address.
func splitAddr(a net.Addr) (string, int) {
	if a == nil {
		return "", 0
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap().String(), int(ap.Port())
	}
	return a.String(), 0
}

// showClients is SHOW CLIENTS: one row per logged-in client session, console
// sessions included. local_addr and local_port are not known to the pooler
// (NULL and 0); remote_pid is 0 as for PgBouncer's TCP clients.
func (c *Console) showClients() *result {
	r := &result{cols: socketCols()}
	now := time.Now()
	for _, ci := range c.p.Clients() {
		addr, port := splitAddr(ci.Addr)
		var wait time.Duration
		if ci.State == pooler.ClientWaiting {
			wait = now.Sub(ci.WaitSince)
		}
		link := ""
		if ci.ServerPID != 0 {
			link = serverPtr(ci.ServerPID)
		}
		tls := ""
		if ci.TLS {
			tls = ci.Transport
			if ci.Transport == "tcp" {
				tls = "TLS"
			}
		}
		r.add("C", ci.User, ci.Database, "none", string(ci.State),
			addr, port, null, 0,
			ci.ConnectTime, ci.RequestTime,
			int(wait/time.Second), int((wait%time.Second)/time.Microsecond), 0,
			clientPtr(ci.ID), link, 0, tls,
			ci.ApplicationName, ci.PreparedStatements, ci.ID,
			ci.Transport, ci.Conn)
	}
	return r
}

// showServers is SHOW SERVERS: one row per open server connection, active
// when a client holds it, idle otherwise; connections still being opened
// are counted by SHOW POOLS' sv_login only.
func (c *Console) showServers() *result {
	r := &result{cols: socketCols()}
	type key struct {
		pool *backend.Pool
		pid  uint32
	}
	holders := make(map[key]pooler.ClientInfo)
	for _, ci := range c.p.Clients() {
		if ci.ServerPID != 0 {
			holders[key{ci.Pool, ci.ServerPID}] = ci
		}
	}
	for _, np := range c.pools.NamedPools() {
		for _, sv := range np.Pool.Servers() {
			state, link, req := "idle", "", sv.ConnectTime
			if ci, ok := holders[key{np.Pool, sv.PID}]; ok {
				state, link, req = "active", clientPtr(ci.ID), ci.RequestTime
			}
			host, portStr, err := net.SplitHostPort(sv.Address)
			port, transport := 0, "tcp"
			if err != nil {
				host, transport = sv.Address, "unix"
			} else {
				port, _ = strconv.Atoi(portStr)
			}
			tls := ""
			if sv.TLS {
				tls = "TLS"
			}
			r.add("S", np.Pool.User(), np.Database, "none", state,
				host, port, null, 0,
				sv.ConnectTime, req,
				0, 0, 0,
				serverPtr(sv.PID), link, sv.PID, tls,
				"", 0, int64(sv.PID),
				transport, "")
		}
	}
	return r
}

// statsNames are SHOW STATS' columns (admin_database_stats in PgBouncer's
// src/stats.c).
var statsNames = []string{"database",
	"total_server_assignment_count",
	"total_xact_count", "total_query_count",
	"total_received", "total_sent",
	"total_xact_time", "total_query_time",
	"total_wait_time", "total_client_parse_count",
	"total_server_parse_count", "total_bind_count",
	"total_client_login_count",
	"avg_server_assignment_count",
	"avg_xact_count", "avg_query_count",
	"avg_recv", "avg_sent",
	"avg_xact_time", "avg_query_time",
	"avg_wait_time", "avg_client_parse_count",
	"avg_server_parse_count", "avg_bind_count",
	"avg_client_login_count"}

// dbTotals are a database's cumulative counters; times in microseconds.
type dbTotals struct {
	name                                string
	assignments, xact, queries          uint64
	xactMicros, queryMicros, waitMicros int64
	received, sent                      uint64 // protocol bytes from and to clients
	clientParses, serverParses, binds   uint64
	logins                              uint64
}

// totals sums the pools' counters per client-facing database: server
// connections lent, transactions and requests (a simple Query, or the
// extended-protocol messages up to a Sync) with their durations as the
// pool's duration histograms recorded them, and the time Acquire calls
// took.
func (c *Console) totals() []dbTotals {
	var out []dbTotals
	for _, np := range c.pools.NamedPools() {
		ct := np.Pool.Counters()
		if len(out) == 0 || out[len(out)-1].name != np.Database {
			out = append(out, dbTotals{name: np.Database})
		}
		t := &out[len(out)-1]
		t.assignments += uint64(ct.Acquires)
		t.xact += ct.Transactions
		t.queries += ct.Queries
		t.xactMicros += ct.TransactionTime.Microseconds()
		t.queryMicros += ct.QueryTime.Microseconds()
		t.waitMicros += ct.AcquireWait.Microseconds()
	}
	counters := c.p.DatabaseCounters()
	for i := range out {
		if dc := counters[out[i].name]; dc != nil {
			t := &out[i]
			t.received, t.sent = dc.Received.Load(), dc.Sent.Load()
			t.clientParses, t.serverParses, t.binds = dc.ClientParses.Load(), dc.ServerParses.Load(), dc.Binds.Load()
			t.logins = dc.Logins.Load()
		}
	}
	return out
}

// showStats is SHOW STATS: per database, server assignments, transactions
// and requests with their times, wait time, protocol bytes from and to
// clients, clients' Parse and Bind messages, the Parses the pooler sent
// servers, and logins, as totals and as averages over the last completed
// stats period (Config.StatsPeriod; counts and bytes per second, times per
// transaction, request or assignment).
func (c *Console) showStats() *result {
	types := "s"
	for range len(statsNames) - 1 {
		types += "N"
	}
	r := &result{cols: cols(types, statsNames...)}
	totals := c.totals()
	avg := c.stats.averages(time.Now(), totals)
	for _, t := range totals {
		row := make([]any, len(statsNames))
		for i := range row {
			row[i] = 0
		}
		row[0], row[1], row[2], row[3] = t.name, t.assignments, t.xact, t.queries
		row[4], row[5] = t.received, t.sent
		row[6], row[7], row[8] = t.xactMicros, t.queryMicros, t.waitMicros
		row[9], row[10], row[11], row[12] = t.clientParses, t.serverParses, t.binds, t.logins
		a := avg[t.name]
		row[13], row[14], row[15] = a.assignments, a.xact, a.queries
		row[16], row[17] = a.received, a.sent
		row[18], row[19], row[20] = a.xactMicros, a.queryMicros, a.waitMicros
		row[21], row[22], row[23], row[24] = a.clientParses, a.serverParses, a.binds, a.logins
		r.add(row...)
	}
	return r
}

// showStatsTotals is SHOW STATS_TOTALS, the totals of SHOW STATS alone.
func (c *Console) showStatsTotals() *result {
	r := &result{cols: cols("sNNNNNNNNNNNN", "database",
		"server_assignment_count",
		"xact_count", "query_count",
		"bytes_received", "bytes_sent",
		"xact_time", "query_time",
		"wait_time", "client_parse_count",
		"server_parse_count", "bind_count",
		"client_login_count")}
	for _, t := range c.totals() {
		r.add(t.name, t.assignments, t.xact, t.queries, t.received, t.sent, t.xactMicros, t.queryMicros, t.waitMicros,
			t.clientParses, t.serverParses, t.binds, t.logins)
	}
	return r
}

// showDatabases is SHOW DATABASES: one row per server pool, then the
// console's virtual databases. force_user is the server user of a route
// with a named database (every client shares it); pgquic has no reserve
// pool, connection caps per database or disabling: those read 0 or NULL.
func (c *Console) showDatabases() *result {
	r := &result{cols: cols("ssissiiiissiiiiii",
		"name", "host", "port",
		"database", "force_user", "pool_size", "min_pool_size", "reserve_pool_size",
		"server_lifetime", "pool_mode", "load_balance_hosts", "max_connections",
		"current_connections", "max_client_connections", "current_client_connections",
		"paused", "disabled")}
	grouped := byPool(c.p.Clients())
	for _, np := range c.pools.NamedPools() {
		set := np.Pool.Settings()
		var force any = null
		if np.Forced {
			force = np.Pool.User()
		}
		r.add(np.Database, set.Host, int(set.Port),
			np.Pool.Database(), force, set.PoolSize, set.MinPool, 0,
			int(set.ServerLifetime/time.Second), c.cfg.Mode, null, 0,
			np.Pool.Stat().Total, 0, len(grouped[np.Pool]),
			c.p.Paused(np.Database), false)
	}
	for _, db := range Databases {
		r.add(db, null, 0, db, "pgquic", 2, 0, 0, 0, "statement", null, 0, 0, 0, 0, false, false)
	}
	return r
}

// showConfig is SHOW CONFIG: key, value, default, changeable. Every value
// goes through config.Redact, whatever Config.Settings returned, so a
// secret (a backend password, a passphrase) is never shown.
func (c *Console) showConfig() *result {
	r := &result{cols: cols("ssss", "key", "value", "default", "changeable")}
	if c.cfg.Settings != nil {
		for _, s := range c.cfg.Settings() {
			ch := "no"
			if s.Changeable {
				ch = "yes"
			}
			r.add(s.Key, config.Redact(s.Key, s.Value), config.Redact(s.Key, s.Default), ch)
		}
	}
	return r
}

// showLists is SHOW LISTS: counts of the pooler's objects in PgBouncer's
// list names. pgquic has no peers, no client or server slab caches and no
// asynchronous DNS: those read 0.
func (c *Console) showLists() *result {
	r := &result{cols: cols("si", "list", "items")}
	pools := c.pools.NamedPools()
	dbs, users := map[string]bool{}, map[string]bool{}
	servers := 0
	for _, np := range pools {
		dbs[np.Database], users[np.User] = true, true
		servers += np.Pool.Stat().Total
	}
	clients := c.p.Clients()
	for _, ci := range clients {
		users[ci.User] = true
	}
	r.add("databases", len(dbs)+len(Databases))
	r.add("users", len(users))
	r.add("peers", 0)
	r.add("pools", len(pools))
	r.add("peer_pools", 0)
	r.add("free_clients", 0)
	r.add("used_clients", len(clients))
	r.add("login_clients", c.p.StartingSessions())
	r.add("free_servers", 0)
	r.add("used_servers", servers)
	r.add("dns_names", 0)
	r.add("dns_zones", 0)
	r.add("dns_queries", 0)
	r.add("dns_pending", 0)
	return r
}

// showState is SHOW STATE: whether the pooler is active or paused (pgquic
// has no SUSPEND).
func (c *Console) showState() *result {
	r := &result{cols: cols("ss", "key", "value")}
	paused := c.p.Paused(pauseAllProbe)
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	r.add("active", yes(!paused))
	r.add("paused", yes(paused))
	r.add("suspended", "no")
	return r
}

// pauseAllProbe is a database name no client can use (it has a NUL), so
// Paused reports only a pause of every database.
const pauseAllProbe = "\x00all"
