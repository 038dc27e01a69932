package loadgen

// The only file that knows which package provides the QUIC client.

import (
	"crypto/tls"
	"log/slog"
	"net"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/quicclient"
)

// newQUICDial returns a pgconn DialFunc whose every call opens a stream on
// one of cfg.Conns QUIC connections (at most cfg.Streams per connection
// while others have room), a function counting live connections, the
// Dialer's Close and its connections' path statistics.
func newQUICDial(cfg ClientConfig, logger *slog.Logger) (pgconn.DialFunc, func() int, func() error, func() PathStats, error) {
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
		return nil, nil, nil, nil, err
	}
	stats := func() PathStats {
		st := d.Stats()
		return PathStats{SentPackets: st.PacketsSent, LostPackets: st.PacketsLost, SRTT: st.SmoothedRTT, Conns: st.Conns}
	}
	return d.DialFunc(), func() int { return d.Stats().Conns }, d.Close, stats, nil
}
