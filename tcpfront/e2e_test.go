package tcpfront

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
)

// TestVanishedClientFreesServerConn is the regression test for a TCP client
// that disappears while its query runs: with a pool of one server
// connection, a client runs pg_sleep(600) and its socket is closed (FIN) or
// reset (RST), in the clear or under TLS, outside or inside a transaction.
// Another client must get the server connection while the sleep still has
// minutes to run, and the server must be left with no running sleep, no open
// transaction and no trace of the vanished client's uncommitted insert.
// Before the pooler watched clients during queries, the second client waited
// for the whole sleep. How soon it gets the connection (a watch tick or two,
// then a cancel) depends on the machine's load and is only logged.
func TestVanishedClientFreesServerConn(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := cluster.Exec(ctx, "CREATE TABLE vanish (v int)"); err != nil {
		t.Fatal(err)
	}
	srv := pgStack(t, cluster, Config{TLSConfig: serverTLS(t)})

	direct, err := pgx.Connect(ctx, cluster.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	count := func(sql string) int {
		t.Helper()
		var n int
		if err := direct.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	const sleepQuery = "SELECT pg_sleep(600)"
	const sleeping = `SELECT count(*) FROM pg_stat_activity WHERE query = '` + sleepQuery + `' AND state = 'active'`
	const inTx = `SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()`

	for _, tc := range []struct {
		name         string
		tls, rst, tx bool
	}{
		{name: "close"},
		{name: "reset", rst: true},
		{name: "tls_close", tls: true},
		{name: "tls_reset", tls: true, rst: true},
		{name: "tx_close", tx: true},
		{name: "tx_reset_tls", tx: true, rst: true, tls: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other, err := pgx.Connect(ctx, pgURL(srv))
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close(context.Background())

			raw, fe := rawClient(t, srv.Addr().String(), tc.tls)
			if tc.tx {
				for _, q := range []string{"BEGIN", "INSERT INTO vanish VALUES (1)"} {
					if err := simpleQuery(fe, q); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
				}
			}
			fe.Send(&pgproto3.Query{String: sleepQuery})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool { return count(sleeping) == 1 })

			if tc.rst {
				_ = raw.SetLinger(0)
			}
			_ = raw.Close()
			start := time.Now()

			// Well before the sleep could end by itself.
			qctx, qcancel := context.WithTimeout(ctx, time.Minute)
			defer qcancel()
			var one int
			err = other.QueryRow(qctx, "SELECT 1").Scan(&one)
			waited := time.Since(start)
			if err != nil {
				t.Fatalf("second client's query after %s: %v (the vanished client still holds the only server connection)", waited, err)
			}
			waitFor(t, func() bool { return count(sleeping) == 0 && count(inTx) == 0 })
			if n := count("SELECT count(*) FROM vanish"); n != 0 {
				t.Fatalf("%d rows of the vanished client's transaction are visible", n)
			}
			t.Logf("server connection free %s after the client vanished", waited.Round(time.Millisecond))
		})
	}
}

// pgStack serves cluster through a pooler (pool of one server connection)
// behind a front configured by cfg, all torn down at the end of the test.
func pgStack(t *testing.T, cluster *pgtest.Cluster, cfg Config) *Server {
	t.Helper()
	mctx, mcancel := context.WithCancel(context.Background())
	mgr, err := backend.NewManager(mctx, backend.ManagerConfig{
		Routes:   []backend.Route{{Database: "*", PoolConfig: backend.PoolConfig{ConnString: cluster.SuperURL("postgres")}}},
		Defaults: backend.PoolConfig{PoolSize: 1, MinPool: 1},
	}, nil, nil)
	if err != nil {
		mcancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { mgr.Close(); mcancel() })
	p, err := pooler.New(pooler.Config{}, mgr, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, cfg, p, nil)
	t.Cleanup(func() { // runs before the front's Shutdown: drain the sessions first
		sctx, done := context.WithTimeout(context.Background(), 10*time.Second)
		defer done()
		_ = p.Shutdown(sctx)
	})
	return srv
}

// pgURL is a connection string for the cluster's superuser through srv.
func pgURL(srv *Server) string {
	return "postgres://postgres@" + srv.Addr().String() + "/postgres?sslmode=disable"
}

// rawClient logs in over a raw TCP connection (after an SSLRequest and a TLS
// handshake when useTLS), so the test controls how the socket ends. It
// returns the TCP connection and a frontend on the session's stream.
func rawClient(t *testing.T, addr string, useTLS bool) (*net.TCPConn, *pgproto3.Frontend) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	var stream io.ReadWriter = c
	if useTLS {
		var req [8]byte
		binary.BigEndian.PutUint32(req[0:4], 8)
		binary.BigEndian.PutUint32(req[4:8], pgproto.SSLRequestCode)
		if _, err := c.Write(req[:]); err != nil {
			t.Fatal(err)
		}
		var resp [1]byte
		if _, err := io.ReadFull(c, resp[:]); err != nil || resp[0] != 'S' {
			t.Fatalf("SSLRequest answer %q, %v", resp[0], err)
		}
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // test certificate
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		stream = tc
	}
	fe := pgproto3.NewFrontend(stream, stream)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": "postgres", "database": "postgres"}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := untilReady(fe); err != nil {
		t.Fatalf("login: %v", err)
	}
	_ = c.SetDeadline(time.Time{})
	return c.(*net.TCPConn), fe
}

// simpleQuery runs sql and reads up to ReadyForQuery.
func simpleQuery(fe *pgproto3.Frontend, sql string) error {
	fe.Send(&pgproto3.Query{String: sql})
	if err := fe.Flush(); err != nil {
		return err
	}
	return untilReady(fe)
}

func untilReady(fe *pgproto3.Frontend) error {
	var firstErr error
	for {
		msg, err := fe.Receive()
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			if firstErr == nil {
				firstErr = fmt.Errorf("server error %s: %s", m.Code, m.Message)
			}
		case *pgproto3.ReadyForQuery:
			return firstErr
		}
	}
}
