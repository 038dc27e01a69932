package quicclient

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/internal/quictest/quicserver"
	"github.com/pgquic/pgquic/quicfront"
)

// zeroRTTSession runs one session with a fresh ZeroRTT Dialer on cfg's
// cache and returns its Stats while the connection is live.
func zeroRTTSession(t *testing.T, cfg DialerConfig) DialerStats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg.ZeroRTT = true
	d, err := NewDialer(cfg, quictest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c := quictest.Connect(t, ctx, d)
	defer c.Close(ctx)
	for i := range 3 {
		if got, err := quictest.QueryInt(ctx, c, 40+i); err != nil || got != strconv.Itoa(40+i) {
			t.Fatalf("query %d: %q %v", i, got, err)
		}
	}
	quictest.Eventually(t, 10*time.Second, "a session ticket in the cache", func() bool { return d.cache.Len() > 0 })
	return d.Stats()
}

// TestZeroRTTAccepted: a second process with a ticket from a server that
// accepts 0-RTT has its first flight accepted; the first had no ticket.
func TestZeroRTTAccepted(t *testing.T) {
	s, _ := quicserver.Start(t, quicfront.ServerConfig{Allow0RTT: true}, quictest.NewScriptedPG())
	cfg := DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 1,
		SessionCacheFile: filepath.Join(t.TempDir(), "tickets")}
	if st := zeroRTTSession(t, cfg); st.ZeroRTT != 0 || st.Resumed != 0 {
		t.Fatalf("first process: %+v, want neither resumed nor 0-RTT", st)
	}
	if st := zeroRTTSession(t, cfg); st.ZeroRTT != 1 || st.Resumed != 1 {
		t.Fatalf("second process: %+v, want resumed with 0-RTT accepted", st)
	}
}

// TestZeroRTTRejected: a replica sharing the ticket keys but refusing
// 0-RTT drops the first flight of a client holding a ticket that allows
// it; the Dialer sends the session's bytes again in 1-RTT and the session
// runs as if nothing happened, its connection counted resumed and
// rejected, not 0-RTT.
func TestZeroRTTRejected(t *testing.T) {
	cert, err := quicfront.GenerateSelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}}
	tc.SetSessionTicketKeys([][32]byte{{4, 5, 6}})
	a, _ := quicserver.Start(t, quicfront.ServerConfig{TLSConfig: tc.Clone(), Allow0RTT: true}, quictest.NewScriptedPG())
	b, _ := quicserver.Start(t, quicfront.ServerConfig{TLSConfig: tc.Clone()}, quictest.NewScriptedPG())
	file := filepath.Join(t.TempDir(), "tickets")
	base := &tls.Config{ServerName: "127.0.0.1"}
	pin := Fingerprint(cert.Certificate[0])
	zeroRTTSession(t, DialerConfig{Addr: a.Addr().String(), PinSHA256: pin, Conns: 1, SessionCacheFile: file, TLSConfig: base})
	st := zeroRTTSession(t, DialerConfig{Addr: b.Addr().String(), PinSHA256: pin, Conns: 1, SessionCacheFile: file, TLSConfig: base})
	if st.ZeroRTT != 0 || st.ZeroRTTRejected != 1 || st.Resumed != 1 {
		t.Fatalf("at the replica refusing 0-RTT: %+v, want resumed, 0-RTT rejected", st)
	}
}
