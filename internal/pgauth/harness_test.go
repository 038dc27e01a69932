package pgauth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// testTimeout bounds every exchange generously: the machine is shared and
// noisy, and PBKDF2 runs on both ends.
const testTimeout = 60 * time.Second

// backendExchange implements Exchange over a pgproto3.Backend,
// the way a pooler session would, and records what it sent so tests can
// check which method ran.
type backendExchange struct {
	be   *pgproto3.Backend
	conn net.Conn

	mu   sync.Mutex
	sent []string // Go type names of the messages sent
	buf  []byte
}

func (e *backendExchange) Send(msgs ...pgproto3.BackendMessage) error {
	for _, m := range msgs {
		e.mu.Lock()
		e.sent = append(e.sent, fmt.Sprintf("%T", m))
		e.mu.Unlock()
		// The Backend decodes the next 'p' message according to the last
		// authentication request, as a real session must.
		switch m.(type) {
		case *pgproto3.AuthenticationSASL:
			_ = e.be.SetAuthType(pgproto3.AuthTypeSASL)
		case *pgproto3.AuthenticationSASLContinue:
			_ = e.be.SetAuthType(pgproto3.AuthTypeSASLContinue)
		case *pgproto3.AuthenticationMD5Password:
			_ = e.be.SetAuthType(pgproto3.AuthTypeMD5Password)
		case *pgproto3.AuthenticationCleartextPassword:
			_ = e.be.SetAuthType(pgproto3.AuthTypeCleartextPassword)
		}
		e.be.Send(m)
	}
	return e.be.Flush()
}

func (e *backendExchange) ReceivePassword(ctx context.Context) ([]byte, error) {
	stop := context.AfterFunc(ctx, func() { _ = e.conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	msg, err := e.be.Receive()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	switch msg.(type) {
	case *pgproto3.PasswordMessage, *pgproto3.SASLInitialResponse, *pgproto3.SASLResponse:
	default:
		return nil, fmt.Errorf("%w: expected a password message, got %T", ErrProtocol, msg)
	}
	// Re-encode to hand Authenticate the raw body, which is what the pooler
	// passes it.
	e.buf, err = msg.Encode(e.buf[:0])
	if err != nil {
		return nil, err
	}
	return e.buf[5:], nil
}

func (e *backendExchange) sentTypes() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.sent...)
}

// serverResult is what the fake pooler session learned.
type serverResult struct {
	user string
	err  error
	sent []string
}

// serveSession plays the pooler's part on conn: read the StartupMessage,
// authenticate, then either send an ErrorResponse (like the pooler will) or
// finish the startup with AuthenticationOk, ParameterStatus, BackendKeyData
// and ReadyForQuery, and wait for the client to go away.
func serveSession(ctx context.Context, a *Authenticator, conn net.Conn, peer net.Addr) serverResult {
	defer conn.Close()
	be := pgproto3.NewBackend(conn, conn)
	msg, err := be.ReceiveStartupMessage()
	if err != nil {
		return serverResult{err: fmt.Errorf("startup: %w", err)}
	}
	sm, ok := msg.(*pgproto3.StartupMessage)
	if !ok {
		return serverResult{err: fmt.Errorf("startup: got %T", msg)}
	}
	user := sm.Parameters["user"]
	ex := &backendExchange{be: be, conn: conn}
	authErr := a.Authenticate(ctx, ex, user, peer)
	res := serverResult{user: user, err: authErr, sent: ex.sentTypes()}
	if authErr != nil {
		code := "XX000"
		var st interface{ SQLState() string }
		if errors.As(authErr, &st) {
			code = st.SQLState()
		}
		be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code, Message: authErr.Error()})
		_ = be.Flush()
		return res
	}
	be.Send(&pgproto3.AuthenticationOk{})
	be.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: "15.0"})
	be.Send(&pgproto3.ParameterStatus{Name: "client_encoding", Value: "UTF8"})
	be.Send(&pgproto3.ParameterStatus{Name: "standard_conforming_strings", Value: "on"})
	be.Send(&pgproto3.BackendKeyData{ProcessID: 4242, SecretKey: []byte{1, 2, 3, 4}})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := be.Flush(); err != nil {
		res.err = fmt.Errorf("finish startup: %w", err)
		return res
	}
	for {
		m, err := be.Receive()
		if err != nil {
			return res
		}
		if _, ok := m.(*pgproto3.Terminate); ok {
			return res
		}
	}
}

// connectResult pairs the client's view with the server's.
type connectResult struct {
	clientErr error
	server    serverResult
}

// connectPgconn connects pgx's pgconn, with its real SCRAM, md5 and
// cleartext client code, to serveSession over an in-memory pipe.
func connectPgconn(t *testing.T, a *Authenticator, user, password string, peer net.Addr) connectResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	cfg, err := pgconn.ParseConfig("postgres://127.0.0.1:5432/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.User = user
	cfg.Password = password
	results := make(chan serverResult, 1)
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		client, server := net.Pipe()
		go func() { results <- serveSession(ctx, a, server, peer) }()
		return client, nil
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err == nil {
		if conn.PID() != 4242 {
			t.Errorf("PID = %d, want the BackendKeyData sent by the harness", conn.PID())
		}
		if err := conn.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	}
	select {
	case res := <-results:
		return connectResult{clientErr: err, server: res}
	case <-ctx.Done():
		t.Fatalf("server side did not finish: %v", ctx.Err())
		return connectResult{}
	}
}

// scriptedExchange feeds Authenticate prepared client bodies, for protocol
// corner cases no well-behaved client produces.
type scriptedExchange struct {
	bodies [][]byte
	sent   []pgproto3.BackendMessage
	// reply, when set, computes the next body from what was sent so far, for
	// conversations that depend on the server's nonce.
	reply func(sent []pgproto3.BackendMessage) ([]byte, error)
}

func (s *scriptedExchange) Send(msgs ...pgproto3.BackendMessage) error {
	s.sent = append(s.sent, msgs...)
	return nil
}

func (s *scriptedExchange) ReceivePassword(ctx context.Context) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(s.bodies) > 0 {
		b := s.bodies[0]
		s.bodies = s.bodies[1:]
		return b, nil
	}
	if s.reply != nil {
		return s.reply(s.sent)
	}
	return nil, errScriptDone
}

// errScriptDone is what a scriptedExchange returns once its bodies run out.
var errScriptDone = errors.New("scripted client has nothing more to say")
