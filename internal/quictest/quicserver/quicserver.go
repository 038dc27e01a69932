// Package quicserver runs a QUIC server front for the tests of the packages
// that dial one (quicclient, edge). It is apart from quictest because it
// imports quicfront, whose own tests use quictest.
package quicserver

import (
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/quicfront"
)

// Start runs a server front with cfg and handler h on a free loopback port
// until the test ends, and returns it with its metrics registry.
func Start(t testing.TB, cfg quicfront.ServerConfig, h front.Handler) (*quicfront.Server, *prometheus.Registry) {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	s, reg, _ := quictest.StartServer(t, func(log *slog.Logger, reg prometheus.Registerer) (*quicfront.Server, error) {
		return quicfront.NewServer(cfg, h, log, reg)
	})
	return s, reg
}
