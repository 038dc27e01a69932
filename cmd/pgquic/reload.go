package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"gopkg.in/yaml.v3"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/pooler"
)

// reloadable holds what a configuration reload replaces while sessions run.
// The pooler reaches the server pools and the authenticator through it, and
// the TCP front its certificate, so a reload swaps pointers and nothing that
// serves a session has to stop.
type reloadable struct {
	cfg     atomic.Pointer[config.Config]
	manager atomic.Pointer[backend.Manager]
	authn   atomic.Pointer[pgauth.Authenticator]
	edges   atomic.Pointer[pgauth.EdgeTrust] // nil: no edge_trust file
	cert    atomic.Pointer[tls.Certificate]
	mu      sync.Mutex // serialises reloads and the final close
	closed  bool       // the server shut down: reloads are refused
}

// Pool implements pooler.PoolSource with the current Manager. A session
// that looked its pool up before a reload is sent to the new Manager's
// pool when it next acquires (the old pool answers ErrPoolClosed).
func (r *reloadable) Pool(ctx context.Context, database, user string) (*backend.Pool, error) {
	m := r.manager.Load()
	if m == nil {
		return nil, fmt.Errorf("backend: pool for %s/%s: %w", database, user, backend.ErrPoolClosed)
	}
	return m.Pool(ctx, database, user)
}

// Authenticate implements pooler.Authenticator with the current userlist
// and method.
func (r *reloadable) Authenticate(ctx context.Context, ex pooler.AuthExchange, user string, peer net.Addr) error {
	return r.authn.Load().Authenticate(ctx, ex, user, peer)
}

// Edge implements pooler.EdgeTrust with the edge_trust table in force.
func (r *reloadable) Edge(certs []*x509.Certificate) (*pgauth.EdgeGrant, bool) {
	return r.edges.Load().Edge(certs)
}

// ZeroRTTReadOnly implements pooler.ZeroRTTPolicy with the zero_rtt in
// force for the route, so a reload that turns it off applies to the next
// 0-RTT request.
func (r *reloadable) ZeroRTTReadOnly(database, user string) bool {
	return r.cfg.Load().ZeroRTTFor(database, user) == config.ZeroRTTReadOnly
}

// certificate is the TCP front's tls.Config.GetCertificate.
func (r *reloadable) certificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cert.Load(), nil
}

// reloadKeys are the configuration keys a reload applies; a change to any
// other key is reported as waiting for a restart. The QUIC front keeps its
// certificate (clients pin its fingerprint) and the listeners, the mode and
// the limits the fronts were built with stay as they are.
var reloadKeys = []string{
	"backend", "databases", "pool_size", "min_pool", "max_pools", "pool_idle_timeout",
	"server_lifetime", "server_idle_timeout", "server_connect_timeout",
	"auth", "edge_trust", "tls_cert", "tls_key", "tls_session_ticket_keys_file", "admin_users",
	"query_wait_timeout", "idle_transaction_timeout", "client_idle_timeout", "query_timeout",
	"shutdown_grace", "zero_rtt",
}

// poolKeys are the keys whose change needs new server pools.
var poolKeys = []string{"backend", "databases", "pool_size", "min_pool", "max_pools", "pool_idle_timeout",
	"server_lifetime", "server_idle_timeout", "server_connect_timeout"}

// ErrReloadRejected wraps the reason a new configuration was not applied;
// the running one is kept whole.
var ErrReloadRejected = errors.New("configuration not reloaded")

// Reload applies next, a validated configuration with defaults applied, to
// the running server without dropping sessions: new server pools when the
// routes or pool settings changed (transactions in progress finish on the
// old ones, which then close), the authenticator (method, userlist), the
// TCP front's certificate, the pooler's timeouts, the shutdown grace and
// admin_users (the console reads it from the configuration in force, so
// storing next is what applies it).
// Everything is built before anything is swapped, so an error (an
// unreadable userlist or certificate, a route the backend refuses) leaves
// the old configuration in force. It returns the keys applied and those
// that need a restart.
func (s *server) Reload(ctx context.Context, next *config.Config) (applied, restart []string, err error) {
	s.live.mu.Lock()
	defer s.live.mu.Unlock()
	if s.live.closed {
		return nil, nil, fmt.Errorf("%w: the server is shutting down", ErrReloadRejected)
	}
	prev := s.live.cfg.Load()
	changed, err := changedKeys(prev, next)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrReloadRejected, err)
	}
	for _, k := range changed {
		if slices.Contains(reloadKeys, k) {
			applied = append(applied, k)
		} else {
			restart = append(restart, k)
		}
	}
	if s.quic != nil && next.AnyZeroRTT() != s.cfg.AnyZeroRTT() {
		// The pooler asks the zero_rtt in force at each 0-RTT request, so
		// turning a route off applies at once; but the QUIC front's
		// listener accepts 0-RTT or not from its start: turning it on
		// where it started off takes a restart (and a listener left
		// accepting 0-RTT with every route off only holds each request
		// until the handshake is confirmed).
		restart = append(restart, "zero_rtt")
	}
	if (next.TLSCert == "") != (prev.TLSCert == "") {
		return nil, nil, fmt.Errorf("%w: tls_cert: turning TLS on or off needs a restart", ErrReloadRejected)
	}
	if prev.Backend == "" && len(prev.Databases) == 0 && (next.Backend != "" || len(next.Databases) != 0) {
		return nil, nil, fmt.Errorf("%w: backend: the throwaway PostgreSQL cannot be replaced by a reload; restart with --backend", ErrReloadRejected)
	}

	authn, err := newAuthenticator(next)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrReloadRejected, err)
	}
	edges, err := loadEdgeTrust(next)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrReloadRejected, err)
	}
	ticketKeys, applied, restart, err := s.reloadTicketKeys(prev, next, applied, restart)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrReloadRejected, err)
	}
	var cert *tls.Certificate
	if next.TLSCert != "" {
		c, err := tls.LoadX509KeyPair(next.TLSCert, next.TLSKey)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: load TLS certificate: %w", ErrReloadRejected, err)
		}
		cert = &c
	}
	timeouts := pooler.Timeouts{Acquire: next.AcquireTimeout, IdleTransaction: next.IdleTransactionTimeout,
		ClientIdle: next.ClientIdleTimeout, Query: next.QueryTimeout}
	var mgr *backend.Manager
	if slices.ContainsFunc(changed, func(k string) bool { return slices.Contains(poolKeys, k) }) {
		if mgr, err = s.newManager(ctx, next, s.routesFor(next)); err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrReloadRejected, err)
		}
	}

	// Everything is built: swap.
	if err := s.pooler.SetTimeouts(timeouts); err != nil {
		if mgr != nil {
			mgr.Close()
		}
		return nil, nil, fmt.Errorf("%w: %w", ErrReloadRejected, err)
	}
	s.live.authn.Store(authn)
	s.live.edges.Store(edges)
	s.setTicketKeys(ticketKeys)
	if cert != nil {
		s.live.cert.Store(cert)
	}
	if mgr != nil {
		old := s.live.manager.Swap(mgr)
		if old != nil {
			// Close waits for the connections lent out: the transactions
			// running on the old pools finish there.
			s.retiring.Go(old.Close)
		}
	}
	s.live.cfg.Store(next)
	return applied, restart, nil
}

// changedKeys lists the top-level configuration keys whose values differ
// between a and b, by their YAML form.
func changedKeys(a, b *config.Config) ([]string, error) {
	ma, err := yamlMap(a)
	if err != nil {
		return nil, err
	}
	mb, err := yamlMap(b)
	if err != nil {
		return nil, err
	}
	var keys []string
	for k, v := range mb {
		if !reflect.DeepEqual(ma[k], v) {
			keys = append(keys, k)
		}
	}
	for k := range ma {
		if _, ok := mb[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys, nil
}

func yamlMap(c *config.Config) (map[string]any, error) {
	b, err := yaml.Marshal(c)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// reloadFromFlags re-reads the configuration the way serve started (the
// --config file, then the command-line flags over it) and applies it,
// logging what changed, what waits for a restart, or why nothing was
// applied. It is what SIGHUP does.
func (s *server) reloadFromFlags(ctx context.Context, args []string) error {
	var errBuf strings.Builder
	next, err := parseServeFlags(args, &errBuf, &errBuf)
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrReloadRejected, err)
		s.logger.Error("reload rejected; the running configuration is kept", "err", err)
		return err
	}
	applied, restart, err := s.Reload(ctx, next)
	if err != nil {
		s.logger.Error("reload rejected; the running configuration is kept", "err", err)
		return err
	}
	s.logger.Info("configuration reloaded", "changed", strings.Join(applied, ","))
	if len(restart) > 0 {
		s.logger.Warn("changed settings that take effect only after a restart", "keys", strings.Join(restart, ","))
	}
	return nil
}
