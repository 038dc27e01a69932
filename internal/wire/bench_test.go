package wire_test

import (
	"bufio"
	"encoding/binary"
	"io"
	"testing"

	"github.com/pgquic/pgquic/internal/wire"
)

// loopReader returns the same bytes over and over, never EOF, so benchmarks
// read an endless stream of identical frames.
type loopReader struct {
	data []byte
	off  int
}

func (l *loopReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], l.data[l.off:])
		n += c
		l.off = (l.off + c) % len(l.data)
	}
	return n, nil
}

// frame builds a message of total bytes (header included) of type typ.
func frame(typ byte, total int) []byte {
	b := binary.BigEndian.AppendUint32([]byte{typ}, uint32(total-1))
	for len(b) < total {
		b = append(b, byte(len(b)))
	}
	return b
}

// newForwarder returns a Reader over endless copies of f and a writer to
// io.Discard, sized like the pooler's server side.
func newForwarder(f []byte) (*wire.Reader, *bufio.Writer) {
	return wire.NewReader(&loopReader{data: f}, 8<<10, 0), bufio.NewWriterSize(io.Discard, 8<<10)
}

func forwardOne(tb testing.TB, r *wire.Reader, w *bufio.Writer, want int) {
	typ, n, err := r.Next()
	if err != nil || n != want {
		tb.Fatalf("Next: %c %d %v", typ, n, err)
	}
	if err := r.Forward(w); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkForwardDataRow forwards 100-byte DataRow frames, the pooler's
// hottest path.
func BenchmarkForwardDataRow(b *testing.B) {
	r, w := newForwarder(frame('D', 100))
	b.SetBytes(100)
	b.ReportAllocs()
	for b.Loop() {
		forwardOne(b, r, w, 95)
	}
}

// BenchmarkForward16KiB forwards messages larger than the read buffer, which
// take the streaming path.
func BenchmarkForward16KiB(b *testing.B) {
	const total = 16 << 10
	r, w := newForwarder(frame('d', total))
	b.SetBytes(total)
	b.ReportAllocs()
	for b.Loop() {
		forwardOne(b, r, w, total-wire.HeaderLen)
	}
}

// TestForwardDataRowNoAllocs asserts that forwarding a DataRow does not
// allocate: the frame goes from the read buffer to the writer as is.
func TestForwardDataRowNoAllocs(t *testing.T) {
	r, w := newForwarder(frame('D', 100))
	forwardOne(t, r, w, 95) // warm up the buffers
	if n := testing.AllocsPerRun(1000, func() { forwardOne(t, r, w, 95) }); n != 0 {
		t.Fatalf("forwarding a DataRow allocates %.1f times", n)
	}
	body := func() {
		if _, _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Body(); err != nil {
			t.Fatal(err)
		}
	}
	body()
	if n := testing.AllocsPerRun(1000, body); n != 0 {
		t.Fatalf("reading a DataRow body allocates %.1f times", n)
	}
}
