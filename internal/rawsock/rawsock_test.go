package rawsock_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/rawsock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair returns a wrapped client end and the plain server end of a loopback
// connection over network ("tcp" or "unix").
func pair(t testing.TB, network string) (wrapped, peer net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "s")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p := <-accepted
	if p == nil {
		t.Fatal("accept failed")
	}
	w := rawsock.Wrap(c)
	if runtime.GOOS == "linux" {
		if _, ok := w.(*rawsock.Conn); !ok {
			t.Fatalf("Wrap(%T) = %T, want *rawsock.Conn", c, w)
		}
	}
	t.Cleanup(func() { _ = w.Close(); _ = p.Close() })
	return w, p
}

func TestRoundTrip(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			w, p := pair(t, network)
			msg := []byte("hello, server")
			if n, err := w.Write(msg); err != nil || n != len(msg) {
				t.Fatalf("Write = %d, %v", n, err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(p, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("peer read %q, %v", got, err)
			}
			if _, err := p.Write([]byte("reply")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			n, err := w.Read(buf)
			if err != nil || string(buf[:n]) != "reply" {
				t.Fatalf("Read = %q, %v", buf[:n], err)
			}
			if n, err := w.Read(nil); n != 0 || err != nil {
				t.Fatalf("Read(nil) = %d, %v", n, err)
			}
		})
	}
}

// TestLargeTransfers sends more than the socket buffers hold both ways, so
// writes wait in the poller for room and reads for data.
func TestLargeTransfers(t *testing.T) {
	w, p := pair(t, "tcp")
	data := make([]byte, 8<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	done := make(chan error, 1)
	go func() {
		got := make([]byte, len(data))
		_, err := io.ReadFull(p, got)
		if err == nil && !bytes.Equal(got, data) {
			err = errors.New("peer received different bytes")
		}
		if err == nil {
			_, err = p.Write(data)
		}
		done <- err
	}()
	if n, err := w.Write(data); err != nil || n != len(data) {
		t.Fatalf("Write = %d, %v", n, err)
	}
	got := make([]byte, len(data))
	if _, err := io.ReadFull(w, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadFull: %v (equal %v)", err, bytes.Equal(got, data))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestEOF(t *testing.T) {
	w, p := pair(t, "tcp")
	if _, err := p.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	buf := make([]byte, 4)
	if n, err := w.Read(buf); n != 1 || err != nil {
		t.Fatalf("Read = %d, %v; want the byte sent before the close", n, err)
	}
	if n, err := w.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("Read after the peer closed = %d, %v; want io.EOF", n, err)
	}
}

func TestCloseUnblocksRead(t *testing.T) {
	w, _ := pair(t, "tcp")
	errc := make(chan error, 1)
	go func() {
		_, err := w.Read(make([]byte, 8))
		errc <- err
	}()
	// Close is safe whether the Read is already waiting or not: either way
	// it must return net.ErrClosed.
	_ = w.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read on a closed conn = %v; want net.ErrClosed", err)
	}
	if _, err := w.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write on a closed conn = %v; want net.ErrClosed", err)
	}
	var oe *net.OpError
	if _, err := w.Read(make([]byte, 1)); !errors.As(err, &oe) || oe.Op != "read" {
		t.Fatalf("Read error %v is not a net.OpError for read", err)
	}
}

func TestDeadlines(t *testing.T) {
	w, _ := pair(t, "tcp")
	if err := w.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := w.Read(make([]byte, 8))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read past its deadline = %v; want a timeout", err)
	}
	// A write that cannot complete (nobody reads) stops at its deadline
	// and reports what it wrote.
	if err := w.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	n, err := w.Write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n <= 0 || n >= 64<<20 {
		t.Fatalf("Write past its deadline = %d, %v; want a partial write and a timeout", n, err)
	}
}

func TestWriteToResetPeer(t *testing.T) {
	w, p := pair(t, "tcp")
	if tc, ok := p.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close with a reset
	}
	_ = p.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := w.Write([]byte("x"))
		if err != nil {
			if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("Write to a reset peer = %v; want EPIPE or ECONNRESET", err)
			}
			var se *os.SyscallError
			if !errors.As(err, &se) || se.Syscall != "write" {
				t.Fatalf("Write error %v does not carry an os.SyscallError for write", err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("writes to a reset peer kept succeeding")
		}
	}
}

func TestWrapKeepsOthers(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := rawsock.Wrap(a); got != a {
		t.Fatalf("Wrap(net.Pipe) = %T, want the pipe itself", got)
	}
}

func TestSyscallConn(t *testing.T) {
	w, _ := pair(t, "tcp")
	sc, ok := w.(syscall.Conn)
	if !ok {
		t.Fatalf("%T is not a syscall.Conn", w)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd uintptr
	if err := rc.Control(func(f uintptr) { fd = f }); err != nil || fd == 0 {
		t.Fatalf("Control: fd %d, %v", fd, err)
	}
}

// TestNoAllocs checks that a message's way out and back allocates nothing.
func TestNoAllocs(t *testing.T) {
	w, p := pair(t, "tcp")
	msg, buf, pbuf := []byte("0123456789abcdef"), make([]byte, 64), make([]byte, 64)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := w.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(p, pbuf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(w, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per round trip, want 0", allocs)
	}
}

// BenchmarkRoundTrip bounces a small message between a wrapped and a plain
// socket (compare with -bench=RoundTrip/plain).
func BenchmarkRoundTrip(b *testing.B) {
	for _, wrap := range []bool{true, false} {
		name := "raw"
		if !wrap {
			name = "plain"
		}
		b.Run(name, func(b *testing.B) {
			w, p := pair(b, "tcp")
			if !wrap {
				w = w.(*rawsock.Conn).Unwrap()
			}
			msg, buf := make([]byte, 64), make([]byte, 64)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = w.Write(msg)
				_, _ = io.ReadFull(p, buf)
				_, _ = p.Write(msg)
				_, _ = io.ReadFull(w, buf)
			}
		})
	}
}

func TestPeek(t *testing.T) {
	w, p := pair(t, "tcp")
	rc, err := w.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	peek := func() (n int, err error) {
		buf := make([]byte, 1)
		if cerr := rc.Control(func(fd uintptr) { n, err = rawsock.Peek(fd, buf) }); cerr != nil {
			t.Fatal(cerr)
		}
		return n, err
	}
	if n, err := peek(); err != syscall.EAGAIN {
		t.Fatalf("Peek on a quiet socket = %d, %v; want EAGAIN", n, err)
	}
	if _, err := p.Write([]byte("ab")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := peek()
		if err == nil && n == 1 {
			break
		}
		if err != syscall.EAGAIN || time.Now().After(deadline) {
			t.Fatalf("Peek with data waiting = %d, %v", n, err)
		}
		time.Sleep(time.Millisecond)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(w, buf); err != nil || string(buf) != "ab" {
		t.Fatalf("the peeked bytes were consumed: read %q, %v", buf, err)
	}
	_ = p.Close()
	deadline = time.Now().Add(5 * time.Second)
	for {
		n, err := peek()
		if err == nil && n == 0 {
			return // end of file
		}
		if err != syscall.EAGAIN || time.Now().After(deadline) {
			t.Fatalf("Peek after the peer closed = %d, %v; want 0, nil", n, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBeforeRead: the next Read runs fn once, before it reads, and returns
// the reply fn's request drew, also when the peer answers before the
// Read's wait begins; fn's error fails the Read; a Read that fails before
// looking at the socket (an expired deadline) still runs fn; a peer that
// has gone away wakes the Read (its reset, or its end of stream).
func TestBeforeRead(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("raw reads are Linux only")
	}
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			w, p := pair(t, network)
			rc := w.(*rawsock.Conn)
			go func() { // an echo server
				buf := make([]byte, 64)
				for {
					n, err := p.Read(buf)
					if err != nil {
						return
					}
					if _, err := p.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
			buf := make([]byte, 64)
			for i := range 200 {
				calls := 0
				rc.BeforeRead(func() error {
					calls++
					_, err := rc.Write([]byte{byte(i)})
					return err
				})
				n, err := rc.Read(buf)
				if err != nil || n != 1 || buf[0] != byte(i) || calls != 1 {
					t.Fatalf("round %d: Read = %d %q, %v; fn ran %d times", i, n, buf[:n], err, calls)
				}
			}

			sentinel := errors.New("flush failed")
			rc.BeforeRead(func() error { return sentinel })
			if _, err := rc.Read(buf); !errors.Is(err, sentinel) {
				t.Fatalf("Read after a failing fn = %v, want it to wrap %v", err, sentinel)
			}

			ran := false
			rc.BeforeRead(func() error { ran = true; return nil })
			_ = rc.SetReadDeadline(time.Unix(1, 0))
			if _, err := rc.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) || !ran {
				t.Fatalf("Read past its deadline = %v (fn ran: %v)", err, ran)
			}
			_ = rc.SetReadDeadline(time.Time{})
		})
	}
}

// TestBeforeReadPeerGone: the request is written to a peer that has
// closed, whose end of stream arrived before the Read began, so no new
// data will come: the Read must still end, with the end of stream or a
// reset, not wait.
func TestBeforeReadPeerGone(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("raw reads are Linux only")
	}
	w, p := pair(t, "tcp")
	rc := w.(*rawsock.Conn)
	_ = p.Close()
	// Wait until the end of stream is there to be read.
	raw, err := rc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var n int
		var perr error
		_ = raw.Read(func(fd uintptr) bool { n, perr = rawsock.Peek(fd, make([]byte, 1)); return true })
		if n == 0 && perr == nil {
			break // EOF
		}
		if time.Now().After(deadline) {
			t.Fatal("no end of stream from the closed peer")
		}
		time.Sleep(time.Millisecond)
	}
	rc.BeforeRead(func() error { _, err := rc.Write([]byte("request")); return err })
	_ = rc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = rc.Read(make([]byte, 16))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the Read waited for a peer that had gone")
	}
	if err == nil {
		t.Fatal("the Read of a peer that had gone returned data")
	}
}
