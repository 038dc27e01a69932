// Package admin is pgquic's admin console: the virtual databases "pgquic"
// and "pgbouncer" (an alias, so PgBouncer's tools work unchanged), where
// the users named in admin_users run PgBouncer's console commands over the
// simple query protocol: SHOW POOLS, CLIENTS, SERVERS, STATS, DATABASES,
// CONFIG, VERSION, LISTS, STATE, and PAUSE, RESUME, KILL, SHUTDOWN, RELOAD.
//
// Result sets carry PgBouncer's column names, order and types wherever
// pgquic has the same concept, so pgbouncer_exporter and runbooks written
// for PgBouncer read them. The console is plugged into the pooler with
// pooler.SetConsole: clients log in to it through the same fronts and the
// same authentication as any other client.
package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/backend"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/pooler"
)

// Databases are the virtual databases that reach the console.
var Databases = []string{"pgquic", "pgbouncer"}

// Setting is one row of SHOW CONFIG.
type Setting struct {
	// Key is the configuration file key.
	Key string
	// Value and Default are the value in force and the built-in default.
	Value, Default string
	// Changeable says whether RELOAD applies a change to it while sessions
	// run (otherwise it waits for a restart).
	Changeable bool
}

// PoolLister lists the server pools with the names clients use for them.
// *backend.Manager implements it.
type PoolLister interface {
	NamedPools() []backend.NamedPool
}

// Config tells the console who may use it and what it reports. Zero fields
// mean their documented defaults.
type Config struct {
	// Users may use the console; everyone else is refused with FATAL
	// 08P01 "not allowed", as PgBouncer refuses users not in its
	// admin_users. Default: nobody.
	Users []string
	// CurrentUsers, when set, replaces Users: it is asked at every login
	// and before every command, so a reload that removes a user from
	// admin_users locks that user out at once, open sessions included
	// (their next command ends the session with FATAL 42501). cmd/pgquic
	// returns the admin_users of the configuration in force, the value
	// SHOW CONFIG shows. Default: nil (Users).
	CurrentUsers func() []string
	// Version is reported by SHOW VERSION after "pgquic ". Default: "(devel)".
	Version string
	// Mode is the pooling mode SHOW POOLS and SHOW DATABASES report.
	// Default: "transaction".
	Mode string
	// Settings lists SHOW CONFIG's rows. Default: none.
	Settings func() []Setting
	// Shutdown starts the same drain as SIGTERM; SHUTDOWN calls it. Nil
	// makes SHUTDOWN an error.
	Shutdown func()
	// Reload re-reads and applies the configuration (cmd/pgquic: what
	// SIGHUP does); RELOAD calls it and reports its error with SQLSTATE
	// F0000. Nil makes RELOAD an error saying it is not supported.
	Reload func() error
	// StatsPeriod is the period SHOW STATS's avg_* columns average over
	// (PgBouncer's stats_period). Default: DefaultStatsPeriod.
	StatsPeriod time.Duration
}

// Console serves the admin console. It implements pooler.Console.
type Console struct {
	cfg   Config
	p     *pooler.Pooler
	pools PoolLister
	log   *slog.Logger
	stats *statsPeriods
}

var _ pooler.Console = (*Console)(nil)

// New builds a console reporting on p and pools. A nil logger discards
// logs. Attach it with p.SetConsole.
func New(cfg Config, p *pooler.Pooler, pools PoolLister, logger *slog.Logger) *Console {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = "(devel)"
	}
	if cfg.Mode == "" {
		cfg.Mode = string(pooler.ModeTransaction)
	}
	if cfg.StatsPeriod <= 0 {
		cfg.StatsPeriod = DefaultStatsPeriod
	}
	return &Console{cfg: cfg, p: p, pools: pools, log: logger, stats: &statsPeriods{length: cfg.StatsPeriod}}
}

// IsConsole reports whether database is one of Databases.
func (c *Console) IsConsole(database string) bool {
	return slices.Contains(Databases, database)
}

// Allowed reports whether user may use the console now: one of
// Config.CurrentUsers() when set, else of Config.Users.
func (c *Console) Allowed(user string) bool {
	if c.cfg.CurrentUsers != nil {
		return slices.Contains(c.cfg.CurrentUsers(), user)
	}
	return slices.Contains(c.cfg.Users, user)
}

// consoleError is an error answered to a console command: ERROR with its
// SQLSTATE, then ReadyForQuery.
type consoleError struct {
	code, msg string
}

func (e *consoleError) Error() string { return e.code + ": " + e.msg }

func errorf(code, format string, args ...any) error {
	return &consoleError{code: code, msg: fmt.Sprintf(format, args...)}
}

// SQLSTATEs of the console's own errors, beyond those of internal/pgproto.
const (
	codeSyntaxError      = "42601" // syntax_error: unknown command
	codeObjectNotInState = "55000" // object_not_in_prerequisite_state: already paused, not paused
)

// errNoLongerAdmin ends a console session whose user was removed from
// admin_users while it was open.
var errNoLongerAdmin = errors.New("user no longer in admin_users")

// Serve runs one console session: simple Query messages only, as
// PgBouncer's console. Extended-protocol messages end the session with
// FATAL 0A000 saying so. Every command first checks that the user is still
// allowed (a reload may have removed it from admin_users since the login);
// if not, the session ends with FATAL 42501 before the command runs.
func (c *Console) Serve(ctx context.Context, conn *pooler.ConsoleConn) error {
	log := c.log.With("user", conn.User(), "session", conn.ID())
	for {
		typ, body, err := conn.Next()
		if err != nil {
			return err
		}
		if typ != 'X' && !c.Allowed(conn.User()) {
			log.Info("admin console session ended: user no longer in admin_users")
			_ = c.fatal(conn, pgproto.CodeInsufficientPrivilege,
				fmt.Sprintf("permission denied: user %q is no longer in admin_users", conn.User()))
			return errNoLongerAdmin
		}
		switch typ {
		case 'X':
			return nil
		case 'Q':
			q := strings.TrimRight(string(body), "\x00")
			out := c.exec(ctx, log, q, nil)
			out, _ = (&pgproto3.ReadyForQuery{TxStatus: 'I'}).Encode(out)
			if err := conn.Write(out); err != nil {
				return err
			}
		case 'P', 'B', 'E', 'D', 'C', 'S', 'H', 'F':
			return c.fatal(conn, pgproto.CodeFeatureNotSupported,
				"extended query protocol not supported by admin console: use the simple query protocol (psql, or your driver's simple protocol mode)")
		default:
			return c.fatal(conn, pgproto.CodeProtocolViolation, fmt.Sprintf("unsupported message type for admin console: %q", typ))
		}
	}
}

// fatal sends FATAL code msg and ends the session.
func (c *Console) fatal(conn *pooler.ConsoleConn, code, msg string) error {
	out, _ := (&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code, Message: msg}).Encode(nil)
	_ = conn.Write(out)
	return errors.New(msg)
}

// exec runs one query string and appends its answer (without
// ReadyForQuery) to dst.
func (c *Console) exec(ctx context.Context, log *slog.Logger, q string, dst []byte) []byte {
	cmd, arg, err := parse(q)
	if err == nil && cmd == "" {
		out, _ := (&pgproto3.EmptyQueryResponse{}).Encode(dst)
		return out
	}
	var res *result
	var tag string
	if err == nil {
		res, tag, err = c.run(ctx, log, cmd, arg)
	}
	if err != nil {
		var ce *consoleError
		if !errors.As(err, &ce) {
			ce = &consoleError{code: pgproto.CodeConnectionFailure, msg: err.Error()}
		}
		log.Info("admin console command failed", "query", q, "sqlstate", ce.code, "err", ce.msg)
		out, _ := (&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: ce.code, Message: ce.msg}).Encode(dst)
		return out
	}
	if res == nil {
		out, _ := (&pgproto3.CommandComplete{CommandTag: []byte(tag)}).Encode(dst)
		return out
	}
	return res.encode(dst, tag)
}

// maxArg bounds a command's argument, as PgBouncer bounds it (64 bytes).
const maxArg = 64

// parse splits a console query into its lower-cased command word and its
// optional argument (a word or a double-quoted name), accepting trailing
// semicolons and whitespace as PgBouncer does. An empty query gives an
// empty command.
func parse(q string) (cmd, arg string, err error) {
	t := strings.TrimSpace(q)
	for strings.HasSuffix(t, ";") {
		t = strings.TrimSpace(strings.TrimSuffix(t, ";"))
	}
	if t == "" {
		return "", "", nil
	}
	fields := strings.Fields(t)
	bad := errorf(codeSyntaxError, "invalid command %q, use SHOW HELP;", q)
	if len(fields) > 2 || !isWord(fields[0]) {
		return "", "", bad
	}
	cmd = strings.ToLower(fields[0])
	if len(fields) == 2 {
		arg = fields[1]
		switch {
		case len(arg) >= 2 && arg[0] == '"' && arg[len(arg)-1] == '"':
			arg = arg[1 : len(arg)-1]
			if arg == "" || strings.Contains(arg, `"`) {
				return "", "", bad
			}
		case !isWord(arg):
			return "", "", bad
		}
		if len(arg) > maxArg {
			return "", "", errorf(codeSyntaxError, "argument too long: at most %d bytes", maxArg)
		}
	}
	return cmd, arg, nil
}

// isWord reports whether s is a SQL word: letters, digits and underscores.
func isWord(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// run executes a parsed command. A nil result with a tag is a command that
// returns no rows.
func (c *Console) run(ctx context.Context, log *slog.Logger, cmd, arg string) (*result, string, error) {
	switch cmd {
	case "show":
		res, err := c.show(strings.ToLower(arg))
		return res, "SHOW", err
	case "pause":
		log.Info("PAUSE command issued", "database", arg)
		return nil, "PAUSE", c.pause(ctx, arg)
	case "resume":
		log.Info("RESUME command issued", "database", arg)
		return nil, "RESUME", c.resume(arg)
	case "kill":
		log.Info("KILL command issued", "database", arg)
		return nil, "KILL", c.kill(arg)
	case "shutdown":
		if arg != "" {
			return nil, "", errorf(codeSyntaxError, "SHUTDOWN takes no argument in pgquic (it drains as SIGTERM does)")
		}
		if c.cfg.Shutdown == nil {
			return nil, "", errorf(pgproto.CodeFeatureNotSupported, "SHUTDOWN is not available in this process")
		}
		log.Info("SHUTDOWN command issued")
		c.cfg.Shutdown()
		return nil, "SHUTDOWN", nil
	case "reload":
		if arg != "" {
			return nil, "", errorf(codeSyntaxError, "RELOAD takes no argument")
		}
		if c.cfg.Reload == nil {
			return nil, "", errorf(pgproto.CodeFeatureNotSupported,
				"RELOAD is not supported yet: pgquic cannot re-read its configuration while running; restart it to apply a change")
		}
		log.Info("RELOAD command issued")
		if err := c.cfg.Reload(); err != nil {
			return nil, "", errorf("F0000", "RELOAD failed, the configuration in force is kept: %v", err)
		}
		return nil, "RELOAD", nil
	}
	return nil, "", errorf(codeSyntaxError, "invalid command %q, use SHOW HELP;", cmd)
}

// checkTarget refuses the console's own databases as a PAUSE, RESUME or
// KILL target, as PgBouncer does.
func (c *Console) checkTarget(verb, db string) error {
	if c.IsConsole(db) {
		return errorf(pgproto.CodeFeatureNotSupported, "cannot %s admin db: %s", verb, db)
	}
	return nil
}

// poolsOf returns the pools of database ("" for all).
func (c *Console) poolsOf(db string) []*backend.Pool {
	var out []*backend.Pool
	for _, np := range c.pools.NamedPools() {
		if db == "" || np.Database == db {
			out = append(out, np.Pool)
		}
	}
	return out
}

func (c *Console) pause(ctx context.Context, db string) error {
	if err := c.checkTarget("pause", db); err != nil {
		return err
	}
	if err := c.p.Pause(ctx, db); err != nil {
		if errors.Is(err, pooler.ErrAlreadyPaused) {
			return errorf(codeObjectNotInState, "%v", err)
		}
		if errors.Is(err, pooler.ErrShuttingDown) {
			return errorf(pgproto.CodeAdminShutdown, "pooler is shutting down")
		}
		return err
	}
	// Every transaction of db has ended: close the server connections, so
	// the server can be restarted, and open none until RESUME. A
	// connection a session has just given up may still be on its way back
	// to the pool; it is closed once there.
	t := time.NewTicker(pauseCheckEvery)
	defer t.Stop()
	for _, pool := range c.poolsOf(db) {
		for pool.Pause(); pool.Stat().Total > pool.Stat().Constructing; pool.Pause() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
		}
	}
	return nil
}

// pauseCheckEvery is how often PAUSE looks again at connections still on
// their way back to a pool.
const pauseCheckEvery = 10 * time.Millisecond

func (c *Console) resume(db string) error {
	if err := c.checkTarget("resume", db); err != nil {
		return err
	}
	if err := c.p.Resume(db); err != nil {
		if errors.Is(err, pooler.ErrNotPaused) {
			return errorf(codeObjectNotInState, "%v", err)
		}
		return err
	}
	for _, pool := range c.poolsOf(db) {
		pool.Resume()
	}
	return nil
}

func (c *Console) kill(db string) error {
	if err := c.checkTarget("kill", db); err != nil {
		return err
	}
	n := c.p.Kill(db)
	closed := 0
	for _, pool := range c.poolsOf(db) {
		closed += pool.Pause()
	}
	c.log.Info("KILL done", "database", db, "clients", n, "idle_servers_closed", closed)
	return nil
}
