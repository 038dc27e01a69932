package quicwire

import (
	"context"
	"os"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlog"
	"github.com/quic-go/quic-go/qlogwriter"
)

// QlogTracer is the quic.Config Tracer of every pgquic QUIC endpoint: it
// is nil (no tracing, no cost) unless the QLOGDIR environment variable
// names a directory, and then quic-go writes one qlog file per connection
// there (quic-go's own convention), which is how a path validation, a
// loss or a PTO is timed when debugging.
func QlogTracer() func(context.Context, bool, quic.ConnectionID) qlogwriter.Trace {
	if os.Getenv("QLOGDIR") == "" {
		return nil
	}
	return qlog.DefaultConnectionTracer
}
