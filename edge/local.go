package edge

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/localstart"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/internal/pgproto"
)

// Bounds on a local client's authentication messages, PostgreSQL's own, as
// the pooler applies them.
const (
	maxPasswordPacketLen = pgauth.MaxPasswordPacketLen
	maxSASLMessageLen    = pgauth.MaxSASLMessageLen
)

// runLocal serves one local client with LocalAuth: it reads the startup,
// authenticates the client here, and hands the session to localstart,
// which answers the startup locally or passes the pooler's greeting on.
// A CancelRequest carries the edge's own key and is routed by it.
func (e *Edge) runLocal(s *edgeSession, log *slog.Logger) {
	pkt, code, err := localstart.ReadFirst(s.tcp, e.cfg.StartupTimeout)
	if err != nil {
		log.Debug("edge: no usable startup packet", "err", err)
		return
	}
	if code == pgproto.CancelRequestCode {
		if _, err := e.local.Cancel(e.baseCtx, pkt); err != nil {
			log.Warn("edge: cancel request not forwarded", "err", err)
		}
		return
	}
	st, err := localstart.ParseStartup(pkt)
	if err != nil {
		// Fail closed: nothing the edge cannot read reaches the pooler
		// under the edge's identity.
		log.Info("edge: refusing a startup packet it cannot read", "err", err)
		e.refuse(s.tcp, pgproto.CodeProtocolViolation, "invalid startup packet: "+err.Error())
		return
	}
	log = log.With("user", st.User, "database", st.Database)
	ctx, cancel := context.WithTimeout(e.baseCtx, e.cfg.StartupTimeout)
	_ = s.tcp.SetReadDeadline(time.Now().Add(e.cfg.StartupTimeout))
	err = e.cfg.LocalAuth.Authenticate(ctx, &localExchange{c: s.tcp}, st.User, s.tcp.RemoteAddr())
	cancel()
	_ = s.tcp.SetReadDeadline(time.Time{})
	if err != nil {
		e.authFailures.Inc()
		log.Info("edge: local authentication failed", "err", err)
		var coded interface{ SQLState() string }
		if errors.As(err, &coded) {
			e.refuse(s.tcp, coded.SQLState(), err.Error())
		} else {
			e.refuse(s.tcp, pgproto.CodeInvalidPassword, fmt.Sprintf("password authentication failed for user %q", st.User))
		}
		return
	}
	if e.local.Cached(st) && st.Local && e.cfg.LocalStartup {
		e.localStartups.Inc()
		log.Debug("edge: startup answered locally")
	}
	if err := e.local.Serve(e.baseCtx, s.tcp, st); err != nil {
		if errors.Is(err, localstart.ErrRefused) {
			log.Info("edge: the pooler refused the session", "err", err)
		} else {
			log.Debug("edge: session ended", "err", err)
		}
	}
}

// refuse sends the client a FATAL ErrorResponse.
func (e *Edge) refuse(c net.Conn, code, msg string) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(localstart.ErrorResponse("FATAL", code, msg))
}

// localExchange is the pgauth.Exchange of a local client: authentication
// requests written to its TCP connection, its 'p' replies read unbuffered
// (whatever follows belongs to the session).
type localExchange struct {
	c   net.Conn
	max int
	buf []byte
}

// Send implements pgauth.Exchange.
func (x *localExchange) Send(msgs ...pgproto3.BackendMessage) error {
	var out []byte
	for _, m := range msgs {
		switch m.(type) {
		case *pgproto3.AuthenticationSASL, *pgproto3.AuthenticationSASLContinue:
			x.max = maxSASLMessageLen
		case *pgproto3.AuthenticationCleartextPassword, *pgproto3.AuthenticationMD5Password:
			x.max = maxPasswordPacketLen
		}
		var err error
		if out, err = m.Encode(out); err != nil {
			return fmt.Errorf("edge: encode %T: %w", m, err)
		}
	}
	_, err := x.c.Write(out)
	return err
}

// ReceivePassword implements pgauth.Exchange, bounding the message as
// PostgreSQL does.
func (x *localExchange) ReceivePassword(ctx context.Context) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit := x.max
	if limit == 0 {
		limit = maxPasswordPacketLen
	}
	var hdr [5]byte
	if _, err := io.ReadFull(x.c, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[1:]))
	if hdr[0] != 'p' {
		return nil, fmt.Errorf("edge: expected password response, got message type %d", hdr[0])
	}
	if n < 4 || n > limit {
		return nil, fmt.Errorf("edge: invalid password message length %d", n)
	}
	if cap(x.buf) < n-4 {
		x.buf = make([]byte, n-4)
	}
	x.buf = x.buf[:n-4]
	if _, err := io.ReadFull(x.c, x.buf); err != nil {
		return nil, err
	}
	return x.buf, nil
}
