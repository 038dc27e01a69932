package pooler_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/pooler"
)

// noPools is a PoolSource with no routes, so a fuzzed session that gets
// through startup ends at the pool lookup without needing a server.
type noPools struct{}

func (noPools) Pool(context.Context, string, string) (*backend.Pool, error) {
	return nil, fmt.Errorf("fuzz: %w", backend.ErrNoRoute)
}

func fuzzStartup(code uint32, rest string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(8+len(rest)))
	b = binary.BigEndian.AppendUint32(b, code)
	return append(b, rest...)
}

// FuzzSessionStartup runs Pooler.Serve over an in-memory pipe with arbitrary
// bytes as the client's first packets. Serve must not panic and must return
// promptly once the client hangs up (StartupTimeout is far longer than the
// deadline, so it cannot be what ends the session).
func FuzzSessionStartup(f *testing.F) {
	f.Add(fuzzStartup(196608, "user\x00postgres\x00database\x00postgres\x00\x00"))
	f.Add(fuzzStartup(196609, "user\x00u\x00_pq_.x\x00y\x00options\x00-c a=b --c-d=e\x00\x00"))
	f.Add(append(fuzzStartup(80877103, ""), fuzzStartup(196608, "user\x00u\x00\x00")...))
	f.Add(append(fuzzStartup(80877104, ""), fuzzStartup(196608, "user\x00u\x00replication\x00true\x00\x00")...))
	f.Add(fuzzStartup(80877102, "\x00\x00\x00\x01abcd"))
	f.Add(fuzzStartup(196608, "user\x00u\x00options\x00-x\x00\x00"))
	f.Add([]byte{0, 0, 0, 4})
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff})
	p, err := pooler.New(pooler.Config{StartupTimeout: time.Minute}, noPools{}, nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		feedSession(t, p, data)
		if n := p.Sessions(); n != 0 {
			t.Fatalf("%d sessions left registered", n)
		}
	})
}

// feedSession runs one session that receives data and then sees its client
// hang up, and fails if Serve is still running 5 s later.
func feedSession(t *testing.T, p *pooler.Pooler, data []byte) {
	t.Helper()
	client, server := net.Pipe()
	served := make(chan error, 1)
	go func() {
		served <- p.Serve(context.Background(), server, pooler.Peer{Transport: "fuzz"})
	}()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		_, _ = io.Copy(io.Discard, client)
	}()
	_ = client.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = client.Write(data) // fails once Serve has closed its end
	_ = client.Close()
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Fatalf("Serve still running 5s after the client hung up (input %q)", data)
	}
	<-drained
}
