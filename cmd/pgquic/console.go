package main

import (
	"context"
	"errors"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/pgquic/pgquic/admin"
	"github.com/pgquic/pgquic/backend"
)

// newConsole builds the admin console for the running server. It is always
// attached, so a user not in admin_users who asks for the pgquic or
// pgbouncer database is told "not allowed" rather than routed to a server.
// It reports the pools and settings in force, which a reload replaces, asks
// the configuration in force who is an admin user (so SHOW CONFIG's
// admin_users is the list enforced, and a reload that removes a user locks
// it out at once), and its RELOAD does what SIGHUP does.
func (s *server) newConsole() *admin.Console {
	return admin.New(admin.Config{
		CurrentUsers: func() []string { return s.live.cfg.Load().AdminUsers },
		Version:      buildVersion(),
		Mode:         s.cfg.Mode,
		Settings: func() []admin.Setting {
			var out []admin.Setting
			for _, st := range s.live.cfg.Load().Settings() {
				top, _, _ := strings.Cut(st.Key, ".")
				out = append(out, admin.Setting{Key: st.Key, Value: st.Value, Default: st.Default,
					Changeable: slices.Contains(reloadKeys, top)})
			}
			return out
		},
		Shutdown: s.requestShutdown,
		Reload:   s.reloadFromConsole,
	}, s.pooler, livePools{&s.live}, s.logger.With("component", "admin"))
}

// livePools lists the pools of the Manager in force.
type livePools struct{ r *reloadable }

// NamedPools implements admin.PoolLister.
func (l livePools) NamedPools() []backend.NamedPool {
	if m := l.r.manager.Load(); m != nil {
		return m.NamedPools()
	}
	return nil
}

// requestShutdown starts the same drain as SIGTERM; calling it again does
// nothing.
func (s *server) requestShutdown() {
	s.shutdownOnce.Do(func() { close(s.shutdownReq) })
}

// errNoServeArgs is RELOAD's answer in a server not started by runServe
// (tests), which has no command line to re-read.
var errNoServeArgs = errors.New("this server was not started from a command line it could re-read")

// reloadFromConsole is RELOAD: it re-reads the --config file and the flags
// as SIGHUP does, and reports why a rejected configuration was not applied.
func (s *server) reloadFromConsole() error {
	args := s.serveArgs.Load()
	if args == nil {
		return errNoServeArgs
	}
	return s.reloadFromFlags(context.Background(), *args)
}

// serveArgsRef holds the serve command line, for RELOAD.
type serveArgsRef = atomic.Pointer[[]string]

// buildVersion is the module version the binary was built from, or
// "(devel)" for a build from a source tree.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
