package backend

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgproto"
)

// cancelTarget says where and how to reach the server process with a given
// PID: the address it was dialed at and its TLS configuration.
type cancelTarget struct {
	network, address string
	tlsConfig        *tls.Config
}

// dialTarget returns the network and address a connection was made to. For
// unix sockets the peer name is relative ("./.s.PGSQL.5432"), so the
// configured host (a directory) and port are used instead, as pgconn does.
func dialTarget(nc net.Conn, cfg *pgconn.Config) (network, address string) {
	if ra := nc.RemoteAddr(); ra != nil && ra.Network() != "unix" {
		return ra.Network(), ra.String()
	}
	return pgconn.NetworkAddress(cfg.Host, cfg.Port)
}

// Cancel asks the server to cancel the query running in process pid, the way
// a client's CancelRequest would
// (https://www.postgresql.org/docs/current/protocol-flow.html#PROTOCOL-FLOW-CANCELING-REQUESTS):
// it opens a fresh connection to the server that process runs on, negotiates
// TLS first when the pooled connection uses TLS (so the key is not sent in
// clear text), sends the CancelRequest and waits for the server to close the
// connection. The server gives no answer, so success only means the request
// was delivered; a wrong key or a finished query are silently ignored.
func (p *Pool) Cancel(ctx context.Context, pid uint32, secretKey []byte) error {
	t := p.cancelTargetFor(pid)
	dctx, cancel := context.WithTimeout(ctx, p.cfg.ConnectTimeout)
	defer cancel()

	nc, err := p.pgcfg.DialFunc(dctx, t.network, t.address)
	if err != nil {
		return fmt.Errorf("backend: cancel pid %d: dial %s: %w", pid, t.address, err)
	}
	defer func() { _ = nc.Close() }()
	if d, ok := dctx.Deadline(); ok {
		if err := nc.SetDeadline(d); err != nil {
			return fmt.Errorf("backend: cancel pid %d: %w", pid, err)
		}
	}
	stop := context.AfterFunc(dctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	conn := nc
	if t.tlsConfig != nil {
		conn, err = startTLS(dctx, nc, t.tlsConfig)
		if err != nil {
			return fmt.Errorf("backend: cancel pid %d: %w", pid, err)
		}
	}

	buf := make([]byte, 12+len(secretKey))
	binary.BigEndian.PutUint32(buf[0:4], uint32(len(buf)))
	binary.BigEndian.PutUint32(buf[4:8], pgproto.CancelRequestCode)
	binary.BigEndian.PutUint32(buf[8:12], pid)
	copy(buf[12:], secretKey)
	if _, err := conn.Write(buf); err != nil {
		return fmt.Errorf("backend: cancel pid %d: send: %w", pid, err)
	}
	// The server processes the request and closes the connection; waiting
	// for that (as libpq does) means the cancel has been signalled by the
	// time Cancel returns.
	if _, err := io.Copy(io.Discard, conn); err != nil && !errors.Is(err, net.ErrClosed) {
		// The deadline is the context's, and the read can reach it a
		// moment before the context reports it: both mean unconfirmed.
		if ctxErr := dctx.Err(); ctxErr != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("backend: cancel pid %d: wait for close: %w", pid, errors.Join(ctxErr, err))
		}
		// A reset after the request was delivered still means delivered.
		p.logger.Debug("backend: cancel connection ended with error", "pid", pid, "err", err)
	}
	return nil
}

// cancelTargetFor looks up where process pid lives. A PID that is no longer
// in the pool (its connection was just destroyed) falls back to the first
// configured host, which is where a single-host setup sends everything.
func (p *Pool) cancelTargetFor(pid uint32) cancelTarget {
	p.targetsMu.Lock()
	t, ok := p.targets[pid]
	p.targetsMu.Unlock()
	if ok {
		return t
	}
	network, address := pgconn.NetworkAddress(p.pgcfg.Host, p.pgcfg.Port)
	return cancelTarget{network: network, address: address, tlsConfig: p.pgcfg.TLSConfig}
}

// startTLS sends an SSLRequest and, when the server answers 'S', runs the TLS
// handshake. A server that answers 'N' gets the request in clear text, which
// is what libpq did for cancellation before PostgreSQL 17.
func startTLS(ctx context.Context, nc net.Conn, cfg *tls.Config) (net.Conn, error) {
	var req [8]byte
	binary.BigEndian.PutUint32(req[0:4], 8)
	binary.BigEndian.PutUint32(req[4:8], pgproto.SSLRequestCode)
	if _, err := nc.Write(req[:]); err != nil {
		return nil, fmt.Errorf("send SSLRequest: %w", err)
	}
	var resp [1]byte
	if _, err := io.ReadFull(nc, resp[:]); err != nil {
		return nil, fmt.Errorf("read SSLRequest reply: %w", err)
	}
	switch resp[0] {
	case 'N':
		return nc, nil
	case 'S':
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, fmt.Errorf("tls handshake: %w", err)
		}
		return tc, nil
	default:
		return nil, fmt.Errorf("unexpected SSLRequest reply %q", resp[0])
	}
}

// CancelOnce cancels the query running in process pid with PostgreSQL's
// pg_cancel_backend, called from a fresh session of the pool's user on the
// server that process runs on. A CancelRequest (Cancel) is turned by the
// postmaster into two signals, to the process and then to its process group
// (signal_child), and a busy machine can deliver the second after the first
// has ended the query, so that it stops the next query on the connection.
// pg_cancel_backend signals once, and has signalled by the time it answers:
// when CancelOnce returns, nothing of this cancel can stop a later query.
// It costs a whole login, so the pooler uses it only where the next query
// on the connection may be another client's. A process that is gone is no
// error (the function reports false); a session that cannot be opened, or a
// refusal (another role's process), is, marked ErrCancelNotSent, and the
// caller may fall back to Cancel.
func (p *Pool) CancelOnce(ctx context.Context, pid uint32) error {
	cfg, err := p.onceConfig(p.cancelTargetFor(pid))
	if err != nil {
		return fmt.Errorf("backend: cancel pid %d: %w", pid, err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ConnectTimeout)
	defer cancel()
	c, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("backend: cancel pid %d: connect: %w: %w", pid, ErrCancelNotSent, err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	res := c.ExecParams(ctx, "SELECT pg_catalog.pg_cancel_backend($1)",
		[][]byte{strconv.AppendUint(nil, uint64(pid), 10)}, []uint32{23}, nil, nil).Read()
	if res.Err != nil {
		var pe *pgconn.PgError
		if errors.As(res.Err, &pe) {
			// The server refused the call: it signalled nothing.
			return fmt.Errorf("backend: cancel pid %d: pg_cancel_backend: %w: %w", pid, ErrCancelNotSent, res.Err)
		}
		return fmt.Errorf("backend: cancel pid %d: pg_cancel_backend: %w", pid, res.Err)
	}
	return nil
}

// ErrCancelNotSent marks a CancelOnce that certainly signalled nothing (the
// session could not be opened, or the server refused the call), after
// which another way of cancelling cannot make two cancels of one. Other
// errors leave it unknown whether the signal went.
var ErrCancelNotSent = errors.New("cancel not sent")

// onceConfig is the pool's connection configuration aimed at the one server
// t names (no fallbacks: the session must reach the process's own server),
// with the TLS setting its connection was made with.
func (p *Pool) onceConfig(t cancelTarget) (*pgconn.Config, error) {
	cfg := p.pgcfg.Copy()
	switch t.network {
	case "unix":
		dir, file := filepath.Split(t.address)
		port, err := strconv.ParseUint(strings.TrimPrefix(file, ".s.PGSQL."), 10, 16)
		if err != nil {
			return nil, fmt.Errorf("socket path %q: %w", t.address, err)
		}
		cfg.Host, cfg.Port = filepath.Clean(dir), uint16(port)
	default:
		host, ps, err := net.SplitHostPort(t.address)
		if err != nil {
			return nil, err
		}
		port, err := strconv.ParseUint(ps, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("address %q: %w", t.address, err)
		}
		cfg.Host, cfg.Port = host, uint16(port)
	}
	cfg.Fallbacks = nil
	cfg.TLSConfig = t.tlsConfig
	if t.tlsConfig != nil {
		cfg.TLSConfig = t.tlsConfig.Clone()
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = make(map[string]string, 1)
	}
	cfg.RuntimeParams["application_name"] = "pgquic cancel" // Copy copied the map
	return cfg, nil
}
