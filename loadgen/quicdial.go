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

// quicDial is what Clients uses of a QUIC Dialer.
type quicDial struct {
	dial    pgconn.DialFunc
	live    func() int       // live connections
	close   func() error     // the Dialer's Close
	stats   func() PathStats // its connections' path statistics
	migrate func(context.Context) error
}

// newQUICDial returns a Dialer's pgconn DialFunc, whose every call opens a
// stream on one of cfg.Conns QUIC connections (at most cfg.Streams per
// connection while others have room), and the rest of quicDial.
func newQUICDial(cfg ClientConfig, logger *slog.Logger) (quicDial, error) {
	dc := quicclient.DialerConfig{
		Addr:              cfg.dialAddr(),
		Conns:             cfg.Conns,
		MaxStreamsPerConn: cfg.Streams,
		CAFile:            cfg.CAFile,
		PinSHA256:         cfg.PinSHA256,
		Insecure:          cfg.Insecure,
		TLSConfig:         cfg.TLSConfig,
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
		return quicDial{}, err
	}
	stats := func() PathStats {
		st := d.Stats()
		return PathStats{SentPackets: st.PacketsSent, LostPackets: st.PacketsLost, SRTT: st.SmoothedRTT, Conns: st.Conns}
	}
	return quicDial{
		dial:    d.DialFunc(),
		live:    func() int { return d.Stats().Conns },
		close:   d.Close,
		stats:   stats,
		migrate: func(ctx context.Context) error { return d.Migrate(ctx, nil) },
	}, nil
}
