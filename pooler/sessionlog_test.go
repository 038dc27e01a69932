package pooler

import (
	"bytes"
	"log/slog"
	"net"
	"testing"
)

// TestSessionLoggerMatchesWith checks that a session's logger writes what a
// logger made with With would: the session's attributes first, then the
// record's, through With and WithGroup too, at the levels the pooler's
// handler takes.
func TestSessionLoggerMatchesWith(t *testing.T) {
	client := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 5000}
	for _, tc := range []struct {
		name           string
		client         net.Addr
		named          bool
		user, database string
	}{
		{name: "anonymous", client: client},
		{name: "no address"},
		{name: "named", client: client, named: true, user: "alice", database: "app db"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got, want bytes.Buffer
			opts := &slog.HandlerOptions{Level: slog.LevelInfo,
				ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
					if a.Key == slog.TimeKey {
						return slog.Attr{}
					}
					return a
				}}
			base := slog.New(slog.NewTextHandler(&got, opts)).With("component", "pooler")
			ref := slog.New(slog.NewTextHandler(&want, opts)).With("component", "pooler")
			attrs := []any{"transport", "quic"}
			if tc.client != nil {
				attrs = append(attrs, "client", tc.client.String())
			}
			if tc.named {
				attrs = append(attrs, "user", tc.user, "database", tc.database)
			}
			l := newSessionLogger(base, "quic", tc.client, tc.named, tc.user, tc.database)
			r := ref.With(attrs...)
			for _, lg := range []struct{ l, r *slog.Logger }{{l, r}, {l.With("k", 1), r.With("k", 1)},
				{l.WithGroup("g").With("k", 2), r.WithGroup("g").With("k", 2)}} {
				lg.l.Info("hello", "n", 3, slog.Group("grp", "a", "b"))
				lg.r.Info("hello", "n", 3, slog.Group("grp", "a", "b"))
				lg.l.Debug("not shown", "n", 4)
				lg.r.Debug("not shown", "n", 4)
				lg.l.Warn("no attributes")
				lg.r.Warn("no attributes")
			}
			if got.String() != want.String() {
				t.Errorf("session logger wrote\n%s\nwant (With)\n%s", got.String(), want.String())
			}
			if got.Len() == 0 {
				t.Error("nothing logged")
			}
		})
	}
}
