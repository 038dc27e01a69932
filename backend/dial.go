package backend

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/rawsock"
	"github.com/pgquic/pgquic/internal/wire"
)

// bufSize is the read and write buffer size of each server connection: large
// enough to batch many small DataRows per system call.
const bufSize = 32 << 10

// maxServerMessage bounds one message from the server. The server is trusted,
// and PostgreSQL itself caps values at 1 GB, so rows up to that size pass.
const maxServerMessage = 1 << 30

// dial opens one server connection with pgconn, which does TLS negotiation,
// authentication (trust, cleartext, md5, SCRAM-SHA-256) and startup
// parameters, and then takes the raw socket over with Hijack. From then on
// the pooler speaks the protocol directly through R and W.
func (p *Pool) dial(ctx context.Context) (*Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConnectTimeout)
	defer cancel()

	pgConn, err := pgconn.ConnectConfig(ctx, p.pgcfg)
	if err != nil {
		return nil, fmt.Errorf("backend: connect to %s as %s: %w", p.database, p.user, err)
	}
	if !p.templateKnown.Load() {
		p.readTemplate(ctx, pgConn)
	}
	// SyncConn makes sure no bytes are left in pgconn's own read buffer and
	// no background reader is running, so Hijack hands over a clean socket.
	if err := pgConn.SyncConn(ctx); err != nil {
		_ = pgConn.Close(context.Background())
		return nil, fmt.Errorf("backend: sync new connection: %w", err)
	}
	hc, err := pgConn.Hijack()
	if err != nil {
		_ = pgConn.Close(context.Background())
		return nil, fmt.Errorf("backend: hijack new connection: %w", err)
	}
	// The pooler's reads and writes on a plain socket are raw system
	// calls (see internal/rawsock); under TLS they stay the net package's.
	nc := rawsock.Wrap(hc.Conn)
	if hc.TxStatus != 'I' {
		_ = nc.Close()
		return nil, fmt.Errorf("backend: new connection is not idle (status %q)", hc.TxStatus)
	}
	// pgconn clears its connect deadline when it stops watching ctx; clear
	// it again so a later timeout cannot fire on a pooled connection.
	if err := nc.SetDeadline(time.Time{}); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("backend: clear deadline: %w", err)
	}

	now := time.Now()
	params := hc.ParameterStatuses
	if params == nil {
		params = make(map[string]string)
	}
	c := &Conn{
		R:              wire.NewReader(nc, bufSize, maxServerMessage),
		W:              bufio.NewWriterSize(nc, bufSize),
		PID:            hc.PID,
		SecretKey:      hc.SecretKey,
		Params:         params,
		ServerDefaults: maps.Clone(params),
		netConn:        nc,
		pool:           p,
		createdAt:      now,
		lastUsed:       now,
		tlsConfig:      hc.TLSConfig,
	}
	c.network, c.address = dialTarget(nc, p.pgcfg)
	c.initRaw()
	return c, nil
}
