package loadgen

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/pooler"
	"github.com/pgquic/pgquic/quicclient"
	"github.com/pgquic/pgquic/quicfront"
)

// TestSessionPerQuery runs each session path with a new session per query:
// plain TCP, TCP+TLS, and QUIC with local startup through a pooler that
// trusts the client's certificate as an edge. Every query is accounted
// for, opens one session, and leaves none behind at the pooler.
func TestSessionPerQuery(t *testing.T) {
	dir := t.TempDir()
	cert, err := quicfront.GenerateSelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "edge.crt"), filepath.Join(dir, "edge.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	trust, err := pgauth.ParseEdgeTrust(strings.NewReader(quicclient.Fingerprint(cert.Certificate[0])+" * *\n"), os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	st := newStackWith(t, pooler.Config{EdgeTrust: trust})

	for _, tt := range []struct {
		name string
		cfg  ClientConfig
	}{
		{"tcp", ClientConfig{Transport: TCP, Addr: st.tcpAddr, DisableTLS: true}},
		{"tcp+tls", ClientConfig{Transport: TCP, Addr: st.tcpAddr, PinSHA256: st.pin}},
		{"edge-local", ClientConfig{Transport: QUIC, Addr: st.quicAddr, PinSHA256: st.pin, Streams: 4,
			LocalStartup: true, CertFile: certFile, KeyFile: keyFile}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Conns, cfg.SessionPerQuery = 4, true
			if cfg.Transport == QUIC {
				cfg.Conns = 1
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := Connect(ctx, cfg, nil)
			if err != nil {
				t.Fatalf("Connect: %v", err)
			}
			if c.Stats.Sessions < 1 || len(c.Workers()) != 4 {
				t.Errorf("warm-up sessions %d, workers %d; want at least 1 and 4", c.Stats.Sessions, len(c.Workers()))
			}
			// A low rate and a long grace: every query completes even when
			// TLS handshakes under -race on a busy machine take 100 ms.
			res, err := Run(ctx, RunConfig{Schedule: Constant(20, 2*time.Second), Grace: 10 * time.Second}, c.Workers())
			if err != nil {
				t.Fatal(err)
			}
			if res.Scheduled != 40 || res.Completed != 40 || res.Completed+res.Errors+res.Unfinished != res.Scheduled {
				t.Errorf("scheduled %d = completed %d + errors %d + unfinished %d, want 40 completed (first error %q)",
					res.Scheduled, res.Completed, res.Errors, res.Unfinished, res.FirstError)
			}
			cs := c.ChurnStats()
			if cs.NewSessions != int64(res.Completed) || cs.ConnectErrors != 0 || cs.P50 <= 0 || cs.P99 < cs.P50 {
				t.Errorf("churn stats %+v, want %d new sessions", cs, res.Completed)
			}
			run := res.ReportRun(c)
			if run.NewSessions == nil || *run.NewSessions != cs.NewSessions || run.ConnectMs == nil {
				t.Errorf("report: new_sessions %v connect_ms %v", run.NewSessions, run.ConnectMs)
			}
			if cfg.LocalStartup && cs.P50 > 5*time.Millisecond {
				// The startup is answered on the client's side: no round trip.
				t.Errorf("local startup: connect p50 %v, want well under a round trip", cs.P50)
			}
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			// Terminate on every session: the pooler's count returns to 0.
			deadline := time.Now().Add(5 * time.Second)
			for {
				n := len(st.pooler.Clients()) + st.pooler.StartingSessions()
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the pooler still holds %d client sessions", n)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
