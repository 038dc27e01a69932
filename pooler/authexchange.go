package pooler

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/wire"
)

// The AuthExchange a session offers its Authenticator during startup.

// Send implements AuthExchange. It notes which kind of message the request
// asks for, so ReceivePassword applies PostgreSQL's bound for that kind.
func (s *session) Send(msgs ...pgproto3.BackendMessage) error {
	for _, m := range msgs {
		switch m.(type) {
		case *pgproto3.AuthenticationSASL, *pgproto3.AuthenticationSASLContinue:
			s.authMax = maxSASLMessageLen
		case *pgproto3.AuthenticationCleartextPassword, *pgproto3.AuthenticationMD5Password:
			s.authMax = maxPasswordPacketLen
		}
	}
	return s.send(msgs...)
}

// ReceivePassword implements AuthExchange. The message is bounded as
// PostgreSQL bounds it (see maxSASLMessageLen): a longer one ends the
// session with 08P01 before any of its body is read.
func (s *session) ReceivePassword(ctx context.Context) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit := s.authMax
	if limit == 0 {
		limit = maxPasswordPacketLen
	}
	old := s.cr.SetMaxLen(min(limit-4, s.p.cfg.MaxMessageLen)) // PostgreSQL's limits count the length word
	typ, _, err := s.cr.Next()
	s.cr.SetMaxLen(old)
	if err != nil {
		if errors.Is(err, wire.ErrBadLength) || errors.Is(err, wire.ErrMessageTooLarge) {
			return nil, fatal(pgproto.CodeProtocolViolation, "invalid message length", err)
		}
		return nil, err
	}
	if typ != 'p' {
		_ = s.cr.Skip()
		return nil, fatal(pgproto.CodeProtocolViolation, fmt.Sprintf("expected password response, got message type %d", typ), nil)
	}
	return s.cr.Body()
}
