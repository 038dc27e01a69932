package quicfront

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/quicclient"
)

// BenchmarkStreamRoundTrip measures opening a stream on a warm connection,
// one startup-sized round trip through the echo handler, and closing it.
func BenchmarkStreamRoundTrip(b *testing.B) {
	s := startServer(b, ServerConfig{}, quictest.Echo{})
	d := newTestDialer(b, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	msg := quictest.StartupBytes()
	buf := make([]byte, len(msg))
	roundTrip := func() {
		_ = dialRoundTrip(ctx, b, d, msg, buf).Close()
	}
	roundTrip() // dial the connection outside the measurement
	b.ReportAllocs()
	for b.Loop() {
		roundTrip()
	}
}

// BenchmarkStreamRoundTripParallel runs the same round trip from many
// goroutines over four connections.
func BenchmarkStreamRoundTripParallel(b *testing.B) {
	s := startServer(b, ServerConfig{}, quictest.Echo{})
	d := newTestDialer(b, quicclient.DialerConfig{Addr: s.Addr().String(), PinSHA256: s.Fingerprint(), Conns: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	msg := quictest.StartupBytes()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, len(msg))
		for pb.Next() {
			c, err := d.Dial(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if _, err := c.Write(msg); err != nil {
				b.Error(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Error(err)
			}
			_ = c.Close()
		}
	})
}
