package tcpfront

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestProbe checks the liveness probe the front hands the pooler on real
// loopback sockets: a quiet or chatty client is alive; one that closed (even
// with unread bytes ahead of its FIN) or reset its end is gone.
func TestProbe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func(t *testing.T) (client *net.TCPConn, server net.Conn, probe func() error) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
		probe = newProbe(s)
		if probe == nil {
			t.Fatal("no probe for a TCP connection")
		}
		return c.(*net.TCPConn), s, probe
	}
	gone := func(t *testing.T, probe func() error) {
		t.Helper()
		deadline := time.Now().Add(testTimeout)
		for probe() == nil {
			if time.Now().After(deadline) {
				t.Fatal("probe still reports the client alive")
			}
			time.Sleep(time.Millisecond)
		}
		if err := probe(); !errors.Is(err, errClientGone) {
			t.Fatalf("probe error %v does not wrap errClientGone", err)
		}
	}

	t.Run("quiet", func(t *testing.T) {
		_, _, probe := pair(t)
		if err := probe(); err != nil {
			t.Fatalf("quiet client: %v", err)
		}
	})
	t.Run("data", func(t *testing.T) {
		c, s, probe := pair(t)
		if _, err := c.Write([]byte("Q")); err != nil {
			t.Fatal(err)
		}
		waitReadable(t, s)
		if err := probe(); err != nil {
			t.Fatalf("client with unread data: %v", err)
		}
	})
	t.Run("close", func(t *testing.T) {
		c, _, probe := pair(t)
		_ = c.Close()
		gone(t, probe)
	})
	t.Run("data_then_close", func(t *testing.T) {
		c, _, probe := pair(t)
		if _, err := c.Write([]byte{'X', 0, 0, 0, 4}); err != nil { // Terminate, then FIN
			t.Fatal(err)
		}
		_ = c.Close()
		gone(t, probe)
	})
	t.Run("reset", func(t *testing.T) {
		c, _, probe := pair(t)
		_ = c.SetLinger(0)
		_ = c.Close()
		gone(t, probe)
	})
}

// waitReadable waits until c has unread data, without consuming it.
func waitReadable(t *testing.T, c net.Conn) {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(testTimeout))
	defer c.SetReadDeadline(time.Time{})
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return n > 0 || err != syscall.EAGAIN
	})
	if err != nil {
		t.Fatal(err)
	}
}
