package quicfront

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/quicclient"
)

// crash drops the server's socket without sending CONNECTION_CLOSE, as a
// killed process would, and lets the test's cleanup find it closed.
func (ts *testServer) crash() {
	ts.mu.Lock()
	tr, udp := ts.tr, ts.udp
	ts.mu.Unlock()
	// The socket first: a crashed replica sends nothing, not even the
	// CONNECTION_CLOSE the transport's shutdown would try to send.
	_ = udp.Close()
	_ = tr.Close()
}

// TestSharedStatelessResetKey: two replicas with different certificates
// but the same StatelessResetKey. When the first vanishes and the second
// takes its address, a client of the first gets a stateless reset as soon
// as its next packet arrives; with different keys the reset does not
// authenticate and the client only learns at its idle timeout.
func TestSharedStatelessResetKey(t *testing.T) {
	shared := &quic.StatelessResetKey{1, 2, 3, 4, 5, 6, 7, 8}
	other := &quic.StatelessResetKey{9, 9, 9}
	for _, tc := range []struct {
		name      string
		secondKey *quic.StatelessResetKey
		want      any
	}{
		{"same key", shared, new(*quic.StatelessResetError)},
		{"different key", other, new(*quic.IdleTimeoutError)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s1 := startServer(t, ServerConfig{TLSConfig: fixedCertConfig(t), StatelessResetKey: shared}, quictest.Echo{})
			addr := s1.Addr().String()
			// A short idle timeout bounds the "different key" case; keep-alives
			// are off so only the test's own write provokes the reset.
			d := newTestDialer(t, quicclient.DialerConfig{Addr: addr, Insecure: true,
				IdleTimeout: 3 * time.Second, KeepAlivePeriod: -1})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := d.Dial(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			msg := quictest.StartupBytes()
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
				t.Fatal(err)
			}

			s1.crash()
			startServer(t, ServerConfig{Addr: addr, TLSConfig: fixedCertConfig(t), StatelessResetKey: tc.secondKey}, quictest.Echo{})

			// A one-byte write. A reset only answers a packet longer than
			// 42 bytes; the server's 20-byte connection IDs keep the
			// client's packets above that (deploy's TestReplicaFailover
			// measures the difference under load).
			if _, err = c.Write([]byte{'x'}); err == nil {
				_, err = io.ReadFull(c, make([]byte, 1))
			}
			// The outcome may already be known when the write returns: a
			// packet the client sent on its own (an acknowledgement) can
			// reach the new server first and draw the reset.
			if !errors.As(err, tc.want) {
				t.Fatalf("read after the replica vanished: %T %v; want %T", err, err, tc.want)
			}
		})
	}
}

// TestStatelessResetKeyOverridesCertificate: the configured key replaces
// the one derived from the certificate, and is copied.
func TestStatelessResetKeyOverridesCertificate(t *testing.T) {
	key := quic.StatelessResetKey{7}
	cfg := ServerConfig{Addr: "127.0.0.1:0", TLSConfig: &tls.Config{Certificates: fixedCertConfig(t).Certificates}, StatelessResetKey: &key}
	s, err := NewServer(cfg, quictest.Echo{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	key[0] = 8
	if s.srk == nil || s.srk[0] != 7 {
		t.Fatalf("reset key = %v, want the configured one", s.srk)
	}
	derived, err := NewServer(ServerConfig{Addr: "127.0.0.1:0", TLSConfig: cfg.TLSConfig}, quictest.Echo{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if derived.srk == nil || *derived.srk == *s.srk {
		t.Fatal("without a configured key the certificate's derived key must be used")
	}
}
