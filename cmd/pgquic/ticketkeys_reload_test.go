package main

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/pgtest"
)

// TestReloadRotatesTicketKeys: replica B's keys file differs from A's, so
// a ticket from A does not resume on B; after B's file gets A's key as a
// second line and B reloads, it does (B opens tickets sealed with any
// key in its file), without a restart. A reload dropping the file waits
// for a restart, and a broken file is rejected.
func TestReloadRotatesTicketKeys(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	dir := t.TempDir()
	certFile, keyFile := writeCert(t, dir)
	keysA, keysB := filepath.Join(dir, "keys-a"), filepath.Join(dir, "keys-b")
	write := func(path string, lines ...string) {
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	secretA, secretB := strings.Repeat("a", 64), strings.Repeat("b", 64)
	write(keysA, secretA)
	write(keysB, secretB)
	start := func(keys string) (*server, *config.Config) {
		cfg := testConfig(cluster.SuperURL("postgres"))
		cfg.TLSCert, cfg.TLSKey, cfg.MetricsListen, cfg.TLSSessionTicketKeysFile = certFile, keyFile, "", keys
		srv, _, _ := startTestServer(t, cfg)
		return srv, cfg
	}
	a, _ := start(keysA)
	b, cfgB := start(keysB)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	cache := &notifyingCache{tls.NewLRUClientSessionCache(4), make(chan struct{}, 1)}
	resumes := func(s *server, wait bool) bool { return quicResumes(t, ctx, s, cache, wait) }
	resumes(a, true)
	if resumes(b, false) {
		t.Fatal("B resumed A's ticket with its own keys")
	}
	resumes(a, true) // a fresh ticket from A: the failed attempt may have replaced it

	write(keysB, secretB, secretA) // B keeps sealing with its key and now opens A's
	next := *cfgB
	if _, _, err := b.Reload(ctx, &next); err != nil {
		t.Fatal(err)
	}
	if !resumes(b, false) {
		t.Error("after the reload B did not resume A's ticket")
	}

	write(keysB, "short")
	if _, _, err := b.Reload(ctx, &next); err == nil || !strings.Contains(err.Error(), "shorter than") {
		t.Errorf("a broken keys file: %v", err)
	}
	none := *cfgB
	none.TLSSessionTicketKeysFile = ""
	applied, restart, err := b.Reload(ctx, &none)
	if err != nil || slices.Contains(applied, "tls_session_ticket_keys_file") || !slices.Contains(restart, "tls_session_ticket_keys_file") {
		t.Errorf("dropping the file: applied %v, restart %v, %v", applied, restart, err)
	}
}
