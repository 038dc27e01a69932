package wire_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/pgquic/pgquic/internal/wire"
)

// TestRelease: a Reader gives its buffer back only when nothing is
// buffered and no message is half read, and reads on normally afterwards
// (the next Next takes a buffer again), also after Reset.
func TestRelease(t *testing.T) {
	msg := func(typ byte, body string) []byte {
		return append(wire.AppendHeader(nil, typ, len(body)), body...)
	}
	pr, pw := io.Pipe()
	r := wire.NewReader(pr, 64, 0)
	go func() {
		_, _ = pw.Write(append(msg('Q', "one"), msg('Q', "two")...))
		_, _ = pw.Write(msg('S', ""))
		_ = pw.Close()
	}()
	typ, _, err := r.Next()
	if err != nil || typ != 'Q' {
		t.Fatalf("Next = %q, %v", typ, err)
	}
	if r.Release() {
		t.Fatal("Release with a message half read")
	}
	if b, err := r.Body(); err != nil || string(b) != "one" {
		t.Fatalf("Body = %q, %v", b, err)
	}
	if r.Buffered() == 0 || r.Release() {
		t.Fatalf("Release with %d bytes buffered", r.Buffered())
	}
	if typ, _, err = r.Next(); err != nil || typ != 'Q' {
		t.Fatalf("Next = %q, %v", typ, err)
	}
	if b, err := r.Body(); err != nil || string(b) != "two" {
		t.Fatalf("Body = %q, %v", b, err)
	}
	if !r.Release() || !r.Release() || r.Buffered() != 0 {
		t.Fatal("Release with nothing buffered kept the buffer")
	}
	if typ, _, err = r.Next(); err != nil || typ != 'S' {
		t.Fatalf("Next after Release = %q, %v", typ, err)
	}
	if err := r.Skip(); err != nil {
		t.Fatal(err)
	}
	if _, _, err = r.Next(); err != io.EOF {
		t.Fatalf("Next at the end = %v, want EOF", err)
	}

	// Reset while released points the next buffer at the new source.
	if !r.Release() {
		t.Fatal("Release at EOF")
	}
	r.Reset(bytes.NewReader(msg('X', "")))
	if typ, _, err = r.Next(); err != nil || typ != 'X' {
		t.Fatalf("Next after Reset = %q, %v", typ, err)
	}
	if err := r.Skip(); err != nil {
		t.Fatal(err)
	}
	if !r.Release() {
		t.Fatal("Release after Reset")
	}
	if body, err := r.ReadStartup(); err == nil {
		t.Fatalf("ReadStartup at EOF = %q", body)
	}
}

// BenchmarkReleaseNext is what an idle session pays per request to hold no
// read buffer while it waits: Release, then a Next that takes a buffer
// from the pool again.
func BenchmarkReleaseNext(b *testing.B) {
	frame := append(wire.AppendHeader(nil, 'Q', 9), "SELECT 1\x00"...)
	src := &frameReader{frame: frame}
	r := wire.NewReader(src, 4<<10, 0)
	for b.Loop() {
		if !r.Release() {
			b.Fatal("nothing to release")
		}
		if _, _, err := r.Next(); err != nil {
			b.Fatal(err)
		}
		if err := r.Skip(); err != nil {
			b.Fatal(err)
		}
	}
}

// frameReader returns one whole frame per Read, forever, as a client that
// waits for each reply does.
type frameReader struct{ frame []byte }

func (f *frameReader) Read(p []byte) (int, error) { return copy(p, f.frame), nil }
