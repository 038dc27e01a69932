//go:build linux

package wan

import (
	"net"
	"testing"
	"time"
)

// TestRxStampAgeUDP: a datagram that waited in the socket before the relay
// read it carries its arrival time, so the relay's delay counts from there.
func TestRxStampAgeUDP(t *testing.T) {
	rx, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	if !enableRxStamps(rx) {
		t.Fatal("SO_TIMESTAMPNS refused on a UDP socket")
	}
	tx, err := net.DialUDP("udp", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	const held = 80 * time.Millisecond
	buf, oob := make([]byte, 64), make([]byte, stampOOB)
	// The kernel turns receive stamping on for the whole stack a moment
	// after the first socket asks (a deferred static key), and stamps at
	// read time until then: the first tries may see a fresh age.
	var age time.Duration
	for try := 0; try < 5 && age < held; try++ {
		if _, err := tx.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(held) // the relay "starved": the datagram waits in the kernel
		var n int
		n, _, age, err = readUDPStamped(rx, buf, oob)
		if err != nil || string(buf[:n]) != "hello" {
			t.Fatalf("read %q, %v", buf[:n], err)
		}
	}
	if age < held || age > maxRxAge {
		t.Fatalf("age %v; want at least the %v the datagram waited", age, held)
	}
}

// TestRxStampAgeTCP is the same for a TCP stream, and its end of stream.
func TestRxStampAgeTCP(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tx, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	rx, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	read := stampedTCPReader(rx)
	const held = 80 * time.Millisecond
	buf := make([]byte, 64)
	// See TestRxStampAgeUDP for why the first tries may be fresh.
	var (
		n   int
		age time.Duration
	)
	for try := 0; try < 5 && age < held; try++ {
		if _, err := tx.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(held)
		n, age, err = read(buf)
		if err != nil || string(buf[:n]) != "hello" {
			t.Fatalf("read %q, %v", buf[:n], err)
		}
	}
	if age < held || age > maxRxAge {
		t.Fatalf("age %v; want at least the %v the bytes waited", age, held)
	}
	// A fresh segment read at once is young.
	if _, err := tx.Write([]byte("again")); err != nil {
		t.Fatal(err)
	}
	n, age, err = read(buf)
	if err != nil || string(buf[:n]) != "again" || age >= held {
		t.Fatalf("read %q age %v, %v", buf[:n], age, err)
	}
	_ = tx.CloseWrite()
	if n, _, err := read(buf); n != 0 || err == nil || err.Error() != "EOF" {
		t.Fatalf("end of stream: %d, %v", n, err)
	}
}
