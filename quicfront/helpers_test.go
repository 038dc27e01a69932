package quicfront

import (
	"log/slog"
	"testing"

	"go.uber.org/goleak"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/quicclient"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testServer is a Server run for one test, with its metrics registry.
type testServer struct {
	*Server
	reg *prometheus.Registry
	run *quictest.Running
}

// startServer starts a server on a free loopback port (or cfg.Addr) and
// shuts it down at cleanup.
func startServer(t testing.TB, cfg ServerConfig, h front.Handler) *testServer {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	s, reg, run := quictest.StartServer(t, func(log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
		return NewServer(cfg, h, log, reg)
	})
	return &testServer{Server: s, reg: reg, run: run}
}

// stop shuts the server down gracefully and waits for Serve to return.
func (ts *testServer) stop(t testing.TB) { ts.run.Stop(t) }

// newTestDialer returns a client Dialer closed at cleanup.
func newTestDialer(t testing.TB, cfg quicclient.DialerConfig) *quicclient.Dialer {
	t.Helper()
	d, err := quicclient.NewDialer(cfg, quictest.Logger(t))
	return quictest.Closing(t, d, err)
}
