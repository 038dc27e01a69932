package pooler

import (
	"context"
	"log/slog"
	"net"
)

// sessionHandler is the handler of a session's logger: the pooler's
// handler, with the session's attributes (transport, client address, and
// once known user and database) put in front of each record's own as the
// record is handled. A logger made with With formats those attributes
// ahead of time into its own copy of the handler: with a text or JSON
// handler a few hundred bytes that each session kept for its whole life,
// although an idle session logs nothing. Records come out the same.
type sessionHandler struct {
	h         slog.Handler
	transport string
	client    net.Addr // nil when unknown
	named     bool     // user and database are known
	user      string
	database  string
}

// newSessionLogger returns a logger for a session on transport from
// client, adding user and database when named.
func newSessionLogger(base *slog.Logger, transport string, client net.Addr, named bool, user, database string) *slog.Logger {
	return slog.New(&sessionHandler{h: base.Handler(), transport: transport, client: client,
		named: named, user: user, database: database})
}

// attrs returns the session's attributes, in the order a With would have
// added them.
func (h *sessionHandler) attrs() []slog.Attr {
	as := make([]slog.Attr, 0, 4)
	as = append(as, slog.String("transport", h.transport))
	if h.client != nil {
		as = append(as, slog.String("client", h.client.String()))
	}
	if h.named {
		as = append(as, slog.String("user", h.user), slog.String("database", h.database))
	}
	return as
}

// Enabled reports whether the pooler's handler takes records at level l.
func (h *sessionHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.h.Enabled(ctx, l)
}

// Handle passes r to the pooler's handler with the session's attributes in
// front of its own.
func (h *sessionHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(h.attrs()...)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(a)
		return true
	})
	return h.h.Handle(ctx, out)
}

// WithAttrs returns the pooler's handler with the session's attributes and
// then as.
func (h *sessionHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return h.h.WithAttrs(append(h.attrs(), as...))
}

// WithGroup returns the pooler's handler with the session's attributes,
// then the group.
func (h *sessionHandler) WithGroup(name string) slog.Handler {
	return h.h.WithAttrs(h.attrs()).WithGroup(name)
}
