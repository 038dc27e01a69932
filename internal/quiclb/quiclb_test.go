package quiclb

import (
	"bytes"
	"errors"
	"testing"
)

// TestCIDRoundTrip: an ID encodes and decodes; IDs out of range, other
// lengths and other first octets are refused; two CIDs of one server
// differ past the ID.
func TestCIDRoundTrip(t *testing.T) {
	for _, id := range []int{1, 2, 255, 256, 0xffff} {
		a, err := NewCID(id)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := NewCID(id)
		if got, ok := ServerID(a); !ok || got != id || len(a) != CIDLen {
			t.Errorf("id %d: decoded %d %v from %x", id, got, ok, a)
		}
		if bytes.Equal(a[3:], b[3:]) {
			t.Errorf("id %d: two CIDs share their random part", id)
		}
	}
	for _, id := range []int{0, -1, 0x10000} {
		if _, err := NewCID(id); !errors.Is(err, ErrServerID) {
			t.Errorf("id %d: %v", id, err)
		}
	}
	c, _ := NewCID(7)
	if _, ok := ServerID(c[:8]); ok {
		t.Error("an 8-byte CID decoded")
	}
	c[0] = 0xff
	if _, ok := ServerID(c); ok {
		t.Error("an unroutable first octet decoded")
	}
	if _, ok := ServerID(make([]byte, CIDLen)); ok {
		t.Error("an all-zero CID decoded")
	}
}

// TestDestConnID: the DCID of long-header packets (length-prefixed) and
// of short-header ones (CIDLen assumed); short datagrams are refused.
func TestDestConnID(t *testing.T) {
	cid, _ := NewCID(3)
	long := func(typ byte, dcid []byte) []byte {
		p := []byte{0xc0 | typ<<4, 0, 0, 0, 1, byte(len(dcid))}
		return append(append(p, dcid...), 0, 1, 2, 3)
	}
	random := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	for _, tc := range []struct {
		name string
		pkt  []byte
		want []byte
	}{
		{"client's first initial", long(0, random), random},
		{"initial to the server's ID", long(0, cid), cid},
		{"handshake", long(2, cid), cid},
		{"short", append([]byte{0x40}, append(cid, 9, 9, 9)...), cid},
	} {
		d, ok := DestConnID(tc.pkt)
		if !ok || !bytes.Equal(d, tc.want) {
			t.Errorf("%s: dcid %x %v, want %x", tc.name, d, ok, tc.want)
		}
	}
	for _, p := range [][]byte{nil, {0x40, 1, 2}, {0xc0, 0, 0, 0, 1}, {0xc0, 0, 0, 0, 1, 20, 1}, {0xc0, 0, 0, 0, 1, 21}} {
		if _, ok := DestConnID(p); ok {
			t.Errorf("%x parsed", p)
		}
	}
}
