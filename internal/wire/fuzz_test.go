package wire_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/pgquic/pgquic/internal/wire"
)

// readErrOK reports whether err is one of the errors a Reader may return for
// malformed or short input.
func readErrOK(err error) bool {
	return errors.Is(err, wire.ErrBadLength) || errors.Is(err, wire.ErrMessageTooLarge) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

func startupPacket(code uint32, rest string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(8+len(rest)))
	b = binary.BigEndian.AppendUint32(b, code)
	return append(b, rest...)
}

// FuzzReadStartup feeds arbitrary bytes to ReadStartup: it must never panic,
// return only packets within the protocol's limits, and return exactly the
// bytes that were sent.
func FuzzReadStartup(f *testing.F) {
	f.Add(startupPacket(196608, "user\x00postgres\x00database\x00postgres\x00\x00"), uint16(0))
	f.Add(append(startupPacket(80877103, ""), startupPacket(196608, "user\x00u\x00\x00")...), uint16(100))
	f.Add(startupPacket(80877102, "\x00\x00\x00\x01abcd"), uint16(3))
	f.Add([]byte{0, 0, 0, 4}, uint16(0))
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0}, uint16(0))
	f.Add([]byte{0, 0, 0x27, 0x10}, uint16(5000))
	f.Fuzz(func(t *testing.T, data []byte, size uint16) {
		r := wire.NewReader(bytes.NewReader(data), 16+int(size%8192), 0)
		off := 0
		for range 64 {
			body, err := r.ReadStartup()
			if err != nil {
				if !readErrOK(err) {
					t.Fatalf("unexpected error type: %v", err)
				}
				return
			}
			if len(body) < 4 || len(body) > wire.MaxStartupLen-4 {
				t.Fatalf("startup body of %d bytes outside the protocol limits", len(body))
			}
			if off+4+len(body) > len(data) {
				t.Fatalf("returned %d bytes past the input", off+4+len(body)-len(data))
			}
			if n := int(binary.BigEndian.Uint32(data[off:])); n != 4+len(body) {
				t.Fatalf("length word %d, body %d", n, len(body))
			}
			if !bytes.Equal(body, data[off+4:off+4+len(body)]) {
				t.Fatal("body differs from the bytes sent")
			}
			off += 4 + len(body)
		}
	})
}

// FuzzReader drives Next with a fuzzed mix of Body, Forward, Skip,
// Frames with Consume, and implicit skips: no panic, lengths within the
// limit, and every frame returned or forwarded byte for byte.
func FuzzReader(f *testing.F) {
	dataRow := []byte{'D', 0, 0, 0, 11, 0, 1, 0, 0, 0, 1, 'x'}
	rfq := []byte{'Z', 0, 0, 0, 5, 'I'}
	big := append(binary.BigEndian.AppendUint32([]byte{'d'}, 4+300), bytes.Repeat([]byte{7}, 300)...)
	f.Add(append(append([]byte{}, dataRow...), rfq...), []byte{0, 1, 2, 3}, uint16(0), uint32(0))
	f.Add(append(append([]byte{}, big...), rfq...), []byte{1}, uint16(10), uint32(1000))
	f.Add(append(append([]byte{}, big...), rfq...), []byte{0}, uint16(10), uint32(299))
	f.Add([]byte{'Q', 0, 0, 0, 3}, []byte{0}, uint16(0), uint32(0))
	f.Add([]byte{'Q', 0x7f, 0xff, 0xff, 0xff}, []byte{1}, uint16(0), uint32(0))
	f.Add([]byte{'Q', 0, 0, 0, 9, 's'}, []byte{0}, uint16(0), uint32(0))
	f.Fuzz(func(t *testing.T, data, ops []byte, size uint16, maxLen uint32) {
		limit := int(maxLen % (1 << 20))
		r := wire.NewReader(bytes.NewReader(data), 16+int(size%4096), limit)
		if limit == 0 {
			limit = wire.DefaultMaxMessageLen
		}
		if len(ops) == 0 {
			ops = []byte{0}
		}
		var out bytes.Buffer
		w := bufio.NewWriterSize(&out, 64)
		off := 0
		for i := 0; i < 256; i++ {
			typ, n, err := r.Next()
			if err != nil {
				if !readErrOK(err) {
					t.Fatalf("unexpected error type: %v", err)
				}
				return
			}
			if n < 0 || n > limit {
				t.Fatalf("body length %d outside [0, %d]", n, limit)
			}
			if off+wire.HeaderLen > len(data) || typ != data[off] {
				t.Fatalf("header at %d does not match the input", off)
			}
			complete := off+wire.HeaderLen+n <= len(data)
			switch ops[i%len(ops)] % 5 {
			case 0:
				body, err := r.Body()
				if err != nil {
					if complete || !readErrOK(err) {
						t.Fatalf("Body: %v (complete %v)", err, complete)
					}
					return
				}
				if !complete || !bytes.Equal(body, data[off+wire.HeaderLen:off+wire.HeaderLen+n]) {
					t.Fatal("Body differs from the bytes sent")
				}
			case 1:
				out.Reset()
				w.Reset(&out)
				err := r.Forward(w)
				if err != nil {
					if complete || !readErrOK(err) {
						t.Fatalf("Forward: %v (complete %v)", err, complete)
					}
					return
				}
				if err := w.Flush(); err != nil {
					t.Fatal(err)
				}
				if !complete || !bytes.Equal(out.Bytes(), data[off:off+wire.HeaderLen+n]) {
					t.Fatal("Forward wrote other bytes than the frame")
				}
			case 2:
				if err := r.Skip(); err != nil {
					if complete || !readErrOK(err) {
						t.Fatalf("Skip: %v (complete %v)", err, complete)
					}
					return
				}
			case 3:
				// Leave the frame to the next Next.
			case 4:
				// Consume the whole frames Frames shows, as a forwarder
				// of a run does; with none whole, leave the frame.
				b := r.Frames()
				if len(b) < wire.HeaderLen || !bytes.Equal(b, data[off:off+len(b)]) {
					t.Fatalf("Frames at %d: %d bytes that are not the input's", off, len(b))
				}
				k := 0
				for len(b)-k >= wire.HeaderLen {
					size := 1 + int(binary.BigEndian.Uint32(b[k+1:]))
					if size < wire.HeaderLen || size-wire.HeaderLen > limit || size > len(b)-k {
						break
					}
					k += size
				}
				if k > 0 {
					r.Consume(k)
					off += k
					continue
				}
			}
			off += wire.HeaderLen + n
		}
	})
}
