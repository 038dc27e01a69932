package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/pgtest"
)

// get returns the status code and body of an HTTP GET.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestServeHealthEndpoints: /healthz and /readyz answer 200 while serving;
// once SIGTERM's drain begins /readyz answers 503 (so the load balancer
// stops sending clients) while /healthz stays 200 and an open transaction
// still commits.
func TestServeHealthEndpoints(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	srv, _, stop := startTestServer(t, testConfig(cluster.SuperURL("postgres")))
	base := "http://" + srv.metrics.Addr().String()
	if code, body := get(t, base+healthzPath); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("healthz: %d %q", code, body)
	}
	waitFor(t, func() bool { code, _ := get(t, base+readyzPath); return code == http.StatusOK })

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	conn, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, srv.tcp.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "BEGIN; SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	var body string
	waitFor(t, func() bool {
		var code int
		code, body = get(t, base+readyzPath)
		return code == http.StatusServiceUnavailable
	})
	if !strings.Contains(body, "draining") {
		t.Errorf("readyz while draining says %q", body)
	}
	if code, _ := get(t, base+healthzPath); code != http.StatusOK {
		t.Errorf("healthz while draining: %d, want 200", code)
	}
	if _, err := conn.Exec(ctx, "SELECT 2; COMMIT").ReadAll(); err != nil {
		t.Errorf("transaction open at shutdown: %v", err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// TestReadyzBackendUnreachable: a backend address that refuses
// connections makes /readyz 503 with the address in the reason; with a
// second backend that accepts, the replica is ready.
func TestReadyzBackendUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	h, err := newHealth([]string{"postgres://u@" + addr + "/db"})
	if err != nil {
		t.Fatal(err)
	}
	h.serving.Store(true)
	mux := http.NewServeMux()
	h.register(mux)
	srv := &http.Server{Handler: mux}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(hl) }()
	defer srv.Close()
	code, body := get(t, "http://"+hl.Addr().String()+readyzPath)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, addr) {
		t.Fatalf("readyz with the backend down: %d %q", code, body)
	}
	if code, _ := get(t, "http://"+hl.Addr().String()+healthzPath); code != http.StatusOK {
		t.Fatalf("healthz with the backend down: %d, want 200", code)
	}
	// One reachable backend among several is enough.
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	h2, err := newHealth([]string{"postgres://u@" + addr + "/db", "postgres://u@" + up.Addr().String() + "/other"})
	if err != nil {
		t.Fatal(err)
	}
	h2.serving.Store(true)
	if err := h2.ready(context.Background()); err != nil {
		t.Errorf("one backend of two reachable: %v", err)
	}
	if _, err := newHealth([]string{"postgres://u@[::1/x"}); err == nil {
		t.Fatal("a malformed backend URL was accepted")
	}
}

// writeCert writes a self-signed certificate and key for 127.0.0.1 into dir
// (connect-bench's writeBenchCert).
func writeCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, err := writeBenchCert(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// notifyingCache is a TLS client session cache that reports each ticket
// stored, so a test waits for the ticket instead of sleeping.
type notifyingCache struct {
	tls.ClientSessionCache
	put chan struct{}
}

func (c *notifyingCache) Put(key string, cs *tls.ClientSessionState) {
	c.ClientSessionCache.Put(key, cs)
	if cs != nil {
		select {
		case c.put <- struct{}{}:
		default:
		}
	}
}

// awaitTicket waits until the cache stored a ticket.
func awaitTicket(t *testing.T, c *notifyingCache) {
	t.Helper()
	select {
	case <-c.put:
	case <-time.After(testTimeout):
		t.Fatal("no session ticket arrived")
	}
}

// quicResumes dials s over QUIC with a plain quic-go client (which exposes
// DidResume) on cache, and reports whether the handshake resumed; with
// wait it keeps the connection open until the ticket, which follows the
// handshake, arrived.
func quicResumes(t *testing.T, ctx context.Context, s *server, cache *notifyingCache, wait bool) bool {
	t.Helper()
	c, err := quic.DialAddr(ctx, s.quic.Addr().String(), &tls.Config{
		InsecureSkipVerify: true, ServerName: "127.0.0.1", NextProtos: []string{config.DefaultALPN},
		ClientSessionCache: cache,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseWithError(0, "")
	if wait {
		awaitTicket(t, cache)
	}
	return c.ConnectionState().TLS.DidResume
}

// TestSharedSessionTicketKeys: two replicas with the same certificate and
// --tls-session-ticket-keys-file resume each other's TLS sessions, over
// TCP and over QUIC; with their own keys they do not.
func TestSharedSessionTicketKeys(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	dir := t.TempDir()
	certFile, keyFile := writeCert(t, dir)
	keysFile := filepath.Join(dir, "ticket-keys")
	if err := os.WriteFile(keysFile, []byte("# newest first\n"+strings.Repeat("a", 64)+"\n\n"+strings.Repeat("b", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		shared bool
	}{{"shared keys", true}, {"own keys", false}} {
		t.Run(tc.name, func(t *testing.T) {
			start := func() *server {
				cfg := testConfig(cluster.SuperURL("postgres"))
				cfg.TLSCert, cfg.TLSKey, cfg.MetricsListen = certFile, keyFile, ""
				if tc.shared {
					cfg.TLSSessionTicketKeysFile = keysFile
				}
				srv, _, _ := startTestServer(t, cfg)
				return srv
			}
			a, b := start(), start()
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()

			// TCP: pgconn with sslmode=require and a session cache.
			cache := &notifyingCache{tls.NewLRUClientSessionCache(4), make(chan struct{}, 1)}
			tcpConn := func(s *server) bool {
				pc, err := pgconn.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=require", cluster.SuperUser, cluster.SuperPassword, s.tcp.Addr()))
				if err != nil {
					t.Fatal(err)
				}
				pc.TLSConfig.ClientSessionCache = cache
				pc.TLSConfig.ServerName = "127.0.0.1" // one cache key for both replicas
				pc.Fallbacks = nil
				c, err := pgconn.ConnectConfig(ctx, pc)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close(ctx)
				if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
					t.Fatal(err)
				}
				return c.Conn().(*tls.Conn).ConnectionState().DidResume
			}
			tcpConn(a)
			awaitTicket(t, cache)
			if got := tcpConn(b); got != tc.shared {
				t.Errorf("TCP: resumed on the other replica = %v, want %v", got, tc.shared)
			}

			// QUIC: a plain quic-go client, which exposes DidResume.
			qcache := &notifyingCache{tls.NewLRUClientSessionCache(4), make(chan struct{}, 1)}
			quicResumes(t, ctx, a, qcache, true)
			if got := quicResumes(t, ctx, b, qcache, false); got != tc.shared {
				t.Errorf("QUIC: resumed on the other replica = %v, want %v", got, tc.shared)
			}
		})
	}
}

// TestKeyFiles: the key files' formats and their errors.
func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	long := strings.Repeat("0123456789abcdef", 4)
	keys, err := loadTicketKeys(write("tickets", "# comment\n"+long+"\n  \n"+long+"x\n"))
	if err != nil || len(keys) != 2 || keys[0] == keys[1] {
		t.Fatalf("two ticket keys: %v %v", keys, err)
	}
	if _, err := loadTicketKeys(write("short", long+"\nshort\n")); !errors.Is(err, errShortSecret) || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("short ticket key: %v", err)
	}
	if _, err := loadTicketKeys(write("empty", "# nothing\n")); err == nil {
		t.Error("a ticket keys file without keys was accepted")
	}
	if _, err := loadTicketKeys(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	k1, err := loadResetKey(write("reset1", long+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	k2, err := loadResetKey(write("reset2", long))
	if err != nil || *k1 != *k2 {
		t.Errorf("a trailing newline changed the reset key: %v", err)
	}
	if _, err := loadResetKey(write("reset-short", "tooshort\n")); !errors.Is(err, errShortSecret) {
		t.Errorf("short reset key: %v", err)
	}
}

// TestServeKeyFlags: the two flags reach the configuration, and a bad key
// file stops the start with its reason.
func TestServeKeyFlags(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writeCert(t, dir)
	cfg, err := parseServeFlags([]string{"--backend", "postgres://u@127.0.0.1:1/db", "--tls-cert", certFile, "--tls-key", keyFile,
		"--tls-session-ticket-keys-file", "/k/tickets", "--quic-stateless-reset-key-file", "/k/reset"}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLSSessionTicketKeysFile != "/k/tickets" || cfg.QUICStatelessResetKeyFile != "/k/reset" {
		t.Fatalf("flags not applied: %q %q", cfg.TLSSessionTicketKeysFile, cfg.QUICStatelessResetKeyFile)
	}
	if _, err := parseServeFlags([]string{"--backend", "postgres://u@127.0.0.1:1/db", "--tls-session-ticket-keys-file", "/k/tickets"}, io.Discard, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "tls_session_ticket_keys_file: needs tls_cert") {
		t.Errorf("ticket keys without a certificate: %v", err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.TLSSessionTicketKeysFile = ""
	cfg.QUICStatelessResetKeyFile = short
	cfg.TCPListen, cfg.QUICListen, cfg.MetricsListen = "127.0.0.1:0", "127.0.0.1:0", ""
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := startServer(ctx, cfg, slog.New(slog.DiscardHandler)); !errors.Is(err, errShortSecret) {
		t.Errorf("start with a short reset key: %v", err)
	}
}
