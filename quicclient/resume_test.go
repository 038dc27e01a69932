package quicclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/internal/quictest/quicserver"
	"github.com/pgquic/pgquic/quicfront"
)

// resumedSession dials one session with a fresh Dialer on cache (a new
// process, as far as TLS is concerned), runs a query, waits until the
// cache holds a session (the ticket arrives after the handshake) and
// reports whether the handshake resumed.
func resumedSession(t *testing.T, cfg DialerConfig) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := NewDialer(cfg, quictest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	c := quictest.Connect(t, ctx, d)
	if got, err := quictest.QueryInt(ctx, c, 7); err != nil || got != "7" {
		t.Fatalf("query: %q %v", got, err)
	}
	resumed := d.Stats().Resumed == 1
	if d.cache != nil {
		quictest.Eventually(t, 10*time.Second, "a session ticket in the cache", func() bool { return d.cache.Len() > 0 })
	}
	_ = c.Close(ctx)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	return resumed
}

// TestSessionCacheFileResumes: a Dialer with SessionCacheFile stores the
// pooler's ticket in the file (mode 0600), and a new Dialer on the same
// file, as a new process would be, resumes the TLS session; without the
// file it does not.
func TestSessionCacheFileResumes(t *testing.T) {
	s, _ := quicserver.Start(t, quicfront.ServerConfig{}, quictest.NewScriptedPG())
	file := filepath.Join(t.TempDir(), "tickets")
	cfg := DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 1, SessionCacheFile: file}
	if resumedSession(t, cfg) {
		t.Fatal("the first handshake resumed")
	}
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("cache file mode %v, want 0600", fi.Mode().Perm())
	}
	if !resumedSession(t, cfg) {
		t.Error("a new Dialer on the cache file did not resume")
	}
	cfg.SessionCacheFile = ""
	if resumedSession(t, cfg) {
		t.Error("a Dialer without a cache resumed")
	}
}

// TestSessionCacheAcrossReplicas: two servers with one certificate and
// one set of ticket keys (what serve's --tls-session-ticket-keys-file
// gives replicas) resume each other's sessions through a cache file.
func TestSessionCacheAcrossReplicas(t *testing.T) {
	cert, err := quicfront.GenerateSelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}}
	tc.SetSessionTicketKeys([][32]byte{{1, 2, 3}})
	a, _ := quicserver.Start(t, quicfront.ServerConfig{TLSConfig: tc.Clone()}, quictest.NewScriptedPG())
	b, _ := quicserver.Start(t, quicfront.ServerConfig{TLSConfig: tc.Clone()}, quictest.NewScriptedPG())
	file := filepath.Join(t.TempDir(), "tickets")
	pin := Fingerprint(cert.Certificate[0])
	// One server name for both: the cache is keyed by it, as it would be
	// for replicas behind one address.
	base := &tls.Config{ServerName: "127.0.0.1"}
	if resumedSession(t, DialerConfig{Addr: a.Addr().String(), PinSHA256: pin, Conns: 1, SessionCacheFile: file, TLSConfig: base}) {
		t.Fatal("the first handshake resumed")
	}
	if !resumedSession(t, DialerConfig{Addr: b.Addr().String(), PinSHA256: pin, Conns: 1, SessionCacheFile: file, TLSConfig: base}) {
		t.Error("the other replica did not resume the session")
	}
}

// TestSessionCacheFileBadInput: a corrupt, oversized or foreign file is
// ignored with a warning and replaced by the next ticket; a missing
// directory is an error; the cache stays bounded.
func TestSessionCacheFileBadInput(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string][]byte{
		"garbage":  []byte("not json {"),
		"version":  []byte(`{"version":99,"sessions":[]}`),
		"state":    []byte(`{"version":1,"sessions":[{"key":"x","stored":"` + time.Now().Format(time.RFC3339) + `","identity":"AAAA","state":"AAAA"}]}`),
		"oversize": bytes.Repeat([]byte(" "), maxSessionCacheFile+1),
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		var logs strings.Builder
		c, err := OpenSessionCache(path, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if c.Len() != 0 || !strings.Contains(logs.String(), "session cache file ignored") {
			t.Errorf("%s: %d sessions, log %q", name, c.Len(), logs.String())
		}
	}
	// On Unix a file others may write is refused, however well formed.
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte(`{"version":1,"sessions":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o622); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	if _, err := OpenSessionCache(open, slog.New(slog.NewTextHandler(&logs, nil))); runtime.GOOS != "windows" && (err != nil ||
		!strings.Contains(logs.String(), "lets other users read or write it")) {
		t.Errorf("a mode 0622 file: %v, log %q", err, logs.String())
	}
	if _, err := OpenSessionCache(filepath.Join(dir, "no", "such", "dir"), nil); err == nil {
		t.Error("a cache in a missing directory was accepted")
	}
	if _, err := NewDialer(DialerConfig{Addr: "127.0.0.1:1", Insecure: true, SessionCache: NewSessionCache(), SessionCacheFile: "x"}, nil); err == nil {
		t.Error("SessionCache and SessionCacheFile together were accepted")
	}

	// Bounded: more servers than MaxCachedSessions keep the newest.
	s, _ := quicserver.Start(t, quicfront.ServerConfig{}, quictest.NewScriptedPG())
	path := filepath.Join(dir, "bounded")
	cfg := DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 1, SessionCacheFile: path}
	resumedSession(t, cfg)
	c, err := OpenSessionCache(path, nil)
	if err != nil || c.Len() != 1 {
		t.Fatalf("reopened cache: %d sessions, %v", c.Len(), err)
	}
	st, _ := c.Get("127.0.0.1")
	for i := range MaxCachedSessions + 5 {
		c.Put(strings.Repeat("k", i+1), st)
	}
	c.Flush()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var sf sessionFile
	if err := json.Unmarshal(b, &sf); err != nil || len(sf.Sessions) != MaxCachedSessions {
		t.Fatalf("file holds %d sessions (%v), want %d", len(sf.Sessions), err, MaxCachedSessions)
	}
	if _, ok := c.Get("127.0.0.1"); ok {
		t.Error("the oldest session was kept past the bound")
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".bounded.tmp*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}
