package quicfront

import (
	"context"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/internal/quiclb"
	"github.com/pgquic/pgquic/internal/quictest"
)

// moveTo migrates conn to a new UDP socket bound to the loopback address
// ip: the path is probed (PATH_CHALLENGE/PATH_RESPONSE) and switched to.
func moveTo(t *testing.T, ctx context.Context, conn *quic.Conn, ip string) {
	t.Helper()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(ip)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: udp}
	t.Cleanup(func() { _ = tr.Close(); _ = udp.Close() })
	p, err := conn.AddPath(tr)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Switch(); err != nil {
		t.Fatal(err)
	}
}

// TestMigrationSourceFollows: with MaxConnsPerSource 1, a connection from
// 127.0.0.1 that moves to 127.0.0.3 frees 127.0.0.1's slot and takes
// 127.0.0.3's: a new connection from the old address is admitted, one from
// the new address is refused with too_many_conns, and the sessions' peer
// address names the new one.
func TestMigrationSourceFollows(t *testing.T) {
	s := startServer(t, ServerConfig{MaxConns: 4, MaxConnsPerSource: 1}, quictest.Echo{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := dialFrom(t, s, "127.0.0.1")
	roundTrip(t, ctx, a)
	moveTo(t, ctx, a, "127.0.0.3")
	// The client switches as soon as its probe is answered; the server
	// moves its side when a packet from the new address arrives, which may
	// be after the next stream was accepted (and its source looked at).
	// Wait for the server's switch, then open the stream that must carry
	// the source over.
	waitServerPeer(t, s, "127.0.0.3:")
	roundTrip(t, ctx, a)
	s.mu.Lock()
	var peer string
	for sc := range s.conns {
		peer = sc.peer.Addr.String()
	}
	got := maps.Clone(s.bySource)
	s.mu.Unlock()
	if !strings.HasPrefix(peer, "127.0.0.3:") || len(got) != 1 || got["127.0.0.3"] != 1 {
		t.Fatalf("after the move: peer %s, connections by source %v", peer, got)
	}

	b := dialFrom(t, s, "127.0.0.1")
	roundTrip(t, ctx, b)
	c := dialFrom(t, s, "127.0.0.3")
	if code := closedWith(t, c, 10*time.Second); code != pgproto.QUICTooManyConns {
		t.Fatalf("a second connection from 127.0.0.3 closed with %v, want too_many_conns", code)
	}
}

// TestServerIDConnectionIDs: with ServerID the connection IDs the server
// issues carry it (the client's packets address the server by them), and
// a ServerID out of range is refused.
func TestServerIDConnectionIDs(t *testing.T) {
	g := (&ServerConfig{ServerID: 513}).cidGenerator()
	for range 4 {
		id, err := g.GenerateConnectionID()
		if err != nil {
			t.Fatal(err)
		}
		if sid, ok := quiclb.ServerID(id.Bytes()); !ok || sid != 513 || id.Len() != connIDLen {
			t.Fatalf("connection ID %x: server ID %d %v", id.Bytes(), sid, ok)
		}
	}
	if (&ServerConfig{}).cidGenerator() != nil {
		t.Error("a generator without ServerID")
	}
	for _, id := range []int{-1, 0x10000} {
		if _, err := NewServer(ServerConfig{Addr: "127.0.0.1:0", ServerID: id}, quictest.Echo{}, nil, nil); err == nil {
			t.Errorf("ServerID %d accepted", id)
		}
	}
}

// waitServerPeer waits until the server's only connection has a remote
// address starting with prefix: the server takes a client's new path when
// the client's packets arrive from it, not when the client switches.
func waitServerPeer(t *testing.T, s *testServer, prefix string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		var remote string
		for sc := range s.conns {
			remote = sc.conn.RemoteAddr().String()
		}
		s.mu.Unlock()
		if strings.HasPrefix(remote, prefix) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server's connection is still at %s after 10s, want %s*", remote, prefix)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
