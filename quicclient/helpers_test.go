package quicclient

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/pgquic/pgquic/internal/quictest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newTestDialer returns a Dialer closed at cleanup.
func newTestDialer(t testing.TB, cfg DialerConfig) *Dialer {
	t.Helper()
	d, err := NewDialer(cfg, quictest.Logger(t))
	return quictest.Closing(t, d, err)
}
