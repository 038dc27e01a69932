package wan

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/quicfront"
)

func TestMain(m *testing.M) {
	MainIfChild()
	goleak.VerifyTestMain(m)
}

// testTimeout bounds each test; the machine is small and shared.
const testTimeout = 2 * time.Minute

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// startRelay starts an in-process relay in front of upstream, closed at the
// end of the test.
func startRelay(t testing.TB, cfg Config) *Relay {
	t.Helper()
	r, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// median of a copy of ds.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// within reports whether got is within frac of want.
func within(got, want time.Duration, frac float64) bool {
	diff := got - want
	if diff < 0 {
		diff = -diff
	}
	return float64(diff) <= frac*float64(want)
}

// tcpEcho is a TCP echo server on loopback: it copies each connection back
// to itself and closes it after the client's end of stream.
type tcpEcho struct {
	ln net.Listener
	wg sync.WaitGroup
	mu sync.Mutex
	cs []net.Conn
}

func startTCPEcho(t testing.TB) *tcpEcho {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &tcpEcho{ln: ln}
	e.serve(t)
	return e
}

func (e *tcpEcho) serve(t testing.TB) {
	ln := e.ln
	e.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.cs = append(e.cs, c)
			e.mu.Unlock()
			e.wg.Go(func() {
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		e.mu.Lock()
		for _, c := range e.cs {
			_ = c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
}

func (e *tcpEcho) addr() string { return e.ln.Addr().String() }

// udpEcho is a UDP echo server on loopback: every datagram goes back to its
// sender.
func startUDPEcho(t testing.TB) *net.UDPConn {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	uc := pc.(*net.UDPConn)
	serveUDPEcho(t, uc)
	return uc
}

func serveUDPEcho(t testing.TB, uc *net.UDPConn) {
	_ = uc.SetReadBuffer(udpSocketBuffer)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, maxRead)
		for {
			n, from, err := uc.ReadFromUDPAddrPort(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			_, _ = uc.WriteToUDPAddrPort(buf[:n], from)
		}
	})
	t.Cleanup(func() {
		_ = uc.Close()
		wg.Wait()
	})
}

// startEchoBoth runs a TCP and a UDP echo server on the same loopback port,
// as a pooler's TCP and QUIC fronts share one.
func startEchoBoth(t testing.TB) string {
	t.Helper()
	ln, uc, err := listenBoth("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &tcpEcho{ln: ln}
	e.serve(t)
	serveUDPEcho(t, uc)
	return ln.Addr().String()
}

// freeBoth returns a loopback address whose port is free for TCP and UDP.
func freeBoth(t testing.TB) string {
	t.Helper()
	ln, uc, err := listenBoth("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	_ = uc.Close()
	return addr
}

const testALPN = "wan-test"

// quicEcho is a quic-go server on loopback that echoes every stream.
func startQUICEcho(t testing.TB) string {
	t.Helper()
	cert, err := quicfront.GenerateSelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{testALPN}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			conn, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.CloseWithError(0, "")
				for {
					s, err := conn.AcceptStream(ctx)
					if err != nil {
						return
					}
					wg.Go(func() {
						_, _ = io.Copy(s, s)
						_ = s.Close()
					})
				}
			})
		}
	})
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// dialQUIC connects to a quicEcho server at addr.
func dialQUIC(ctx context.Context, t testing.TB, addr string) *quic.Conn {
	t.Helper()
	conn, err := quic.DialAddr(ctx, addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{testALPN}}, &quic.Config{KeepAlivePeriod: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.CloseWithError(0, "") })
	return conn
}
