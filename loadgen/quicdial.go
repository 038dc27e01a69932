package loadgen

// The only file that knows which package provides the QUIC client.

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/quicclient"
)

// quicDial is what Connect needs of the QUIC client.
type quicDial struct {
	// dial is a pgconn DialFunc whose every call opens a stream on one of
	// cfg.Conns QUIC connections (at most cfg.Streams per connection while
	// others have room); with LocalStartup it answers the startup on the
	// client's side first.
	dial pgconn.DialFunc
	// live counts live connections; close is the Dialer's Close; stats its
	// connections' path statistics.
	live  func() int
	close func() error
	stats func() PathStats
	// warm opens (and closes at once) one stream, so that a QUIC connection
	// and the UDP socket exist: call it inside the client's network
	// namespace, since with LocalStartup later streams are opened from the
	// Dialer's own goroutines.
	warm func(context.Context) error
	// migrate moves every connection to a new local UDP socket (Dialer.Migrate).
	migrate func(context.Context) error
}

func newQUICDial(cfg ClientConfig, logger *slog.Logger) (*quicDial, error) {
	dc := quicclient.DialerConfig{
		Addr:              cfg.dialAddr(),
		Conns:             cfg.Conns,
		MaxStreamsPerConn: cfg.Streams,
		CAFile:            cfg.CAFile,
		PinSHA256:         cfg.PinSHA256,
		Insecure:          cfg.Insecure,
		TLSConfig:         cfg.TLSConfig,
		CertFile:          cfg.CertFile,
		KeyFile:           cfg.KeyFile,
		LocalStartup:      cfg.LocalStartup,
	}
	if cfg.Relay != "" {
		// Verify the target's name, not the relay's.
		host, _, _ := net.SplitHostPort(cfg.Addr)
		tc := &tls.Config{}
		if cfg.TLSConfig != nil {
			tc = cfg.TLSConfig.Clone()
		}
		if tc.ServerName == "" {
			tc.ServerName = host
		}
		dc.TLSConfig = tc
	}
	d, err := quicclient.NewDialer(dc, logger)
	if err != nil {
		return nil, err
	}
	return &quicDial{
		dial:  d.DialFunc(),
		live:  func() int { return d.Stats().Conns },
		close: d.Close,
		stats: func() PathStats {
			st := d.Stats()
			return PathStats{SentPackets: st.PacketsSent, LostPackets: st.PacketsLost, SRTT: st.SmoothedRTT, Conns: st.Conns}
		},
		migrate: func(ctx context.Context) error { return d.Migrate(ctx, nil) },
		warm: func(ctx context.Context) error {
			c, err := d.Dial(ctx)
			if err != nil {
				return err
			}
			return c.Close()
		},
	}, nil
}
