package main

import (
	"runtime/debug"

	"github.com/pgquic/pgquic/admin"
)

// newConsole builds the admin console for the running server. It is always
// attached, so a user not in admin_users who asks for the pgquic or
// pgbouncer database is told "not allowed" rather than routed to a server.
func (s *server) newConsole() *admin.Console {
	return admin.New(admin.Config{
		Users:   s.cfg.AdminUsers,
		Version: buildVersion(),
		Mode:    s.cfg.Mode,
		Settings: func() []admin.Setting {
			var out []admin.Setting
			for _, st := range s.cfg.Settings() {
				out = append(out, admin.Setting{Key: st.Key, Value: st.Value, Default: st.Default})
			}
			return out
		},
		Shutdown: s.requestShutdown,
		// Reload stays nil until pgquic can re-read its configuration:
		// RELOAD then answers that it is not supported yet.
	}, s.pooler, s.manager, s.logger.With("component", "admin"))
}

// requestShutdown starts the same drain as SIGTERM; calling it again does
// nothing.
func (s *server) requestShutdown() {
	s.shutdownOnce.Do(func() { close(s.shutdownReq) })
}

// buildVersion is the module version the binary was built from, or
// "(devel)" for a build from a source tree.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
