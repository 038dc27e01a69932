package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/quicclient"
)

// startEdge runs the edge subcommand's wiring until the test ends and
// returns its listen address and logs.
func startEdge(t *testing.T, ec edgeConfig) (string, *lockedBuffer) {
	t.Helper()
	addr, logs, _ := startStoppableEdge(t, ec)
	return addr, logs
}

// startStoppableEdge runs the edge subcommand's wiring until stop is
// called or the test ends, and returns its listen address and logs.
func startStoppableEdge(t *testing.T, ec edgeConfig) (string, *lockedBuffer, func()) {
	t.Helper()
	logs := &lockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runEdgeWith(ctx, ec, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("edge: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	var addr string
	waitFor(t, func() bool {
		_, after, ok := strings.Cut(logs.String(), `msg="pgquic edge ready" listen=`)
		addr, _, _ = strings.Cut(after, " ")
		return ok
	})
	return addr, logs, stop
}

// rawSession starts a session through a trust edge with pgproto3 and
// returns the frontend after its ReadyForQuery, with the messages of the
// greeting.
func rawSession(ctx context.Context, t *testing.T, addr, user string) (*pgproto3.Frontend, net.Conn, []pgproto3.BackendMessage) {
	t.Helper()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	fe := pgproto3.NewFrontend(c, c)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters: map[string]string{"user": user, "database": "postgres", "application_name": "raw"}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var greeting []pgproto3.BackendMessage
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *pgproto3.ParameterStatus:
			cp := *m
			greeting = append(greeting, &cp)
		case *pgproto3.ErrorResponse:
			t.Fatalf("startup refused: %s %s", m.Code, m.Message)
		case *pgproto3.ReadyForQuery:
			return fe, c, greeting
		}
	}
}

// TestEdgeLocalStartup runs `pgquic edge --local-auth ... --local-startup`
// against serve with --edge-trust over real QUIC and PostgreSQL: a wrong
// local password fails at the edge (28P01) with nothing sent to the
// pooler; a session whose greeting is cached starts locally and gets the
// pooler's changed parameters (ALTER ROLE ... SET in between) as
// ParameterStatus before its first result; a user the pooler no longer
// trusts the edge for gets 28000 as the error of its first request, then
// the session ends; a cancel with the edge's key reaches the right query.
func TestEdgeLocalStartup(t *testing.T) {
	edgeCert, edgeKey, edgeFP := clientCert(t)
	srv, _, cluster, writeTrust := edgeTrustServer(t, func(super string) string {
		return fmt.Sprintf("%s %s,mallory postgres\n", edgeFP, super)
	})
	super, pw := cluster.SuperUser, cluster.SuperPassword
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cfg := *srv.live.cfg.Load()

	users := filepath.Join(t.TempDir(), "edge-users.txt")
	if err := os.WriteFile(users, fmt.Appendf(nil, "%q %q\n\"mallory\" \"mallory-pw\"\n", super, pw), 0o600); err != nil {
		t.Fatal(err)
	}
	base := edgeConfig{listen: "127.0.0.1:0", pooler: srv.quic.Addr().String(), pin: srv.quic.Fingerprint(),
		conns: 1, streams: 100, grace: 5 * time.Second, cert: edgeCert, key: edgeKey, localStartup: true}
	scram := base
	scram.localAuth, scram.authFile = "scram-sha-256", users
	scramAddr, scramLogs := startEdge(t, scram)
	trust := base
	trust.localAuth = "trust"
	trustAddr, _ := startEdge(t, trust)
	if !strings.Contains(scramLogs.String(), "cert_fingerprint="+edgeFP) {
		t.Errorf("the edge does not log its certificate's fingerprint:\n%s", scramLogs.String())
	}

	connect := func(user, password string) (*pgconn.PgConn, error) {
		return pgconn.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable&application_name=t", user, password, scramAddr))
	}
	streams := func() float64 { return sum(scrape(t, srv), "pgquic_quic_streams_total") }

	// A wrong local password: 28P01 from the edge, no stream to the pooler.
	before := streams()
	if _, err := connect(super, "wrong"); sqlState(err) != "28P01" {
		t.Fatalf("wrong local password: %v, want 28P01", err)
	}
	if _, err := connect("nobody", pw); sqlState(err) != "28P01" {
		t.Fatalf("unknown local user: %v, want 28P01", err)
	}
	if got := streams(); got != before {
		t.Errorf("the pooler accepted %v streams for sessions refused at the edge", got-before)
	}

	// First session: the ordinary path; the second starts locally.
	for i := range 2 {
		c, err := connect(super, pw)
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		res, err := c.Exec(ctx, "SELECT current_user").ReadAll()
		if err != nil || string(res[0].Rows[0][0]) != super {
			t.Fatalf("session %d: current_user: %v %v", i, res, err)
		}
		c.Close(ctx)
	}

	// A cancel with the edge's key reaches the session's query.
	c, err := connect(super, pw)
	if err != nil {
		t.Fatal(err)
	}
	other, err := connect(super, pw)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := c.Exec(ctx, "SELECT pg_sleep(60)").ReadAll(); errc <- err }()
	waitFor(t, func() bool {
		res, err := other.Exec(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)' AND state = 'active'").ReadAll()
		return err == nil && string(res[0].Rows[0][0]) == "1"
	})
	if err := c.CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; sqlState(err) != "57014" {
		t.Errorf("cancelled query: %v, want 57014", err)
	}
	if res, err := other.Exec(ctx, "SELECT 7").ReadAll(); err != nil || string(res[0].Rows[0][0]) != "7" {
		t.Errorf("the other session after the cancel: %v %v", res, err)
	}
	c.Close(ctx)
	other.Close(ctx)

	// mallory's greeting is cached; then the pooler stops trusting the
	// edge for her: the local startup succeeds, her first request gets
	// the pooler's 28000, and the session is over.
	m, err := connect("mallory", "mallory-pw")
	if err != nil {
		t.Fatalf("mallory through the edge: %v", err)
	}
	m.Close(ctx)
	writeTrust(fmt.Sprintf("%s %s postgres\n", edgeFP, super))
	if _, _, err := srv.Reload(ctx, &cfg); err != nil {
		t.Fatal(err)
	}
	m, err = connect("mallory", "mallory-pw")
	if err != nil {
		t.Fatalf("mallory's local startup: %v", err)
	}
	_, err = m.Exec(ctx, "SELECT 1").ReadAll()
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "28000" || pe.Severity != "FATAL" {
		t.Errorf("mallory's first request: %v, want FATAL 28000", err)
	}
	waitFor(t, func() bool { return m.IsClosed() })

	// ALTER ROLE ... SET between the cached greeting and the pooler's reply.
	_, _, greeting := rawSession(ctx, t, trustAddr, super) // ordinary path: learns the set
	if tz := paramValue(greeting, "TimeZone"); tz == "Asia/Tokyo" {
		t.Fatalf("TimeZone already %q", tz)
	}
	if err := cluster.Exec(ctx, fmt.Sprintf("ALTER ROLE %q SET TimeZone = 'Asia/Tokyo'", super)); err != nil {
		t.Fatal(err)
	}
	// New server pools: the next greeting comes from a new server login.
	bigger := cfg
	bigger.PoolSize++
	if _, _, err := srv.Reload(ctx, &bigger); err != nil {
		t.Fatal(err)
	}
	fe, _, greeting := rawSession(ctx, t, trustAddr, super)
	if tz := paramValue(greeting, "TimeZone"); tz == "Asia/Tokyo" {
		t.Fatalf("the local greeting already says %q: it was not answered from the cache", tz)
	}
	fe.Send(&pgproto3.Query{String: "SELECT current_setting('TimeZone')"})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	sawTZ := false
	for done := false; !done; {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ParameterStatus:
			if msg.Name == "TimeZone" && msg.Value == "Asia/Tokyo" {
				sawTZ = true
			}
		case *pgproto3.RowDescription:
			if !sawTZ {
				t.Error("the first result came before the changed TimeZone")
			}
		case *pgproto3.DataRow:
			if string(msg.Values[0]) != "Asia/Tokyo" {
				t.Errorf("current_setting = %q", msg.Values[0])
			}
		case *pgproto3.ErrorResponse:
			t.Fatalf("query: %s %s", msg.Code, msg.Message)
		case *pgproto3.ReadyForQuery:
			done = true
		}
	}
	if !sawTZ {
		t.Error("the changed TimeZone never reached the client")
	}
}

// paramValue returns the value of a ParameterStatus in msgs.
func paramValue(msgs []pgproto3.BackendMessage, name string) string {
	for _, m := range msgs {
		if p, ok := m.(*pgproto3.ParameterStatus); ok && p.Name == name {
			return p.Value
		}
	}
	return ""
}

// TestQuicclientLocalStartup: quicclient's DialFunc with LocalStartup and
// a trusted certificate, over real QUIC to serve and PostgreSQL: the first
// session takes the ordinary path, the next starts without a stream (one
// is opened when the first request goes out), queries run, and a cancel
// with the key pgx was handed reaches the query.
func TestQuicclientLocalStartup(t *testing.T) {
	edgeCert, edgeKey, edgeFP := clientCert(t)
	srv, _, cluster, _ := edgeTrustServer(t, func(super string) string {
		return fmt.Sprintf("%s %s postgres\n", edgeFP, super)
	})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: srv.quic.Addr().String(), Conns: 1,
		PinSHA256: srv.quic.Fingerprint(), CertFile: edgeCert, KeyFile: edgeKey, LocalStartup: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pcfg := quictest.PgConfigURL(t, d, fmt.Sprintf("postgres://%s@quic/postgres?sslmode=disable", cluster.SuperUser))
	for i := range 2 {
		// The previous session's stream closes behind its connection.
		waitFor(t, func() bool { return d.Stats().Streams == 0 })
		c, err := pgconn.ConnectConfig(ctx, pcfg)
		if err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
		if i == 1 {
			if n := d.Stats().Streams; n != 0 {
				t.Errorf("a local startup opened %d streams before its first request", n)
			}
		}
		res, err := c.Exec(ctx, "SELECT current_user").ReadAll()
		if err != nil || string(res[0].Rows[0][0]) != cluster.SuperUser {
			t.Fatalf("session %d: %v %v", i, res, err)
		}
		if i == 1 {
			errc := make(chan error, 1)
			go func() { _, err := c.Exec(ctx, "SELECT pg_sleep(60)").ReadAll(); errc <- err }()
			waitFor(t, func() bool {
				var n string
				q, err := pgconn.ConnectConfig(ctx, pcfg)
				if err == nil {
					if res, err := q.Exec(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)' AND state = 'active'").ReadAll(); err == nil {
						n = string(res[0].Rows[0][0])
					}
					q.Close(ctx)
				}
				return n == "1"
			})
			if err := c.CancelRequest(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; sqlState(err) != "57014" {
				t.Errorf("cancelled query: %v, want 57014", err)
			}
		}
		c.Close(ctx)
	}
}

// TestEdgeLocalFlags: the local-startup flags that would let a client in
// without authentication, or make no sense, exit 2 naming the flag.
func TestEdgeLocalFlags(t *testing.T) {
	base := []string{"--pooler", "127.0.0.1:1", "--insecure"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cert", "c", "--key", "k"}, "--cert needs --local-auth"},
		{[]string{"--cert", "c"}, "--cert and --key go together"},
		{[]string{"--local-startup"}, "--local-startup needs --local-auth"},
		{[]string{"--local-auth", "trust", "--listen", "0.0.0.0:5433"}, "--local-auth trust"},
		{[]string{"--local-auth", "scram-sha-256"}, "--local-auth scram-sha-256 needs --auth-file"},
		{[]string{"--local-auth", "password", "--auth-file", "f"}, `--local-auth "password"`},
		{[]string{"--auth-file", "f"}, "--auth-file needs --local-auth"},
	} {
		var stdout, stderr strings.Builder
		if code := runEdge(context.Background(), append(base, tc.args...), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("edge %v: exit %d, stderr %q, want 2 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
	if _, err := parseEdgeFlags(append(base, "--local-auth", "trust", "--listen", "localhost:5433", "--local-startup"), io.Discard, io.Discard); err != nil {
		t.Errorf("trust on localhost: %v", err)
	}
}

// TestEdgeSessionCacheRestart: an edge with --session-cache learns the
// pooler's TLS ticket and a greeting; a new edge on the same file (a
// restarted process) resumes its TLS session and answers its very first
// session's startup locally. The file is mode 0600.
func TestEdgeSessionCacheRestart(t *testing.T) {
	edgeCert, edgeKey, edgeFP := clientCert(t)
	srv, _, cluster, _ := edgeTrustServer(t, func(super string) string {
		return fmt.Sprintf("%s %s postgres\n", edgeFP, super)
	})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cache := filepath.Join(t.TempDir(), "edge-session-cache")
	ec := edgeConfig{listen: "127.0.0.1:0", pooler: srv.quic.Addr().String(), pin: srv.quic.Fingerprint(),
		conns: 1, streams: 100, grace: 5 * time.Second, cert: edgeCert, key: edgeKey,
		localAuth: "trust", localStartup: true, sessionCache: cache}
	session := func(addr string) {
		c, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable&application_name=t", cluster.SuperUser, addr))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if res, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil || string(res[0].Rows[0][0]) != "1" {
			t.Fatalf("SELECT 1: %v %v", res, err)
		}
	}

	addr, logs, stop := startStoppableEdge(t, ec)
	session(addr)
	stop() // Close writes what the cache still had pending
	if strings.Contains(logs.String(), "resumed=true") || strings.Contains(logs.String(), "startup answered locally") {
		t.Fatalf("the first edge resumed or answered locally:\n%s", logs.String())
	}
	if fi, err := os.Stat(cache); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("cache file: %v %v", fi, err)
	}

	addr, logs, _ = startStoppableEdge(t, ec)
	session(addr)
	for _, want := range []string{"resumed=true", "startup answered locally"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the restarted edge's logs lack %q:\n%s", want, logs.String())
		}
	}
}
