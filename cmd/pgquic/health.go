package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Health endpoints of the metrics server, for orchestrators' probes
// (Kubernetes liveness and readiness, load-balancer health checks).
const (
	// healthzPath answers 200 while the process serves HTTP at all:
	// liveness. It checks nothing else, so a slow or unreachable database
	// never gets the pooler restarted.
	healthzPath = "/healthz"
	// readyzPath answers 200 when the listeners are up, shutdown has not
	// begun and a backend address accepts a TCP connection (one is enough:
	// with several databases, one of them down must not take every replica
	// out of the load balancer and with it the clients of the others); 503
	// with the reason otherwise. A draining replica so leaves the load
	// balancer while it finishes its open transactions, and one cut off
	// from every database stops receiving clients.
	readyzPath = "/readyz"
)

// backendProbeTimeout bounds the TCP connect to one backend address, and
// backendProbeTTL is how long a result is reused, so frequent probes from
// several sources do not each dial the database.
const (
	backendProbeTimeout = time.Second
	backendProbeTTL     = time.Second
)

// health is the state /readyz reports. serving and draining are set by
// server.Run; the backend check runs on demand and its result is cached.
type health struct {
	serving  atomic.Bool
	draining atomic.Bool
	// backends are the network and address of every configured backend
	// host, e.g. {"tcp", "10.0.0.5:5432"} or {"unix", "/run/.s.PGSQL.5432"}.
	backends [][2]string
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)

	mu      sync.Mutex
	checked time.Time
	lastErr error
}

// newHealth collects the backend addresses to probe from PostgreSQL
// connection strings; a string that does not parse is reported at once.
func newHealth(connStrings []string) (*health, error) {
	h := &health{dial: (&net.Dialer{}).DialContext}
	seen := map[[2]string]bool{}
	for _, cs := range connStrings {
		pc, err := pgconn.ParseConfig(cs)
		if err != nil {
			return nil, fmt.Errorf("health check: %w", err)
		}
		add := func(host string, port uint16) {
			a := [2]string{"tcp", net.JoinHostPort(host, strconv.Itoa(int(port)))}
			if len(host) > 0 && host[0] == '/' {
				a = [2]string{"unix", fmt.Sprintf("%s/.s.PGSQL.%d", host, port)}
			}
			if !seen[a] {
				seen[a] = true
				h.backends = append(h.backends, a)
			}
		}
		add(pc.Host, pc.Port)
		for _, fb := range pc.Fallbacks {
			add(fb.Host, fb.Port)
		}
	}
	return h, nil
}

// ready returns nil when the pooler should receive clients, else why not.
func (h *health) ready(ctx context.Context) error {
	if h.draining.Load() {
		return errors.New("draining: shutting down")
	}
	if !h.serving.Load() {
		return errors.New("starting: listeners not serving yet")
	}
	return h.backendsReachable(ctx)
}

// backendsReachable connects to the backend addresses in turn (TCP only,
// no authentication) until one accepts, reusing a result younger than
// backendProbeTTL. It returns the last failure when none accepts.
func (h *health) backendsReachable(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.checked.IsZero() && time.Since(h.checked) < backendProbeTTL {
		return h.lastErr
	}
	var err error
	for _, a := range h.backends {
		dctx, cancel := context.WithTimeout(ctx, backendProbeTimeout)
		c, derr := h.dial(dctx, a[0], a[1])
		cancel()
		if derr == nil {
			_ = c.Close()
			err = nil
			break
		}
		err = fmt.Errorf("backend %s unreachable: %w", a[1], derr)
	}
	h.checked, h.lastErr = time.Now(), err
	return err
}

// register adds the two endpoints to mux.
func (h *health) register(mux *http.ServeMux) {
	mux.HandleFunc(healthzPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc(readyzPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := h.ready(r.Context()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
}
