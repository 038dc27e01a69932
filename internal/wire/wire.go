// Package wire frames PostgreSQL protocol messages without decoding them.
//
// The pooler forwards almost every message untouched, so this package only
// peeks at a message's type and length and then either exposes the body as a
// slice of the read buffer (valid until the next read) or copies the whole
// frame to a writer. Nothing here allocates per message for messages that fit
// in the read buffer, which is what keeps DataRow forwarding allocation-free.
//
// Framing rules come from the PostgreSQL documentation, "Message Formats"
// (https://www.postgresql.org/docs/current/protocol-message-formats.html):
// every message after startup is a one-byte type, a four-byte big-endian length
// that counts itself but not the type byte, then the body.
package wire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/pgquic/pgquic/internal/defaults"
)

// HeaderLen is the size of a regular message header: type byte plus length.
const HeaderLen = 5

// DefaultMaxMessageLen bounds a single message when the caller sets no limit:
// the pooler's default bound on client messages.
const DefaultMaxMessageLen = defaults.MaxMessageLen

// MaxStartupLen is the largest startup packet accepted, the same cap
// PostgreSQL applies (MAX_STARTUP_PACKET_LENGTH in src/include/libpq/pqcomm.h).
const MaxStartupLen = 10000

// ErrMessageTooLarge reports a length field above the configured maximum.
var ErrMessageTooLarge = errors.New("message length exceeds limit")

// ErrBadLength reports a length field below 4, which no valid message has.
var ErrBadLength = errors.New("invalid message length")

// Reader reads framed messages from a buffered stream. A Reader is owned by a
// single goroutine.
type Reader struct {
	br      *bufio.Reader // nil until the first read and while released (see Release)
	src     io.Reader
	size    int
	pool    *sync.Pool // where the buffer comes from and goes back to
	max     int
	typ     byte
	bodyLen int
	pending bool // a header was returned by Next and its frame not yet consumed
	scratch []byte
}

// NewReader wraps r with a buffer of size bytes. maxLen bounds the body length
// of any message; zero means DefaultMaxMessageLen.
//
// The buffer comes from the pool Release gives buffers back to, taken at the
// first read: a new session reads its startup packet and first messages, then
// gives the buffer back at its first idle wait, so thousands of logins reuse
// a few buffers instead of leaving one each behind as garbage (4 KiB a session
// of heap until the next collection).
func NewReader(r io.Reader, size, maxLen int) *Reader {
	if maxLen <= 0 {
		maxLen = DefaultMaxMessageLen
	}
	size = max(size, minReadBufferSize)
	return &Reader{src: r, size: size, pool: readerPool(size), max: maxLen}
}

// minReadBufferSize is bufio's smallest buffer, which NewReaderSize rounds
// smaller sizes up to.
const minReadBufferSize = 16

// Reset points the Reader at a new source, keeping its buffer. It lets a
// session swap a plain stream for a TLS one after an SSLRequest.
func (r *Reader) Reset(src io.Reader) {
	r.src = src
	if r.br != nil {
		r.br.Reset(src)
	}
	r.pending = false
}

// Unread puts frame, a whole message already consumed, back in front of
// what is buffered, so that the next Next returns it again without reading
// the source (Buffered counts it). A session uses it to run later a
// message it read early and decided to hold.
func (r *Reader) Unread(frame []byte) {
	var pre []byte
	pre = append(pre, frame...)
	if r.br != nil {
		rest, _ := r.br.Peek(r.br.Buffered())
		pre = append(pre, rest...)
	} else {
		r.acquire()
	}
	r.Reset(io.MultiReader(bytes.NewReader(pre), r.src))
	_, _ = r.br.Peek(min(len(pre), r.br.Size()))
}

// Buffered returns how many bytes can be read without blocking. Forwarders
// flush their writer when it reaches zero, batching responses without adding
// latency.
func (r *Reader) Buffered() int {
	if r.br == nil {
		return 0
	}
	return r.br.Buffered()
}

// Release gives the read buffer back to a pool shared by all Readers of the
// same size when nothing is buffered and no message is half read, and
// reports whether the Reader now holds no buffer. The next Next or
// ReadStartup takes a buffer again. It lets an owner that is about to wait a
// long time for its peer (an idle client session, on a transport that can
// wait for input without reading it) hold no buffer meanwhile: thousands of
// idle sessions then cost no read buffers.
func (r *Reader) Release() bool {
	if r.br == nil {
		return true
	}
	if r.pending || r.br.Buffered() > 0 {
		return false
	}
	r.br.Reset(nil)
	r.pool.Put(r.br)
	r.br = nil
	return true
}

// acquire takes a read buffer, first or after Release.
func (r *Reader) acquire() {
	r.br = r.pool.Get().(*bufio.Reader)
	r.br.Reset(r.src)
}

// readerPools holds the buffers released Readers gave back, one pool per
// buffer size.
var (
	readerPoolsMu sync.Mutex
	readerPools   = map[int]*sync.Pool{}
)

func readerPool(size int) *sync.Pool {
	readerPoolsMu.Lock()
	defer readerPoolsMu.Unlock()
	p := readerPools[size]
	if p == nil {
		p = &sync.Pool{New: func() any { return bufio.NewReaderSize(nil, size) }}
		readerPools[size] = p
	}
	return p
}

// Peek returns the bytes already buffered after the message last consumed,
// without consuming them, or nil while the current message is not fully
// consumed. The slice aliases the read buffer and is valid only until the
// next call on the Reader. A pooler uses it to see whether a client's whole
// request has already arrived.
func (r *Reader) Peek() []byte {
	if r.pending || r.br == nil {
		return nil
	}
	b, _ := r.br.Peek(r.br.Buffered())
	return b
}

// Frames returns the bytes buffered from the header of the message Next
// announced onwards, complete messages or not, without consuming them, or
// nil when no message is announced. The slice aliases the read buffer and
// is valid until the next call on the Reader. With Consume it lets a
// forwarder handle a run of whole messages already in the buffer in one
// pass instead of one Next and Body or Forward per message.
func (r *Reader) Frames() []byte {
	if !r.pending {
		return nil
	}
	b, _ := r.br.Peek(r.br.Buffered())
	return b
}

// Consume discards the first n bytes of what Frames returned, which must
// be whole messages (the caller read their lengths), and with them the
// message Next announced. n == 0 consumes nothing and leaves the message
// announced.
func (r *Reader) Consume(n int) {
	if n == 0 || !r.pending {
		return
	}
	r.pending = false
	_, _ = r.br.Discard(n)
}

// Next reads the next message header and returns its type and body length.
// Any unconsumed part of the previous message is skipped first.
func (r *Reader) Next() (typ byte, bodyLen int, err error) {
	if r.br == nil {
		r.acquire()
	}
	if r.pending {
		if err := r.Skip(); err != nil {
			return 0, 0, err
		}
	}
	hdr, err := r.br.Peek(HeaderLen)
	if err != nil {
		if errors.Is(err, io.EOF) && len(hdr) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, err
	}
	n := int(binary.BigEndian.Uint32(hdr[1:]))
	if n < 4 {
		return 0, 0, fmt.Errorf("message type %q length %d: %w", hdr[0], n, ErrBadLength)
	}
	if n-4 > r.max {
		return 0, 0, fmt.Errorf("message type %q length %d (limit %d): %w", hdr[0], n, r.max, ErrMessageTooLarge)
	}
	r.typ, r.bodyLen, r.pending = hdr[0], n-4, true
	return r.typ, r.bodyLen, nil
}

// Body returns the body of the message announced by Next. The slice aliases
// the read buffer (or a scratch buffer for large messages) and is valid only
// until the next call on the Reader; copy what must be kept.
//
// A body larger than the read buffer is collected in a scratch buffer that
// grows as its bytes arrive (see readBody), so a peer that announces a huge
// length and then sends little costs little.
func (r *Reader) Body() ([]byte, error) {
	if !r.pending {
		return nil, errors.New("wire: Body without Next")
	}
	r.pending = false
	total := HeaderLen + r.bodyLen
	if total <= r.br.Size() {
		frame, err := r.br.Peek(total)
		if err != nil {
			return nil, noEOF(err)
		}
		_, _ = r.br.Discard(total)
		return frame[HeaderLen:], nil
	}
	if _, err := r.br.Discard(HeaderLen); err != nil {
		return nil, noEOF(err)
	}
	buf, err := r.readBody(r.bodyLen)
	if cap(r.scratch) > maxKeptScratch {
		r.scratch = nil // do not pin a huge buffer after a one-off large message
	}
	return buf, err
}

// Growth of the scratch buffer for bodies that do not fit the read buffer:
// it starts at firstChunk bytes and doubles each time it fills, so memory
// follows the bytes actually received, never the length a peer announced.
// A scratch buffer above maxKeptScratch is dropped after use.
const (
	firstChunk     = 16 << 10
	maxKeptScratch = 1 << 20
)

// readBody reads n bytes into the scratch buffer and returns them. Capacity
// already held is used as is; beyond it the buffer grows geometrically, each
// step allocated only once the previous one is full. Total allocation is thus
// at most about twice the bytes received plus firstChunk, whatever n claims.
func (r *Reader) readBody(n int) ([]byte, error) {
	if cap(r.scratch) >= n {
		buf := r.scratch[:n]
		if _, err := io.ReadFull(r.br, buf); err != nil {
			return nil, noEOF(err)
		}
		return buf, nil
	}
	buf := r.scratch[:0]
	for len(buf) < n {
		if len(buf) == cap(buf) {
			grown := make([]byte, len(buf), min(n, max(2*cap(buf), firstChunk)))
			copy(grown, buf)
			buf = grown
			r.scratch = buf
		}
		m, err := io.ReadFull(r.br, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err != nil {
			return nil, noEOF(err)
		}
	}
	return buf, nil
}

// SetMaxLen changes the largest body length Next accepts and returns the
// previous limit, so an owner can apply a tighter bound for a phase of the
// protocol (authentication messages, for instance) and restore the old one
// afterwards. n <= 0 means DefaultMaxMessageLen. A header already returned
// by Next is not checked again.
func (r *Reader) SetMaxLen(n int) (old int) {
	if n <= 0 {
		n = DefaultMaxMessageLen
	}
	old, r.max = r.max, n
	return old
}

// Forward copies the whole frame announced by Next (header and body) to w
// without decoding it. An error from w is returned as a *WriteError, so a
// caller can tell a failing destination from a failing source.
func (r *Reader) Forward(w *bufio.Writer) error {
	return r.forward(nil, w, nil)
}

// ForwardLocked is Forward for a writer shared with other goroutines: l is
// held only while writing a chunk, never while waiting for the source, so a
// slow source cannot block the writer's other users. w is called under l.
func (r *Reader) ForwardLocked(l sync.Locker, w func() *bufio.Writer) error {
	return r.forward(l, nil, w)
}

// forward copies the current frame in buffer-sized chunks (no separate
// allocation for frames larger than the buffer) to w, or to wf() under l.
func (r *Reader) forward(l sync.Locker, w *bufio.Writer, wf func() *bufio.Writer) error {
	if !r.pending {
		return errors.New("wire: Forward without Next")
	}
	r.pending = false
	remaining := HeaderLen + r.bodyLen
	for remaining > 0 {
		// Peek blocks until the chunk is buffered.
		chunk, err := r.br.Peek(min(remaining, r.br.Size()))
		if len(chunk) > 0 {
			var werr error
			if l != nil {
				l.Lock()
				_, werr = wf().Write(chunk)
				l.Unlock()
			} else {
				_, werr = w.Write(chunk)
			}
			if werr != nil {
				return &WriteError{Err: werr}
			}
			_, _ = r.br.Discard(len(chunk))
			remaining -= len(chunk)
		}
		if err != nil && remaining > 0 {
			return noEOF(err)
		}
	}
	return nil
}

// WriteError is a failure of the destination in Forward (or of a caller's
// own write to a peer), as opposed to a failure reading the source.
type WriteError struct{ Err error }

func (e *WriteError) Error() string { return "writing: " + e.Err.Error() }

// Unwrap returns the writer's error.
func (e *WriteError) Unwrap() error { return e.Err }

// Skip discards the message announced by Next.
func (r *Reader) Skip() error {
	if !r.pending {
		return nil
	}
	r.pending = false
	_, err := r.br.Discard(HeaderLen + r.bodyLen)
	return noEOF(err)
}

// ReadStartup reads one untyped startup-phase packet (StartupMessage,
// SSLRequest, GSSENCRequest or CancelRequest) and returns its body, the bytes
// after the length word. The slice is valid until the next call.
func (r *Reader) ReadStartup() ([]byte, error) {
	if r.br == nil {
		r.acquire()
	}
	hdr, err := r.br.Peek(4)
	if err != nil {
		if errors.Is(err, io.EOF) && len(hdr) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr))
	if n < 8 {
		return nil, fmt.Errorf("startup packet length %d: %w", n, ErrBadLength)
	}
	if n > MaxStartupLen {
		return nil, fmt.Errorf("startup packet length %d (limit %d): %w", n, MaxStartupLen, ErrMessageTooLarge)
	}
	if _, err := r.br.Discard(4); err != nil {
		return nil, noEOF(err)
	}
	return r.readBody(n - 4)
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// AppendHeader appends a message header for a body of bodyLen bytes.
func AppendHeader(dst []byte, typ byte, bodyLen int) []byte {
	dst = append(dst, typ)
	return binary.BigEndian.AppendUint32(dst, uint32(bodyLen+4))
}

// CString returns the NUL-terminated string at the start of b and the rest of
// b after the terminator.
func CString(b []byte) (s []byte, rest []byte, ok bool) {
	for i, c := range b {
		if c == 0 {
			return b[:i], b[i+1:], true
		}
	}
	return nil, nil, false
}
