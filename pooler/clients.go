package pooler

import (
	"net"
	"time"

	"github.com/pgquic/pgquic/backend"
)

// Read-only snapshots of the client sessions, for the admin console's SHOW
// CLIENTS, SHOW POOLS and SHOW SERVERS.

// ClientState says what a client session is doing, in PgBouncer's terms.
type ClientState string

const (
	// ClientActive sessions hold a server connection.
	ClientActive ClientState = "active"
	// ClientIdle sessions are logged in and hold no server connection.
	ClientIdle ClientState = "idle"
	// ClientWaiting sessions wait for a server connection: the pool is
	// exhausted, or their database is paused.
	ClientWaiting ClientState = "waiting"
)

// ClientInfo is a snapshot of one client session past login.
type ClientInfo struct {
	// ID is unique for the pooler's lifetime.
	ID uint64
	// PID is the process ID the client was given in BackendKeyData.
	PID uint32
	// User and Database are what the client logged in as and asked for.
	User, Database string
	// Addr is the client's address as the front saw it; may be nil.
	Addr net.Addr
	// Transport names the front ("tcp", "quic").
	Transport string
	// Conn identifies the transport connection carrying the session when
	// one connection carries several (a QUIC connection); empty for TCP.
	Conn string
	// TLS reports an encrypted transport (TLS, or QUIC).
	TLS bool
	// ApplicationName is the client's startup application_name.
	ApplicationName string
	// Console marks sessions of the admin console.
	Console bool
	// State is active, idle or waiting.
	State ClientState
	// ConnectTime is when the session began; RequestTime when the first
	// request on the server connection it last borrowed began (the
	// borrowing itself, a moment earlier, reads no clock of its own).
	ConnectTime, RequestTime time.Time
	// WaitSince is when the current wait for a server connection began;
	// zero unless State is ClientWaiting.
	WaitSince time.Time
	// Pool is the server pool the session borrows from; nil for console
	// sessions.
	Pool *backend.Pool
	// ServerPID is the process ID of the server connection the session
	// holds, 0 when none.
	ServerPID uint32
	// PreparedStatements counts the client's named prepared statements.
	PreparedStatements int
}

// Clients returns a snapshot of every client session that has logged in
// (sessions still authenticating are counted by StartingSessions). Each
// session is read under its own lock, so the snapshot is consistent per
// session, not across sessions.
func (p *Pooler) Clients() []ClientInfo {
	sessions := p.snapshotSessions()
	out := make([]ClientInfo, 0, len(sessions))
	for _, s := range sessions {
		ci := ClientInfo{
			ID:              s.id,
			User:            s.user,
			Database:        s.database,
			Addr:            s.peer.Addr,
			Transport:       s.peer.Transport,
			Conn:            s.peer.Conn,
			TLS:             s.peer.Secure || s.secure,
			ApplicationName: s.appName,
			Console:         s.console != nil,
			ConnectTime:     s.started,
			State:           ClientIdle,
		}
		s.mu.Lock()
		ci.Pool = s.pool // replaced after a configuration reload (acquireConn)
		ci.PID = s.pid
		ci.RequestTime = s.lastRequest
		ci.PreparedStatements = len(s.stmts)
		if a := s.currentLocked(); a != nil {
			ci.State = ClientActive
			ci.ServerPID = a.conn.PID
			ci.Pool = a.conn.Pool()
		} else if !s.waitSince.IsZero() {
			ci.State = ClientWaiting
			ci.WaitSince = s.waitSince
		}
		s.mu.Unlock()
		if ci.RequestTime.IsZero() {
			ci.RequestTime = ci.ConnectTime
		}
		out = append(out, ci)
	}
	return out
}
