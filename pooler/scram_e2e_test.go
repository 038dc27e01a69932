package pooler_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/pooler"
)

// TestSCRAMEndToEnd: clients authenticate to the pooler with SCRAM-SHA-256
// against a userlist verifier, and the pooler itself logs in to a server
// that requires SCRAM.
func TestSCRAMEndToEnd(t *testing.T) {
	c := pgtest.New(t, pgtest.Options{Auth: pgtest.AuthSCRAM, Users: []pgtest.User{{Name: "app", Password: "server-secret"}}})
	verifier, err := pgauth.SCRAMVerifier("client-secret", 0)
	if err != nil {
		t.Fatal(err)
	}
	users, err := pgauth.ParseUserlist(strings.NewReader(`"app" "` + verifier + `"` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	authn, err := pgauth.New(pgauth.Config{Method: pgauth.MethodSCRAM, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mgr, err := backend.NewManager(ctx, backend.ManagerConfig{
		Routes: []backend.Route{{Database: "appdb", PoolConfig: backend.PoolConfig{ConnString: c.URL("app", "server-secret", "postgres"), PoolSize: 2}}},
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	p, err := pooler.New(pooler.Config{Auth: authn}, mgr, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = p.Serve(ctx, conn, pooler.Peer{Addr: conn.RemoteAddr(), Transport: "tcp"}) }()
		}
	}()
	defer func() {
		sctx, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		_ = p.Shutdown(sctx)
	}()

	url := func(pw string) string {
		return "postgres://app:" + pw + "@" + ln.Addr().String() + "/appdb?sslmode=disable"
	}
	conn, err := pgconn.Connect(ctx, url("client-secret"))
	if err != nil {
		t.Fatalf("right password refused: %v", err)
	}
	res := conn.ExecParams(ctx, "select current_user", nil, nil, nil, nil).Read()
	if res.Err != nil || len(res.Rows) != 1 || string(res.Rows[0][0]) != "app" {
		t.Fatalf("query as app: %v %q", res.Err, res.Rows)
	}
	_ = conn.Close(ctx)

	_, err = pgconn.Connect(ctx, url("wrong"))
	if code := pgCode(err); code != "28P01" {
		t.Fatalf("wrong password: got %v (code %q), want 28P01", err, code)
	}
	_, err = pgconn.Connect(ctx, "postgres://nobody:x@"+ln.Addr().String()+"/appdb?sslmode=disable")
	if code := pgCode(err); code != "28P01" {
		t.Fatalf("unknown user: got %v (code %q), want 28P01", err, code)
	}
}
