package quicclient

import (
	"testing"

	"github.com/pgquic/pgquic/internal/depcheck"
)

// TestClientDoesNotDragTheServer keeps what applications import small: the
// client reaches quic-go, the standard library and stdlib-only internal
// packages of this module, never the pooler, its server connection pools
// (and puddle under them), the fronts or the Prometheus client.
func TestClientDoesNotDragTheServer(t *testing.T) {
	depcheck.Forbid(t, "github.com/pgquic/pgquic/quicclient",
		"github.com/pgquic/pgquic/pooler",
		"github.com/pgquic/pgquic/backend",
		"github.com/pgquic/pgquic/quicfront",
		"github.com/pgquic/pgquic/tcpfront",
		"github.com/pgquic/pgquic/edge",
		"github.com/jackc/puddle",
		"github.com/prometheus/client_golang",
		"github.com/jackc/pgx",
	)
}
