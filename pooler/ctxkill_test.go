package pooler

import (
	"context"
	"net"
	"testing"
	"time"
)

// TestCtxKillSharedPerContext: sessions on one Serve context share one
// AfterFunc; cancelling that context ends all of them and none on another
// context; a session that begins on a context already done ends at once;
// once every session ended the pooler holds no registration.
func TestCtxKillSharedPerContext(t *testing.T) {
	p, err := New(Config{}, unusedPools{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctxA, cancelA := context.WithCancel(context.Background())
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	// Sessions that never send a startup packet wait in the startup until
	// something closes their stream.
	serve := func(ctx context.Context) (chan error, net.Conn) {
		client, server := net.Pipe()
		done := make(chan error, 1)
		go func() { done <- p.Serve(ctx, server, Peer{}) }()
		return done, client
	}
	const n = 5
	var onA, onB []chan error
	for range n {
		d, c := serve(ctxA)
		defer c.Close()
		onA = append(onA, d)
		d, c = serve(ctxB)
		defer c.Close()
		onB = append(onB, d)
	}
	waitUntil(t, "all sessions registered", func() bool { return p.Sessions() == 2*n })
	p.mu.Lock()
	regs := len(p.kills)
	p.mu.Unlock()
	if regs != 2 {
		t.Fatalf("%d context registrations for sessions on 2 contexts", regs)
	}

	cancelA()
	for i, d := range onA {
		select {
		case <-d:
		case <-time.After(10 * time.Second):
			t.Fatalf("session %d on the cancelled context still runs", i)
		}
	}
	for i, d := range onB {
		select {
		case err := <-d:
			t.Fatalf("session %d on the other context ended: %v", i, err)
		default:
		}
	}

	late, c := serve(ctxA)
	defer c.Close()
	select {
	case <-late:
	case <-time.After(10 * time.Second):
		t.Fatal("a session begun on a cancelled context still runs")
	}

	cancelB()
	for i, d := range onB {
		select {
		case <-d:
		case <-time.After(10 * time.Second):
			t.Fatalf("session %d still runs after its context was cancelled", i)
		}
	}
	waitUntil(t, "every session unregistered", func() bool { return p.Sessions() == 0 })
	p.mu.Lock()
	regs = len(p.kills)
	p.mu.Unlock()
	if regs != 0 {
		t.Fatalf("%d context registrations left after every session ended", regs)
	}
}

// waitUntil polls cond until it holds or 10 s pass.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
