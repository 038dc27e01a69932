package wire_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"

	"github.com/pgquic/pgquic/internal/wire"
)

// allocatedBy returns the bytes the heap handed out while f ran. The tests
// using it run without t.Parallel, so other goroutines add little noise.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestBodyAllocatesWhatArrives: a peer that announces a 60 MiB message and
// sends 1 KiB of it must cost the reader kilobytes, not the announced
// length. Before bodies grew with the bytes received, Body allocated the
// whole announced length up front.
func TestBodyAllocatesWhatArrives(t *testing.T) {
	const announced = 60 << 20
	msg := binary.BigEndian.AppendUint32([]byte{'p'}, announced+4)
	msg = append(msg, bytes.Repeat([]byte{'x'}, 1<<10)...)
	r := wire.NewReader(bytes.NewReader(msg), 4<<10, 64<<20)
	var err error
	got := allocatedBy(func() {
		if _, _, err = r.Next(); err != nil {
			return
		}
		_, err = r.Body()
	})
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Body of a truncated message: %v, want io.ErrUnexpectedEOF", err)
	}
	if got > 64<<10 {
		t.Fatalf("reading 1 KiB of an announced 60 MiB body allocated %d bytes, want at most 64 KiB", got)
	}
}

// TestBodyGrowsToLargeMessages: large bodies arrive intact whatever the
// read buffer size, through several growth steps, and a body that fits the
// capacity kept from an earlier message reuses it.
func TestBodyGrowsToLargeMessages(t *testing.T) {
	for _, size := range []int{5000, 16 << 10, 16<<10 + 1, 100 << 10, 3 << 20} {
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(i * 7)
		}
		msg := binary.BigEndian.AppendUint32([]byte{'B'}, uint32(size+4))
		msg = append(msg, body...)
		stream := append(append([]byte{}, msg...), msg...)
		r := wire.NewReader(bytes.NewReader(stream), 4<<10, 0)
		for round := range 2 {
			typ, n, err := r.Next()
			if err != nil || typ != 'B' || n != size {
				t.Fatalf("size %d round %d: Next = %c %d %v", size, round, typ, n, err)
			}
			got, err := r.Body()
			if err != nil {
				t.Fatalf("size %d round %d: Body: %v", size, round, err)
			}
			if !bytes.Equal(got, body) {
				t.Fatalf("size %d round %d: body differs", size, round)
			}
		}
	}
}

// TestSetMaxLen: a tighter limit applies to the next header and the old one
// comes back when restored.
func TestSetMaxLen(t *testing.T) {
	msg := binary.BigEndian.AppendUint32([]byte{'p'}, 4+2000)
	msg = append(msg, make([]byte, 2000)...)
	r := wire.NewReader(bytes.NewReader(append(append([]byte{}, msg...), msg...)), 4<<10, 0)
	old := r.SetMaxLen(1020)
	if old != wire.DefaultMaxMessageLen {
		t.Fatalf("SetMaxLen returned %d, want the default %d", old, wire.DefaultMaxMessageLen)
	}
	if _, _, err := r.Next(); !errors.Is(err, wire.ErrMessageTooLarge) {
		t.Fatalf("Next under a 1020-byte limit: %v, want ErrMessageTooLarge", err)
	}
	if prev := r.SetMaxLen(old); prev != 1020 {
		t.Fatalf("SetMaxLen returned %d, want 1020", prev)
	}
	if _, n, err := r.Next(); err != nil || n != 2000 {
		t.Fatalf("Next after restoring the limit: %d %v", n, err)
	}
}
