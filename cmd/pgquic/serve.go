package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/pgquic/pgquic/config"
)

// serveUsage heads the serve subcommand's --help output.
const serveUsage = `Usage: pgquic serve [--config FILE] [--backend URL] [flags]

Runs the pooler. Clients connect over TCP (TLS via SSLRequest when a
certificate is configured) or over QUIC (one stream per session). Flags
override the configuration file; an empty listen address disables that
listener. Without --backend and without databases in the file, a throwaway
PostgreSQL is started for development and its URL is logged.

Flags:
`

// runServe is the serve subcommand.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseServeFlags(args, stdout, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if errors.Is(err, errUsage) {
			return 2
		}
		fmt.Fprintf(stderr, "pgquic serve: %v\n", err)
		return 2
	}
	logger, err := newLogger(stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		fmt.Fprintf(stderr, "pgquic serve: %v\n", err)
		return 2
	}
	setProcs(cfg.Procs, logger)
	// The first SIGINT or SIGTERM cancels ctx (see main) and starts the
	// drain; a second one forces it. Being registered here also keeps the
	// second signal from killing the process outright, so the requests of
	// the sessions cut off are cancelled on the server before it exits.
	// SIGHUP re-reads the configuration (the --config file and the flags).
	// They are caught from before the start, so that a SIGHUP sent as soon
	// as the ready line appears does not end the process.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	watchDone := make(chan struct{})
	defer close(watchDone)
	srv, err := startServer(ctx, cfg, logger)
	if err != nil {
		logger.Error("start failed", "err", err)
		return 1
	}
	srv.serveArgs.Store(&args)
	go func() {
		for n := 0; ; {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGHUP {
					logger.Info("SIGHUP: reloading the configuration")
					_ = srv.reloadFromFlags(context.Background(), args)
					continue
				}
				if n++; n == 2 {
					srv.Force()
					return
				}
			case <-watchDone:
				return
			}
		}
	}()
	if err := srv.Run(ctx); err != nil {
		logger.Error("stopped with error", "err", err)
		return 1
	}
	return 0
}

// parseServeFlags parses args, loads --config when given (else starts from
// config.Default) and applies the flags the user set explicitly on top.
// Flags left at their defaults never override the file. --help prints the
// usage to stdout and returns flag.ErrHelp.
func parseServeFlags(args []string, stdout, stderr io.Writer) (*config.Config, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		file        = fs.String("config", "", "YAML configuration `file`; flags override its values")
		backendURL  = fs.String("backend", "", "PostgreSQL `URL` for every database and user (wildcard route); default: a throwaway PostgreSQL")
		tcpListen   = fs.String("tcp-listen", config.DefaultTCPListen, "TCP listen `address`; empty disables the TCP front")
		quicListen  = fs.String("quic-listen", config.DefaultQUICListen, "UDP listen `address` of the QUIC front; empty disables it")
		metrics     = fs.String("metrics-listen", config.DefaultMetricsListen, "`address` of the Prometheus /metrics endpoint; empty disables it")
		poolSize    = fs.Int("pool-size", config.DefaultPoolSize, "maximum server connections per database and user")
		minPool     = fs.Int("min-pool", config.DefaultMinPool, "server connections each configured (databases:) pool keeps open when idle (the default is lowered to --pool-size); --backend pools start empty")
		maxPools    = fs.Int("max-pools", config.DefaultMaxPools, "pools the --backend route may hold at once (one per database and user clients name); beyond it clients get SQLSTATE 53300")
		poolIdle    = fs.Duration("pool-idle-timeout", config.DefaultPoolIdleTimeout, "close a --backend route's pool after this long unused")
		serverIdle  = fs.Duration("server-idle-timeout", config.DefaultServerIdleTimeout, "close server connections idle this long, down to --min-pool (to none for --backend pools)")
		mode        = fs.String("mode", config.DefaultMode, "pooling `mode`: transaction or session")
		zeroRTT     = fs.String("zero-rtt", config.ZeroRTTOff, "0-RTT requests of resumed QUIC clients: `off` (the QUIC front refuses 0-RTT) or read-only (accepted: a plain simple-protocol read runs inside BEGIN READ ONLY before the handshake is confirmed, everything else waits for the confirmation); databases: entries may override it")
		roleChanges = fs.String("role-changes", config.DefaultRoleChanges, "transaction mode, SET ROLE/SESSION AUTHORIZATION outside a transaction block: `refuse` (0A000) or pin (keep the server connection)")
		sessState   = fs.String("session-state", config.DefaultSessionState, "transaction mode, temporary tables, LISTEN, session advisory locks, WITH HOLD cursors, SQL PREPARE: `pin` (keep the server connection while the state lasts) or error (0A000 outside a transaction block)")
		tlsCert     = fs.String("tls-cert", "", "PEM certificate `file` for TCP TLS and QUIC; default: QUIC uses a generated self-signed certificate and TCP has no TLS")
		tlsKey      = fs.String("tls-key", "", "PEM private key `file` matching --tls-cert")
		requireTLS  = fs.Bool("require-tls", false, "refuse TCP clients that do not use TLS (needs --tls-cert)")
		ticketKeys  = fs.String("tls-session-ticket-keys-file", "", "`file` of TLS session-ticket secrets shared by replicas, TCP and QUIC (one per line, >= 32 characters, the first encrypts; needs --tls-cert); default: per process")
		resetKey    = fs.String("quic-stateless-reset-key-file", "", "`file` holding the QUIC stateless-reset secret (>= 32 bytes) shared by replicas behind one address; default: derived from the TLS key")
		serverID    = fs.Int("quic-server-id", 0, "this replica's `ID` (1-65535) in its QUIC connection IDs, for a load balancer routing by connection ID (QUIC-LB style) so connections survive client address changes; visible on the path; 0 = random IDs")
		alpn        = fs.String("alpn", config.DefaultALPN, "QUIC application protocol `name`")
		quicPerSrc  = fs.Int("quic-max-conns-per-source", 0, "QUIC connections one client source (IPv4 address, IPv6 /64) may hold; 0 means a quarter of quic_max_conns")
		authMethod  = fs.String("auth-method", config.DefaultAuthMethod, "client authentication `method`: trust, scram-sha-256, md5 or password; trust must be given explicitly on a listen address other than loopback")
		authFile    = fs.String("auth-file", "", "PgBouncer-format userlist `file` (\"user\" \"secret\" per line)")
		edgeTrust   = fs.String("edge-trust", "", "`file` of trusted edges, \"SHA256-FINGERPRINT USERS DATABASES\" or \"ca=FILE subject=PATTERN|cn=PATTERN USERS DATABASES\" per line (comma lists, * for any): a QUIC client with a trusted certificate opens sessions for them without a password")
		adminUsers  = fs.String("admin-users", "", "comma-separated `users` allowed on the admin console (databases pgquic and pgbouncer: SHOW POOLS, PAUSE...), authenticated like any client")
		logLevel    = fs.String("log-level", config.DefaultLogLevel, "log `level`: debug, info, warn or error")
		logFormat   = fs.String("log-format", config.DefaultLogFormat, "log `format`: text or json")
		maxClients  = fs.Int("max-client-conn", config.DefaultMaxClientConn, "maximum concurrent client sessions")
		gracePeriod = fs.Duration("shutdown-grace", config.DefaultShutdownGrace, "how long shutdown waits for open transactions")
		queryWait   = fs.Duration("query-wait-timeout", config.DefaultAcquireTimeout, "how long a client waits for a server connection from a busy pool before SQLSTATE 53300")
		idleTx      = fs.Duration("idle-transaction-timeout", 0, "end a client idle this long inside a transaction (FATAL 25P03, rolled back); 0 disables")
		clientIdle  = fs.Duration("client-idle-timeout", 0, "end a client idle this long outside a transaction (FATAL 57P05); 0 disables")
		queryTO     = fs.Duration("query-timeout", 0, "cancel a request the server has not answered within this long (57014, the session goes on); 0 disables")
		procs       = fs.Int("procs", 0, "OS threads running Go code (GOMAXPROCS); 0 means half the CPUs, at least 1")
		pipeDepth   = fs.Int("pipeline-depth", config.DefaultPipelineDepth, "transaction mode: at most this many clients' requests written at once on one busy server connection (cross-client pipelining); 1 or 0 turns it off")
		pipeWhen    = fs.String("pipeline-when", config.DefaultPipelineWhen, "`fast` or busy, which now behave alike: a request is pipelined only when the pool is full and every server connection busy")
		pipeFast    = fs.Duration("pipeline-fast-threshold", config.DefaultPipelineFastThreshold, "pipeline behind a kind of query only if the server answered it within this long every recent time")
		catRefresh  = fs.Duration("catalog-refresh", config.DefaultCatalogRefresh, "transaction mode: read each database's catalog for code behind names (triggers, rules, views) again this often")
	)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), serveUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return nil, err
	}

	cfg := config.Default()
	if *file != "" {
		var err error
		if cfg, err = config.Load(*file); err != nil {
			return nil, err
		}
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "backend":
			cfg.Backend = *backendURL
		case "tcp-listen":
			cfg.TCPListen = *tcpListen
		case "quic-listen":
			cfg.QUICListen = *quicListen
		case "metrics-listen":
			cfg.MetricsListen = *metrics
			cfg.Explicit.MetricsListen = true
		case "pool-size":
			cfg.PoolSize = *poolSize
		case "min-pool":
			cfg.MinPool = *minPool
			cfg.Explicit.MinPool = true
		case "max-pools":
			cfg.MaxPools = *maxPools
		case "pool-idle-timeout":
			cfg.PoolIdleTimeout = *poolIdle
		case "server-idle-timeout":
			cfg.ServerIdleTimeout = *serverIdle
		case "mode":
			cfg.Mode = *mode
		case "zero-rtt":
			cfg.ZeroRTT = *zeroRTT
		case "role-changes":
			cfg.RoleChanges = *roleChanges
		case "session-state":
			cfg.SessionState = *sessState
		case "tls-cert":
			cfg.TLSCert = *tlsCert
		case "tls-key":
			cfg.TLSKey = *tlsKey
		case "require-tls":
			cfg.RequireTLS = *requireTLS
		case "tls-session-ticket-keys-file":
			cfg.TLSSessionTicketKeysFile = *ticketKeys
		case "quic-stateless-reset-key-file":
			cfg.QUICStatelessResetKeyFile = *resetKey
		case "quic-server-id":
			cfg.QUICServerID = *serverID
		case "alpn":
			cfg.ALPN = *alpn
		case "quic-max-conns-per-source":
			cfg.QUICMaxConnsPerSource = *quicPerSrc
		case "auth-method":
			cfg.Auth.Method = *authMethod
			cfg.Explicit.AuthMethod = true
		case "auth-file":
			cfg.Auth.File = *authFile
		case "edge-trust":
			cfg.EdgeTrust = *edgeTrust
		case "admin-users":
			cfg.AdminUsers = config.ParseUserList(*adminUsers)
		case "log-level":
			cfg.LogLevel = *logLevel
		case "log-format":
			cfg.LogFormat = *logFormat
		case "max-client-conn":
			cfg.MaxClientConn = *maxClients
		case "shutdown-grace":
			cfg.ShutdownGrace = *gracePeriod
		case "query-wait-timeout":
			cfg.AcquireTimeout = *queryWait
		case "idle-transaction-timeout":
			cfg.IdleTransactionTimeout = *idleTx
		case "client-idle-timeout":
			cfg.ClientIdleTimeout = *clientIdle
		case "query-timeout":
			cfg.QueryTimeout = *queryTO
		case "procs":
			cfg.Procs = *procs
		case "pipeline-depth":
			cfg.PipelineDepth = max(*pipeDepth, 1) // 0 on the command line means off, not the default
		case "pipeline-when":
			cfg.PipelineWhen = *pipeWhen
		case "pipeline-fast-threshold":
			cfg.PipelineFastThreshold = *pipeFast
		case "catalog-refresh":
			cfg.CatalogRefresh = *catRefresh
		}
	})
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return cfg, nil
}

// parseFlags parses args into fs and rejects positional arguments. Output
// of the flag package is buffered: --help goes to stdout (it was asked for,
// so it is not an error), parse errors and their usage to fs's own output.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	errOut := fs.Output()
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	fs.SetOutput(errOut)
	if errors.Is(err, flag.ErrHelp) {
		_, _ = stdout.Write(buf.Bytes())
		return err
	}
	_, _ = errOut.Write(buf.Bytes())
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(errOut, "unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return nil
}

// errUsage marks command-line errors whose message and usage text were
// already printed.
var errUsage = errors.New("usage error")

// setProcs applies the procs setting: an explicit value, else the GOMAXPROCS
// environment variable when set, else half the CPUs available (at least 1).
// See config.Config.Procs for why fewer threads are faster for a pooler.
func setProcs(procs int, logger *slog.Logger) {
	switch {
	case procs > 0:
	case os.Getenv("GOMAXPROCS") != "":
		return
	default:
		procs = max(1, runtime.GOMAXPROCS(0)/2)
	}
	runtime.GOMAXPROCS(procs)
	logger.Debug("threads running Go code", "procs", procs)
}
