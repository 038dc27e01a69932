// Package rawsock makes the reads and writes of a pooled socket without
// telling the Go scheduler about them.
//
// Every read or write through net.Conn is a syscall.Syscall, which brackets
// the system call with the runtime's entersyscall and exitsyscall. When the
// whole process was idle a moment before (all Ps idle, as between requests
// at a moderate rate), entersyscall wakes the runtime's monitor thread
// (sysmon) from its deep sleep; sysmon then polls every 20 µs until the
// process is idle again and goes back to sleep. At 2,000 requests a second
// through a pool that is two to three extra context switches and about a
// quarter of the pooler's CPU per request. A read or write on a non-blocking
// socket never blocks, so it needs none of that bookkeeping: Wrap returns a
// connection that makes them as raw system calls (syscall.RawSyscall) from
// inside syscall.RawConn.Read and Write, which keep everything else the
// net package does: waiting in the network poller when the socket has
// nothing to give or no room, deadlines, and Close unblocking a waiting
// Read or Write with net.ErrClosed.
//
// Only the data path changes; everything else (addresses, deadlines, Close,
// SyscallConn) is the wrapped connection's own.
package rawsock

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// maxRW caps one system call's length, as the net package does (1 GiB):
// larger requests are split.
const maxRW = 1 << 30

// Conn is a stream socket whose Read and Write are raw system calls. Reads
// are serialised with one another, and so are writes; a Read and a Write may
// run at the same time, as on any net.Conn.
type Conn struct {
	net.Conn
	sc syscall.Conn
	rc syscall.RawConn

	rmu    sync.Mutex
	rbuf   []byte // the caller's buffer while a Read runs
	rn     int
	rerr   error
	readFn func(fd uintptr) bool // c.readFD, bound once so a Read allocates nothing
	before func() error          // BeforeRead's fn, run by the next Read

	wmu     sync.Mutex
	wbuf    []byte // the caller's data while a Write runs
	wn      int
	werr    error
	writeFn func(fd uintptr) bool // c.writeFD, bound once
}

// Wrap returns c as a *Conn when c is a TCP or Unix stream socket on a
// platform where raw reads and writes are supported, and c itself otherwise
// (a TLS connection, a pipe, an in-memory test connection).
func Wrap(c net.Conn) net.Conn {
	if !supported {
		return c
	}
	var sc syscall.Conn
	switch t := c.(type) {
	case *net.TCPConn:
		sc = t
	case *net.UnixConn:
		if a := t.LocalAddr(); a == nil || a.Network() != "unix" {
			return c // a datagram or seqpacket socket keeps its own semantics
		}
		sc = t
	default:
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	w := &Conn{Conn: c, sc: sc, rc: rc}
	w.readFn = w.readFD
	w.writeFn = w.writeFD
	return w
}

// Unwrap returns the wrapped connection.
func (c *Conn) Unwrap() net.Conn { return c.Conn }

// SyscallConn returns the wrapped socket's raw connection, so code that
// inspects the socket (liveness probes, TCP_INFO) keeps working.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.sc.SyscallConn() }

// Read reads like net.Conn.Read: it waits in the network poller until the
// socket has data, returns io.EOF once the peer closed its side, and
// honours the read deadline.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) > maxRW {
		p = p[:maxRW]
	}
	c.rmu.Lock()
	c.rbuf, c.rn, c.rerr = p, 0, nil
	err := c.rc.Read(c.readFn)
	if f := c.before; f != nil {
		// The read failed before it looked at the socket (a deadline, a
		// close): what fn would have sent still goes out.
		c.before = nil
		_ = f()
	}
	n, rerr := c.rn, c.rerr
	c.rbuf, c.rerr = nil, nil
	c.rmu.Unlock()
	if err != nil {
		return 0, c.opError("read", err)
	}
	if rerr != nil {
		return 0, c.opError("read", rerr)
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p like net.Conn.Write: it waits in the network poller
// whenever the socket's send buffer is full, and honours the write deadline.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	c.wbuf, c.wn, c.werr = p, 0, nil
	err := c.rc.Write(c.writeFn)
	n, werr := c.wn, c.werr
	c.wbuf, c.werr = nil, nil
	c.wmu.Unlock()
	if err == nil {
		err = werr
	}
	if err != nil {
		return n, c.opError("write", err)
	}
	return n, nil
}

// BeforeRead makes the next Read call fn (a flush of the request whose
// reply it reads) from inside its wait in the network poller, and then wait
// for the socket to become readable instead of first trying a read that
// would find nothing. fn's error fails that Read.
//
// The poller is edge-triggered and forgets what it knew of the socket's
// readiness as a read begins, so bytes that arrived before that moment
// raise no new wake-up: a read must be tried once before waiting, and
// between requests it finds nothing (EAGAIN), one system call per request.
// Written from inside the read, the request goes out after that moment,
// and its reply is new data that wakes the read. The caller must expect
// one: a peer that sends nothing more after fn would leave the Read
// waiting, even with bytes that came before. (A peer that closed, or
// closes, makes fn's write fail or the read wake up: a connection reset
// wakes the poller too.)
//
// Only the goroutine that makes the next Read may call BeforeRead.
func (c *Conn) BeforeRead(fn func() error) {
	c.rmu.Lock()
	c.before = fn
	c.rmu.Unlock()
}

// readFD is called by RawConn.Read with the socket: it reads once into
// c.rbuf and returns false, to wait in the poller, when nothing is there.
// Armed by BeforeRead, its first call runs the caller's fn instead and
// waits.
func (c *Conn) readFD(fd uintptr) bool {
	if f := c.before; f != nil {
		c.before = nil
		if err := f(); err != nil {
			c.rerr = err
			return true
		}
		return false
	}
	for {
		n, err := rawRead(fd, c.rbuf)
		switch err {
		case 0:
			c.rn = n
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			c.rerr = &errnoError{call: "read", errno: err}
			return true
		}
	}
}

// writeFD is called by RawConn.Write with the socket: it writes what is
// left of c.wbuf and returns false, to wait in the poller, when the send
// buffer is full.
func (c *Conn) writeFD(fd uintptr) bool {
	for c.wn < len(c.wbuf) {
		b := c.wbuf[c.wn:]
		if len(b) > maxRW {
			b = b[:maxRW]
		}
		n, err := rawWrite(fd, b)
		switch err {
		case 0:
			if n == 0 {
				c.werr = io.ErrUnexpectedEOF
				return true
			}
			c.wn += n
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.werr = &errnoError{call: "write", errno: err}
			return true
		}
	}
	return true
}

// opError wraps err as the net package does for a failed Read or Write, so
// callers testing errors.Is(err, net.ErrClosed), os.ErrDeadlineExceeded or
// a syscall.Errno see what they would see without the wrapper.
func (c *Conn) opError(op string, err error) error {
	if err == io.ErrUnexpectedEOF {
		return err
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err // RawConn's own "raw-read"/"raw-write" error
	}
	if e, ok := err.(*errnoError); ok {
		err = e.syscallError()
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// errnoError carries a failed system call out of the RawConn callback; it
// becomes an *os.SyscallError, as the net package reports it, only then.
type errnoError struct {
	call  string
	errno syscall.Errno
}

func (e *errnoError) Error() string { return e.call + ": " + e.errno.Error() }

func (e *errnoError) syscallError() error { return os.NewSyscallError(e.call, e.errno) }

// peeks counts the calls to Peek in this process.
var peeks atomic.Uint64

// Peeks returns how many times Peek was called in this process: the
// system calls /proc/self/io does not count (it counts the read and write
// families, not recv), for the pooler's regression gate, which counts the
// system calls of a request.
func Peeks() uint64 { return peeks.Load() }
