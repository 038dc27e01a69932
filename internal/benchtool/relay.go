package benchtool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/pgquic/pgquic/internal/rawsock"
)

// Relay serves the benchmark's relay target: every connection accepted on
// ln gets its own connection to upstream, and bytes are copied both ways
// until either side closes, by one goroutine per direction with the raw
// socket calls pgquic makes (internal/rawsock). It does nothing else: no
// pooling, no parsing. Measured beside pgquic and PgBouncer it separates
// what any Go proxy with goroutines and the network poller pays to move a
// query and its reply (the relay's CPU) from what pgquic's pooling adds on
// top (pgquic's minus the relay's). Relay returns when ctx ends or ln
// fails, after closing every connection it opened.
func Relay(ctx context.Context, ln net.Listener, upstream string) error {
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	track := func(cs ...net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil {
			return false
		}
		for _, c := range cs {
			conns[c] = struct{}{}
		}
		return true
	}
	stop := context.AfterFunc(ctx, func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for c := range conns {
			_ = c.Close()
		}
	})
	defer stop()
	var d net.Dialer
	var err error
	for {
		var client net.Conn
		if client, err = ln.Accept(); err != nil {
			break
		}
		wg.Go(func() {
			server, err := d.DialContext(ctx, "tcp", upstream)
			if err != nil {
				_ = client.Close()
				return
			}
			if !track(client, server) {
				_ = client.Close()
				_ = server.Close()
				return
			}
			c, s := rawsock.Wrap(client), rawsock.Wrap(server)
			var pair sync.WaitGroup
			pair.Go(func() { pump(s, c) })
			pump(c, s)
			pair.Wait()
			mu.Lock()
			delete(conns, client)
			delete(conns, server)
			mu.Unlock()
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return fmt.Errorf("relay: accept: %w", err)
}

// pump copies src to dst until either fails, then closes both so the
// other direction's pump ends too.
func pump(dst, src net.Conn) {
	buf := make([]byte, 8192)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
}
