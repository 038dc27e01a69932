package pgcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testCtx returns a context with a generous timeout for one test step.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// connect opens a pgconn connection and closes it at test end.
func connect(ctx context.Context, t *testing.T, connString string) (*pgconn.PgConn, error) {
	t.Helper()
	conn, err := pgconn.Connect(ctx, connString)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn, nil
}

// queryOne runs sql and returns the first column of the first row.
func queryOne(ctx context.Context, t *testing.T, conn *pgconn.PgConn, sql string) string {
	t.Helper()
	res := conn.ExecParams(ctx, sql, nil, nil, nil, nil).Read()
	if res.Err != nil {
		t.Fatalf("%s: %v", sql, res.Err)
	}
	if len(res.Rows) != 1 || len(res.Rows[0]) < 1 {
		t.Fatalf("%s: got %d rows", sql, len(res.Rows))
	}
	return string(res.Rows[0][0])
}

// withParams adds query parameters to a postgres:// URL.
func withParams(t *testing.T, raw string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func TestAuthMethods(t *testing.T) {
	tests := []struct {
		auth        string
		ssl         bool
		requireAuth string // what the client insists the server asks for
		storedAs    string // prefix of the stored password hash
	}{
		{auth: "", requireAuth: "none", storedAs: "SCRAM-SHA-256$"},
		{auth: AuthSCRAM, requireAuth: "scram-sha-256", storedAs: "SCRAM-SHA-256$"},
		{auth: AuthMD5, requireAuth: "md5", storedAs: "md5"},
		{auth: AuthPassword, requireAuth: "password", storedAs: "SCRAM-SHA-256$"},
		{auth: AuthSCRAM, ssl: true, requireAuth: "scram-sha-256", storedAs: "SCRAM-SHA-256$"},
		{auth: AuthPassword, ssl: true, requireAuth: "password", storedAs: "SCRAM-SHA-256$"},
	}
	for _, tt := range tests {
		name := tt.auth
		if name == "" {
			name = "default"
		}
		if tt.ssl {
			name += "+ssl"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			const pw = `it's "s3cret"\`
			c := New(t, Options{
				Auth:  tt.auth,
				SSL:   tt.ssl,
				Users: []User{{Name: "alice", Password: pw}, {Name: "Root Admin", Password: "adm", Superuser: true}},
			})

			// Right password, and the server asked for the expected method.
			conn, err := connect(ctx, t, withParams(t, c.URL("alice", pw, "postgres"), "require_auth", tt.requireAuth))
			if err != nil {
				t.Fatalf("connect as alice: %v", err)
			}
			if got := queryOne(ctx, t, conn, "SELECT current_user"); got != "alice" {
				t.Errorf("current_user = %q, want alice", got)
			}
			if got := queryOne(ctx, t, conn, "SELECT rolsuper::text FROM pg_roles WHERE rolname = 'Root Admin'"); got != "true" {
				t.Errorf("Root Admin rolsuper = %q, want true", got)
			}

			// The superuser's password works over TCP with the same method.
			super, err := connect(ctx, t, withParams(t, c.SuperURL("postgres"), "require_auth", tt.requireAuth))
			if err != nil {
				t.Fatalf("connect as superuser: %v", err)
			}
			for _, role := range []string{"alice", "postgres"} {
				stored := queryOne(ctx, t, super, "SELECT rolpassword FROM pg_authid WHERE rolname = '"+role+"'")
				if !strings.HasPrefix(stored, tt.storedAs) {
					t.Errorf("%s password stored as %.14q..., want prefix %q", role, stored, tt.storedAs)
				}
			}

			// A wrong password fails, except under trust.
			_, err = connect(ctx, t, c.URL("alice", "wrong", "postgres"))
			if tt.requireAuth == "none" {
				if err != nil {
					t.Errorf("trust: wrong password should be ignored, got %v", err)
				}
			} else {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
					t.Errorf("wrong password: got %v, want SQLSTATE 28P01", err)
				}
			}

			// TLS is used when and only when the cluster has SSL.
			tlsConn, err := connect(ctx, t, withParams(t, c.URL("alice", pw, "postgres"), "sslmode", "require"))
			if tt.ssl {
				if err != nil {
					t.Fatalf("sslmode=require: %v", err)
				}
				if _, ok := tlsConn.Conn().(*tls.Conn); !ok {
					t.Errorf("sslmode=require: connection is %T, want *tls.Conn", tlsConn.Conn())
				}
				if got := queryOne(ctx, t, tlsConn, "SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()"); got != "true" {
					t.Errorf("pg_stat_ssl.ssl = %q, want true", got)
				}
				verified, err := connect(ctx, t, withParams(t, c.URL("alice", pw, "postgres"),
					"sslmode", "verify-full", "sslrootcert", c.SSLCertFile))
				if err != nil {
					t.Fatalf("sslmode=verify-full with the cluster certificate: %v", err)
				}
				if _, ok := verified.Conn().(*tls.Conn); !ok {
					t.Errorf("verify-full: connection is %T, want *tls.Conn", verified.Conn())
				}
				// The default URL (sslmode=prefer) also ends up on TLS.
				pref, err := connect(ctx, t, c.URL("alice", pw, "postgres"))
				if err != nil {
					t.Fatalf("sslmode=prefer: %v", err)
				}
				if _, ok := pref.Conn().(*tls.Conn); !ok {
					t.Errorf("sslmode=prefer: connection is %T, want *tls.Conn", pref.Conn())
				}
			} else {
				if err == nil {
					t.Errorf("sslmode=require succeeded on a cluster without SSL")
				}
				if c.SSLCertFile != "" {
					t.Errorf("SSLCertFile = %q without SSL", c.SSLCertFile)
				}
			}
		})
	}
}

func TestRestartKeepsPortAndData(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c := New(t, Options{Auth: AuthSCRAM})
	if err := c.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before restart')"); err != nil {
		t.Fatal(err)
	}
	before, err := connect(ctx, t, c.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	port, dataDir := c.Port, c.DataDir

	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Port != port || c.DataDir != dataDir {
		t.Errorf("after restart: port %d dir %s, want %d %s", c.Port, c.DataDir, port, dataDir)
	}
	// The old session was ended by the server.
	if err := before.Exec(ctx, "SELECT 1").Close(); err == nil {
		t.Errorf("connection from before the restart still works")
	}
	after, err := connect(ctx, t, c.SuperURL("postgres"))
	if err != nil {
		t.Fatalf("connect after restart: %v", err)
	}
	if got := queryOne(ctx, t, after, "SELECT v FROM kept"); got != "before restart" {
		t.Errorf("data after restart = %q", got)
	}
}

func TestSettingsAndStop(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	// New registers a second Stop in t.Cleanup, which also checks that
	// Stop is idempotent.
	c := New(t, Options{Settings: map[string]string{"max_connections": "200", "application_name": "it's me"}})
	conn, err := pgconn.Connect(ctx, c.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if got := queryOne(ctx, t, conn, "SHOW max_connections"); got != "200" {
		t.Errorf("max_connections = %q, want 200", got)
	}
	if got := queryOne(ctx, t, conn, "SHOW fsync"); got != "off" {
		t.Errorf("fsync = %q, want off", got)
	}
	// A value with a quote survives postgresql.conf quoting.
	if got := queryOne(ctx, t, conn, "SELECT boot_val || '|' || reset_val FROM pg_settings WHERE name = 'application_name'"); got != "|it's me" {
		t.Errorf("application_name boot|reset = %q, want %q", got, "|it's me")
	}
	_ = conn.Close(ctx)

	// The server's Unix socket is in the cluster's own socket directory.
	if _, err := os.Stat(filepath.Join(c.SocketDir, ".s.PGSQL."+strconv.Itoa(c.Port))); err != nil {
		t.Errorf("socket missing: %v", err)
	}

	root := c.rootDir
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("temp dir %s still exists after Stop (err %v)", root, err)
	}
	if err := c.Restart(ctx); !errors.Is(err, ErrStopped) {
		t.Errorf("Restart after Stop = %v, want ErrStopped", err)
	}
	if err := c.Exec(ctx, "SELECT 1"); err == nil {
		t.Errorf("Exec after Stop succeeded")
	}
}

func TestBadOptions(t *testing.T) {
	if _, err := Start(context.Background(), Options{Auth: "ident"}); err == nil {
		t.Fatal("Start with auth ident succeeded")
	}
}

func TestURL(t *testing.T) {
	c := &Cluster{Host: "127.0.0.1", Port: 5555, SuperUser: "postgres", SuperPassword: "postgres"}
	tests := []struct {
		user, pw, db string
		ssl          bool
		want         string
	}{
		{"postgres", "postgres", "postgres", false, "postgres://postgres:postgres@127.0.0.1:5555/postgres?sslmode=disable"},
		{"bob", "", "app", true, "postgres://bob@127.0.0.1:5555/app?sslmode=prefer"},
		{"a b", "p@ss/w:rd", "db", false, "postgres://a%20b:p%40ss%2Fw%3Ard@127.0.0.1:5555/db?sslmode=disable"},
	}
	for _, tt := range tests {
		c.opts.SSL = tt.ssl
		got := c.URL(tt.user, tt.pw, tt.db)
		if got != tt.want {
			t.Errorf("URL(%q,%q,%q) = %s, want %s", tt.user, tt.pw, tt.db, got, tt.want)
		}
		cfg, err := pgconn.ParseConfig(got)
		if err != nil {
			t.Fatalf("pgconn cannot parse %s: %v", got, err)
		}
		if cfg.User != tt.user || cfg.Password != tt.pw || cfg.Database != tt.db || cfg.Port != 5555 {
			t.Errorf("parsed %s as user %q pw %q db %q port %d", got, cfg.User, cfg.Password, cfg.Database, cfg.Port)
		}
	}
}

func TestBinaries(t *testing.T) {
	dir, err := Binaries()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	if !hasServerBinaries(dir) {
		t.Fatalf("Binaries() = %s without initdb and postgres", dir)
	}
	t.Setenv(BinDirEnv, t.TempDir())
	if _, err := Binaries(); !errors.Is(err, ErrNoBinaries) {
		t.Errorf("Binaries with empty %s = %v, want ErrNoBinaries", BinDirEnv, err)
	}
	t.Setenv(BinDirEnv, dir)
	if got, err := Binaries(); err != nil || got != dir {
		t.Errorf("Binaries with %s=%s = %s, %v", BinDirEnv, dir, got, err)
	}
}

func TestVersionOrder(t *testing.T) {
	root := t.TempDir()
	for _, v := range []string{"9.6", "15", "13", "notaversion"} {
		bin := filepath.Join(root, v, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"initdb", "postgres"} {
			if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got, want := highestDebianVersion(root), filepath.Join(root, "15", "bin"); got != want {
		t.Errorf("highestDebianVersion = %s, want %s", got, want)
	}
}

func TestSweepStale(t *testing.T) {
	base := t.TempDir()
	// A directory whose owner has exited is removed.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(base, dirPrefix+"dead")
	if err := os.MkdirAll(filepath.Join(dead, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dead, ownerFile), []byte(strconv.Itoa(cmd.Process.Pid)+" 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory owned by this live process is kept.
	live := filepath.Join(base, dirPrefix+"live")
	if err := os.Mkdir(live, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeOwner(live); err != nil {
		t.Fatal(err)
	}
	// A young directory without an owner file (being created) is kept.
	young := filepath.Join(base, dirPrefix+"young")
	if err := os.Mkdir(young, 0o755); err != nil {
		t.Fatal(err)
	}

	sweepStale(base, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for dir, want := range map[string]bool{dead: false, live: true, young: true} {
		_, err := os.Stat(dir)
		if exists := err == nil; exists != want {
			t.Errorf("%s exists = %v, want %v", filepath.Base(dir), exists, want)
		}
	}
}
