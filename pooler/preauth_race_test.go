package pooler_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pgquic/pgquic/pooler"
)

// upgraded stands for the TLS stream a front returns from StartTLS: a
// different io.ReadWriteCloser over the same connection.
type upgraded struct{ net.Conn }

// TestPreauthTLSUpgradeThenStartupTimeout: the startup timer closes the
// client stream from its own goroutine while the session owner has just
// swapped that stream for the TLS one. Run under -race, this flagged a data
// race on the session's stream before the swap and the close took the same
// lock; the session must also end with the startup timeout.
func TestPreauthTLSUpgradeThenStartupTimeout(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), cfg: pooler.Config{StartupTimeout: 200 * time.Millisecond}})
	client, server := net.Pipe()
	defer client.Close()
	peer := pooler.Peer{
		Transport: "pipe",
		StartTLS: func(context.Context) (io.ReadWriteCloser, error) {
			return upgraded{server}, nil
		},
	}
	served := make(chan error, 1)
	go func() { served <- h.pooler.Serve(testCtx(t, time.Minute), server, peer) }()

	_ = client.SetDeadline(time.Now().Add(30 * time.Second))
	req := binary.BigEndian.AppendUint32(nil, 8)
	req = binary.BigEndian.AppendUint32(req, 80877103) // SSLRequest
	if _, err := client.Write(req); err != nil {
		t.Fatal(err)
	}
	var answer [1]byte
	if _, err := io.ReadFull(client, answer[:]); err != nil || answer[0] != 'S' {
		t.Fatalf("SSLRequest answered %q, %v; want S", answer[0], err)
	}
	// Say nothing more: the startup timer closes the upgraded stream.
	if _, err := client.Read(answer[:]); err == nil {
		t.Fatal("the session sent more bytes instead of timing out")
	}
	select {
	case err := <-served:
		if err == nil || !strings.Contains(err.Error(), "startup timeout") {
			t.Fatalf("Serve returned %v, want the startup timeout", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return after the startup timeout")
	}
}
