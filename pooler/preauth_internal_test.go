package pooler

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/backend"
)

// unusedPools satisfies New for tests that never reach a pool lookup.
type unusedPools struct{}

func (unusedPools) Pool(context.Context, string, string) (*backend.Pool, error) {
	return nil, errors.New("no pools in this test")
}

// TestPreauthScratchIsBounded: a session's encoding buffer grown by one
// large message is not kept for the rest of the session. Before, it stayed
// at the size of the largest message the session ever encoded.
func TestPreauthScratchIsBounded(t *testing.T) {
	p, err := New(Config{}, unusedPools{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	client, server := net.Pipe()
	defer client.Close()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		_, _ = io.Copy(io.Discard, client)
	}()
	s := newSession(p, server, Peer{})
	big := &pgproto3.ParameterStatus{Name: "big", Value: strings.Repeat("v", 200<<10)}
	if err := s.send(big); err != nil {
		t.Fatal(err)
	}
	if c := cap(s.scratch); c > maxKeptBuf {
		t.Fatalf("after sending a 200 KiB message the session keeps a %d-byte scratch buffer, want at most %d", c, maxKeptBuf)
	}
	s.frame('B', make([]byte, 200<<10)) // what a large Bind is rebuilt in
	s.dropOut()
	if c := cap(s.scratch); c > maxKeptBuf {
		t.Fatalf("after rebuilding a 200 KiB Bind the session keeps a %d-byte scratch buffer, want at most %d", c, maxKeptBuf)
	}
	_ = server.Close()
	<-drained
}
