package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/pgquic/pgquic/internal/pgproto"
)

// firstRowProxy is a TCP proxy in front of a PostgreSQL listener that
// timestamps, for each connection, the client's first byte (its
// SSLRequest or StartupMessage) and the first DataRow it sends back: a new
// session's time to first row as the wire sees it, without the client
// process's own start and exit. It decodes nothing but the framing of the
// server's replies.
type firstRowProxy struct {
	ln   net.Listener
	dial func(ctx context.Context) (net.Conn, error)
	wg   sync.WaitGroup

	mu    sync.Mutex
	times []time.Duration // first byte to first DataRow, per connection that got one
}

// newFirstRowProxy listens on a free loopback port and forwards each
// connection to what dial returns.
func newFirstRowProxy(dial func(ctx context.Context) (net.Conn, error)) (*firstRowProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &firstRowProxy{ln: ln, dial: dial}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Port is the proxy's port on 127.0.0.1.
func (p *firstRowProxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// take returns the times recorded since the last take and forgets them.
func (p *firstRowProxy) take() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.times
	p.times = nil
	return t
}

// Close stops accepting and waits for the connections to end.
func (p *firstRowProxy) Close() error {
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *firstRowProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.serve(c) }()
	}
}

// serve forwards one connection. The client's first bytes are read
// before the upstream is dialled, so the clock starts when they arrive
// and a dial across the WAN (the TCP path's handshake) counts in the
// time, as it would for a client connecting there itself. An
// SSLRequest or GSSENCRequest tells the reply scanner to skip its
// one-byte answer.
func (p *firstRowProxy) serve(client net.Conn) {
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = client.SetReadDeadline(time.Now().Add(time.Minute))
	buf := make([]byte, 32<<10)
	n, err := client.Read(buf)
	if n == 0 {
		return
	}
	first := time.Now()
	_ = client.SetReadDeadline(time.Time{})
	sc := replyScanner{}
	if n >= 8 && binary.BigEndian.Uint32(buf[:4]) == 8 {
		code := binary.BigEndian.Uint32(buf[4:8])
		sc.skipOne = code == pgproto.SSLRequestCode || code == pgproto.GSSEncRequestCode
	}
	up, derr := p.dial(ctx)
	if derr != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if tc, ok := up.(interface{ CloseWrite() error }); ok {
				_ = tc.CloseWrite()
			}
		}()
		for {
			if n > 0 {
				if _, werr := up.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
			n, err = client.Read(buf)
		}
	}()
	down := make([]byte, 32<<10)
	for {
		n, err := up.Read(down)
		if n > 0 {
			if !sc.found && sc.scan(down[:n]) {
				d := time.Since(first)
				p.mu.Lock()
				p.times = append(p.times, d)
				p.mu.Unlock()
			}
			if _, werr := client.Write(down[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = client.Close()
	<-done
}

// replyScanner follows the framing of a server's replies (a type byte and
// a four-byte length) to find the first DataRow's type byte.
type replyScanner struct {
	skipOne bool // the next byte is the answer to an SSLRequest/GSSENCRequest
	tls     bool // the answer was 'S' or 'G': encrypted from here, nothing to find
	found   bool
	hdr     [5]byte
	hn      int
	remain  int
}

// scan consumes b and reports whether it holds the first DataRow's type
// byte.
func (s *replyScanner) scan(b []byte) bool {
	for i := 0; i < len(b) && !s.tls && !s.found; {
		switch {
		case s.skipOne:
			s.skipOne, s.tls = false, b[i] != 'N'
			i++
		case s.remain > 0:
			k := min(s.remain, len(b)-i)
			s.remain -= k
			i += k
		default:
			s.hdr[s.hn] = b[i]
			s.hn++
			i++
			if s.hn == 1 && s.hdr[0] == 'D' {
				s.found = true
				return true
			}
			if s.hn == 5 {
				s.remain, s.hn = max(int(binary.BigEndian.Uint32(s.hdr[1:]))-4, 0), 0
			}
		}
	}
	return false
}

// clientRun is one run of an external client command.
type clientRun struct {
	wire, wall time.Duration // wire: 0 when no DataRow went back
}

// runClient runs command with sh -c, its libpq environment pointing at
// the proxy (PGHOST, PGPORT, PGUSER, PGDATABASE, PGSSLMODE=disable unless
// the environment sets them), and returns its wall time and the wire time
// to first row of the one connection it made.
func runClient(ctx context.Context, command string, p *firstRowProxy, user string) (clientRun, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	p.take()
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.Env = append(os.Environ(), "PGHOST=127.0.0.1", fmt.Sprintf("PGPORT=%d", p.Port()), "PGUSER="+user, "PGDATABASE=postgres")
	if os.Getenv("PGSSLMODE") == "" {
		cmd.Env = append(cmd.Env, "PGSSLMODE=disable")
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = io.Discard, &out
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if err != nil {
		return clientRun{}, fmt.Errorf("client %q: %w: %s", command, err, strings.TrimSpace(out.String()))
	}
	// The proxy records a connection's time as its DataRow passes, before
	// the client can exit; a connection still closing is not waited for.
	times := p.take()
	if len(times) == 0 {
		return clientRun{}, errors.New("the client's connection carried no DataRow (TLS, or a query without rows?)")
	}
	return clientRun{wire: times[0], wall: wall}, nil
}
