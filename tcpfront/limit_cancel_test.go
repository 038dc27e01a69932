package tcpfront

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/pgtest"
)

// cancelSeen is a CancelRequest as the handler received it.
type cancelSeen struct {
	pid    uint32
	key    []byte
	secure bool
}

// TestCancelAtConnectionLimit checks that a CancelRequest beyond MaxConns is
// served: the handler receives the request intact (in the clear, and inside
// TLS after an SSLRequest), and the client sees its connection closed without
// an answer, as from PostgreSQL. A session beyond the limit still gets 53300,
// under TLS too (sslmode=require).
func TestCancelAtConnectionLimit(t *testing.T) {
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	cancels := make(chan cancelSeen, 4)
	h := handlerFunc(func(ctx context.Context, rwc io.ReadWriteCloser, peer front.Peer) error {
		defer rwc.Close()
		msg, err := pgproto3.NewBackend(rwc, rwc).ReceiveStartupMessage()
		if err != nil {
			return err
		}
		if cr, ok := msg.(*pgproto3.CancelRequest); ok {
			cancels <- cancelSeen{pid: cr.ProcessID, key: bytes.Clone(cr.SecretKey), secure: peer.Secure}
			return nil
		}
		started <- struct{}{}
		select { // hold the only slot
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	s := startServer(t, Config{MaxConns: 1, TLSConfig: serverTLS(t)}, h, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	holder, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	startup, _ := (&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": "u"}}).Encode(nil)
	if _, err := holder.Write(startup); err != nil {
		t.Fatal(err)
	}
	<-started
	defer close(release)

	cancelReq := binary.BigEndian.AppendUint32(nil, 16)
	cancelReq = binary.BigEndian.AppendUint32(cancelReq, pgproto.CancelRequestCode)
	cancelReq = append(cancelReq, 0, 0, 0, 7, 1, 2, 3, 4)
	for _, useTLS := range []bool{false, true} {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(testTimeout))
		var stream net.Conn = c
		if useTLS {
			ssl := binary.BigEndian.AppendUint32(nil, 8)
			ssl = binary.BigEndian.AppendUint32(ssl, pgproto.SSLRequestCode)
			if _, err := c.Write(ssl); err != nil {
				t.Fatal(err)
			}
			var resp [1]byte
			if _, err := io.ReadFull(c, resp[:]); err != nil || resp[0] != 'S' {
				t.Fatalf("SSLRequest at the limit: answer %q, %v; want 'S'", resp[0], err)
			}
			tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // test certificate
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			stream = tc
		}
		if _, err := stream.Write(cancelReq); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-cancels:
			if got.pid != 7 || !bytes.Equal(got.key, []byte{1, 2, 3, 4}) || got.secure != useTLS {
				t.Fatalf("tls=%v: handler got %+v", useTLS, got)
			}
		case <-ctx.Done():
			t.Fatalf("tls=%v: the CancelRequest beyond the limit never reached the handler", useTLS)
		}
		if n, err := stream.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
			t.Errorf("tls=%v: after the cancel: read %d bytes, err %v; want EOF", useTLS, n, err)
		}
		_ = c.Close()
	}
	if got := value(s.m.cancelsAtLimit); got != 2 {
		t.Errorf("cancels_at_limit_total = %v, want 2", got)
	}

	// A session beyond the limit is still refused, in the clear and under TLS.
	for _, mode := range []string{"disable", "require"} {
		_, err := pgconn.Connect(ctx, connString(s, mode))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "53300" {
			t.Fatalf("sslmode=%s: Connect error = %v, want PgError 53300", mode, err)
		}
	}
	if got := value(s.m.refused); got != 2 {
		t.Errorf("refused_total = %v, want 2", got)
	}
}

// TestCancelAtLimitReachesServer: with room for one TCP connection, the
// client holding it runs pg_sleep(10) and pgx sends a CancelRequest when its
// context expires. The CancelRequest arrives beyond the limit and must still
// reach PostgreSQL, so the query ends with 57014 at once. Before the fix the
// front dropped it and the query ran to completion.
func TestCancelAtLimitReachesServer(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := pgStack(t, cluster, Config{MaxConns: 1})
	cfg, err := pgx.ParseConfig(pgURL(srv))
	if err != nil {
		t.Fatal(err)
	}
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 20 * time.Second}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	qctx, qcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer qcancel()
	start := time.Now()
	_, err = conn.Exec(qctx, "SELECT pg_sleep(10)")
	took := time.Since(start)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" {
		t.Fatalf("query at the connection limit after %s: %v, want 57014 (cancelled)", took, err)
	}
	if took > 5*time.Second {
		t.Fatalf("cancel took %s", took)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT 7").Scan(&n); err != nil || n != 7 {
		t.Fatalf("after the cancel: %d, %v", n, err)
	}
}
