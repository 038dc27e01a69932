package wan

import (
	"bytes"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// childConfig runs this test binary as the relay child (see TestMain).
func childConfig(log io.Writer) ProcessConfig {
	return ProcessConfig{Path: os.Args[0], Env: []string{ChildEnv + "=1"}, Log: log}
}

// TestProcess runs the relay as a child process: it relays TCP and UDP, its
// CPU is readable while it runs, and Stop returns its final counters.
func TestProcess(t *testing.T) {
	ctx := testCtx(t)
	up := startEchoBoth(t)
	var log bytes.Buffer
	p, err := StartProcess(ctx, childConfig(&lockedWriter{w: &log}), Config{Upstream: up, RTT: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("tcp")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 3)); err != nil {
		t.Fatal(err)
	}
	u, err := net.Dial("udp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.Write([]byte("udp")); err != nil {
		t.Fatal(err)
	}
	_ = u.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := u.Read(make([]byte, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CPU(); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	st, err := p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if st.TCP.ConnsTotal != 1 || st.TCP.Up.Bytes != 3 || st.UDP.FlowsTotal != 1 || st.UDP.Down.Packets != 1 {
		t.Fatalf("final stats %+v", st)
	}
	if cpu, err := p.CPU(); err != nil || cpu <= 0 {
		t.Fatalf("CPU after exit: %v, %v", cpu, err)
	}
	if st2, err := p.Stop(); err != nil || st2 != st {
		t.Fatalf("second Stop: %+v, %v", st2, err)
	}
}

// TestProcessStartFailure: a child that cannot listen fails StartProcess
// with its own error, at once.
func TestProcessStartFailure(t *testing.T) {
	ctx := testCtx(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	_, err = StartProcess(ctx, childConfig(nil), Config{Listen: busy.Addr().String(), Upstream: "127.0.0.1:1"})
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("StartProcess: %v; want the child's listen error", err)
	}
	if _, err := StartProcess(ctx, childConfig(nil), Config{Upstream: "127.0.0.1:1", RTT: -1}); err == nil || !strings.Contains(err.Error(), "must not be negative") {
		t.Fatalf("StartProcess with a bad config: %v", err)
	}
}

// TestCPUPerPacket measures the relay's CPU per relayed datagram and per
// relayed TCP chunk in a child process (its CPU apart from this process's
// clients and echo servers), at RTT 10 ms, and asserts a generous bound.
// Run with -v to see the figures.
func TestCPUPerPacket(t *testing.T) {
	bound := 100 * time.Microsecond
	if raceEnabled {
		bound *= 10
	}
	t.Run("udp", func(t *testing.T) {
		const n, window = 20000, 128
		perPacket := measureCPU(t, func(addr string) {
			c, err := net.Dial("udp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.(*net.UDPConn).SetReadBuffer(udpSocketBuffer)
			sem := make(chan struct{}, window)
			done := make(chan error, 1)
			go func() {
				buf := make([]byte, 2048)
				for range n {
					_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
					if _, err := c.Read(buf); err != nil {
						done <- err
						return
					}
					<-sem
				}
				done <- nil
			}()
			msg := make([]byte, 1200) // a typical QUIC packet
			for range n {
				sem <- struct{}{}
				if _, err := c.Write(msg); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}, func(st Stats) uint64 { return st.UDP.Up.Packets + st.UDP.Down.Packets })
		t.Logf("relay CPU per UDP datagram: %v", perPacket)
		if perPacket > bound {
			t.Errorf("relay CPU per UDP datagram %v, want under %v", perPacket, bound)
		}
	})
	t.Run("tcp", func(t *testing.T) {
		const conns, exchanges = 50, 200
		perChunk := measureCPU(t, func(addr string) {
			var wg sync.WaitGroup
			errs := make(chan error, conns)
			for range conns {
				wg.Go(func() {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						errs <- err
						return
					}
					defer c.Close()
					if err := exchange(c, exchanges); err != nil {
						errs <- err
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
		}, func(st Stats) uint64 { return st.TCP.Up.Chunks + st.TCP.Down.Chunks })
		t.Logf("relay CPU per TCP chunk: %v", perChunk)
		if perChunk > bound {
			t.Errorf("relay CPU per TCP chunk %v, want under %v", perChunk, bound)
		}
	})
}

// measureCPU starts a child relay at RTT 10 ms in front of echo servers, runs
// load against it, and returns the child's CPU after it became ready divided
// by the units count reports.
func measureCPU(t *testing.T, load func(addr string), count func(Stats) uint64) time.Duration {
	t.Helper()
	ctx := testCtx(t)
	pc := childConfig(nil)
	if v := os.Getenv("WAN_TEST_CHILD_GOMAXPROCS"); v != "" {
		pc.Env = append(pc.Env, "GOMAXPROCS="+v)
	}
	p, err := StartProcess(ctx, pc, Config{Upstream: startEchoBoth(t), RTT: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	startCPU, err := p.CPU()
	if err != nil {
		t.Fatal(err)
	}
	load(p.Addr())
	st, err := p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := p.CPU()
	if err != nil {
		t.Fatal(err)
	}
	units := count(st)
	if units == 0 {
		t.Fatalf("nothing relayed: %+v", st)
	}
	return (cpu - startCPU) / time.Duration(units)
}

// lockedWriter serializes writes from the log reader and the test.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// exchange sends n small requests on c, each echoed back before the next
// (a small query and its answer), and returns the first error.
func exchange(c net.Conn, n int) error {
	buf := make([]byte, 100)
	for range n {
		if _, err := c.Write(buf); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
	}
	return nil
}
