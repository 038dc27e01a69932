package quicwire_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/quicwire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// selfSigned returns a throwaway certificate for 127.0.0.1.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// echoPair starts a QUIC listener whose streams echo what they read until
// FIN (then FIN back), and dials one connection to it. serverStreams receives
// every stream's complete input and whether it ended with a FIN.
func echoPair(t *testing.T) (*quic.Conn, <-chan streamEnd) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	// Transports of our own, whose Close waits for their goroutines.
	listenUDP := func() *net.UDPConn {
		u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	str, ctr := &quic.Transport{Conn: listenUDP()}, &quic.Transport{Conn: listenUDP()}
	ln, err := str.Listen(&tls.Config{Certificates: []tls.Certificate{selfSigned(t)}, NextProtos: []string{"test"}},
		&quic.Config{MaxIncomingStreams: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ends := make(chan streamEnd, 1000)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					str, err := conn.AcceptStream(ctx)
					if err != nil {
						return
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						var got bytes.Buffer
						// Echo write errors (the client stopped reading) are
						// ignored: the server reads on to see all the client sent.
						_, err := io.Copy(io.MultiWriter(&got, lenient{str}), str)
						_ = str.Close()
						ends <- streamEnd{data: got.Bytes(), err: err}
					}()
				}
			}()
		}
	}()
	conn, err := ctr.Dial(ctx, ln.Addr(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"test"}},
		&quic.Config{MaxIncomingStreams: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.CloseWithError(0, "")
		cancel()
		_ = ln.Close()
		wg.Wait()
		_ = ctr.Close()
		_ = str.Close()
		_ = ctr.Conn.Close()
		_ = str.Conn.Close()
	})
	return conn, ends
}

// lenient writes to w and reports success even when w failed.
type lenient struct{ w io.Writer }

func (l lenient) Write(p []byte) (int, error) {
	_, _ = l.w.Write(p)
	return len(p), nil
}

type streamEnd struct {
	data []byte
	err  error // nil: the stream ended with a FIN
}

// TestCoalescingConnOrder runs many streams over one connection through a
// Coalescer, each writing messages of mixed sizes (queued ones and ones
// larger than what is held back, some without waiting for the echo in
// between) and checks that every stream reads back exactly what it wrote, in
// order, and that the server saw each stream end with a FIN.
func TestCoalescingConnOrder(t *testing.T) {
	conn, ends := echoPair(t)
	co := quicwire.NewCoalescer(conn.Context())
	const streams, rounds = 40, 60
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	sent := make([][]byte, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			str, err := conn.OpenStreamSync(ctx)
			if err != nil {
				errs <- err
				return
			}
			c := quicwire.NewCoalescingConn(str, conn, co, nil)
			defer c.Close()
			rng := mrand.New(mrand.NewPCG(uint64(i), 7))
			var all bytes.Buffer
			for r := range rounds {
				// 1 to 3 messages before reading the echo; mostly small
				// (queued after the previous read), sometimes above the
				// 4 KiB a stream holds back.
				var want bytes.Buffer
				for range 1 + rng.IntN(3) {
					n := 1 + rng.IntN(300)
					if rng.IntN(8) == 0 {
						n = 3000 + rng.IntN(20000)
					}
					msg := make([]byte, n)
					for k := range msg {
						msg[k] = byte(i + r + k)
					}
					if _, err := c.Write(msg); err != nil {
						errs <- fmt.Errorf("stream %d round %d: write: %w", i, r, err)
						return
					}
					want.Write(msg)
				}
				got := make([]byte, want.Len())
				if _, err := io.ReadFull(c, got); err != nil {
					errs <- fmt.Errorf("stream %d round %d: read: %w", i, r, err)
					return
				}
				if !bytes.Equal(got, want.Bytes()) {
					errs <- fmt.Errorf("stream %d round %d: echo differs from what was written", i, r)
					return
				}
				all.Write(want.Bytes())
			}
			// A small last message right after a read is queued; CloseWrite
			// must send it before the FIN.
			if _, err := c.Write([]byte("bye")); err != nil {
				errs <- err
				return
			}
			all.WriteString("bye")
			sent[i] = all.Bytes()
			if err := c.CloseWrite(); err != nil {
				errs <- err
				return
			}
			rest, err := io.ReadAll(c)
			if err != nil || string(rest) != "bye" {
				errs <- fmt.Errorf("stream %d: after CloseWrite read %q, %v", i, rest, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for range streams {
		select {
		case e := <-ends:
			if e.err != nil {
				t.Fatalf("server side of a stream ended with %v, want FIN", e.err)
			}
			found := false
			for i := range sent {
				if sent[i] != nil && bytes.Equal(sent[i], e.data) {
					sent[i] = nil
					found = true
					break
				}
			}
			if !found {
				t.Fatalf("server received %d bytes on a stream that match no client stream", len(e.data))
			}
		case <-ctx.Done():
			t.Fatal("server streams did not all end")
		}
	}
}

// TestCoalescingConnCloseSendsQueued checks that Close right after a queued
// Write still delivers the bytes and a FIN (a client's Terminate message
// followed by Close), and that a Write after the peer reset the stream fails.
func TestCoalescingConnCloseSendsQueued(t *testing.T) {
	conn, ends := echoPair(t)
	co := quicwire.NewCoalescer(conn.Context())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := quicwire.NewCoalescingConn(str, conn, co, nil)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("X\x00\x00\x00\x04")); err != nil { // queued: just after a read
		t.Fatal(err)
	}
	_ = c.Close()
	select {
	case e := <-ends:
		if e.err != nil || string(e.data) != "pingX\x00\x00\x00\x04" {
			t.Fatalf("server got %q, %v; want the queued message and a FIN", e.data, e.err)
		}
	case <-ctx.Done():
		t.Fatal("server stream did not end")
	}
	if _, err := c.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v, want net.ErrClosed", err)
	}
}
