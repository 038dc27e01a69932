package config

import (
	"errors"
	"io/fs"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func intp(v int) *int { return &v }

// TestGoodFiles loads each testdata/*.good.yml and compares with the
// expected Config.
func TestGoodFiles(t *testing.T) {
	want := map[string]*Config{
		"empty.good.yml": Default(),
		"quic-only.good.yml": func() *Config {
			c := Default()
			c.TCPListen = ""
			c.MetricsListen = ""
			c.Backend = "postgres://postgres@127.0.0.1:5432/postgres"
			c.Explicit.MetricsListen = true
			return c
		}(),
		"trust-explicit.good.yml": func() *Config {
			c := Default()
			c.TCPListen = "0.0.0.0:6432"
			c.Explicit.AuthMethod = true
			return c
		}(),
		"trust-loopback-only.good.yml": func() *Config {
			c := Default()
			c.TCPListen = "0.0.0.0:6432"
			c.Auth.TrustLoopbackOnly = true
			return c
		}(),
		"pool-size-one.good.yml": func() *Config {
			c := Default()
			c.PoolSize, c.MinPool = 1, 1
			return c
		}(),
		"legacy-acquire.good.yml": func() *Config {
			c := Default()
			c.AcquireTimeout = 45 * time.Second // acquire_timeout, the old name of query_wait_timeout
			return c
		}(),
		"full.good.yml": {
			TCPListen:                 "0.0.0.0:7432",
			QUICListen:                "[::1]:7433",
			MetricsListen:             "127.0.0.1:9999",
			Backend:                   "postgres://app:secret@127.0.0.1:5432/postgres?sslmode=disable",
			Mode:                      "session",
			ZeroRTT:                   "off",
			RoleChanges:               "pin",
			SessionState:              "error",
			ClientStatementBytes:      1 << 20,
			PoolSize:                  50,
			MinPool:                   5,
			MaxPools:                  40,
			PoolIdleTimeout:           30 * time.Minute,
			MaxClientConn:             2000,
			MaxStartingClients:        500,
			MaxStartingPerSource:      50,
			TLSCert:                   "/etc/pgquic/server.crt",
			TLSKey:                    "/etc/pgquic/server.key",
			RequireTLS:                true,
			TLSSessionTicketKeysFile:  "/etc/pgquic/ticket-keys",
			QUICStatelessResetKeyFile: "/etc/pgquic/reset-key",
			QUICServerID:              7,
			ALPN:                      "pgquic/test",
			QUICMaxConns:              300,
			QUICMaxConnsPerSource:     60,
			QUICMaxStreams:            2000,
			Auth:                      Auth{Method: "scram-sha-256", File: "/etc/pgquic/userlist.txt", TrustLoopbackOnly: true},
			AdminUsers:                UserList{"admin", "ops"},
			StartupTimeout:            5 * time.Second,
			AcquireTimeout:            time.Minute,
			IdleTransactionTimeout:    30 * time.Second,
			ClientIdleTimeout:         10 * time.Minute,
			QueryTimeout:              2 * time.Minute,
			ServerLifetime:            2 * time.Hour,
			ServerIdleTimeout:         90 * time.Second,
			ServerConnectTimeout:      2 * time.Second,
			StatementCacheSize:        512,
			PipelineDepth:             16,
			PipelineFastThreshold:     5 * time.Millisecond,
			CatalogRefresh:            5 * time.Second,
			PipelineWhen:              "fast",
			MaxMessageBytes:           1 << 20,
			ShutdownGrace:             10 * time.Second,
			LogLevel:                  "debug",
			LogFormat:                 "json",
			Databases: []Database{
				{Name: "orders", Backend: "postgres://orders@10.0.0.5:5432/orders", PoolSize: 10, MinPool: intp(0)},
				{Name: "orders", User: "reporting", Backend: "postgresql://reporting@10.0.0.6/orders"},
			},
			Explicit: Explicit{MinPool: true, AuthMethod: true, MetricsListen: true},
		},
	}
	files, err := filepath.Glob("testdata/*.good.yml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(want) {
		t.Errorf("found %d good files, table has %d", len(files), len(want))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			got, err := Load(f)
			if err != nil {
				t.Fatal(err)
			}
			w, ok := want[filepath.Base(f)]
			if !ok {
				t.Fatal("no expectation for this file")
			}
			if !reflect.DeepEqual(got, w) {
				t.Errorf("got  %+v\nwant %+v", got, w)
			}
		})
	}
}

// TestBadFiles loads each testdata/*.bad.yml and checks that the error
// contains every expected substring.
func TestBadFiles(t *testing.T) {
	want := map[string][]string{
		"unknown-key.bad.yml":         {"field pool_sise not found"},
		"db-unknown-key.bad.yml":      {"field pol_size not found"},
		"bad-duration.bad.yml":        {"cannot unmarshal !!int `30` into time.Duration"},
		"bad-duration-string.bad.yml": {"cannot unmarshal !!str `30 seconds` into time.Duration"},
		"wrong-type.bad.yml":          {"cannot unmarshal !!str `twenty` into int"},
		"bad-mode.bad.yml":            {`mode: "statement" is not transaction or session`},
		"role-changes.bad.yml":        {`role_changes: "allow" is not refuse or pin`},
		"session-state.bad.yml":       {`session_state: "refuse" is not pin or error`},
		"zero-rtt.bad.yml":            {`zero_rtt: "always" is not off or read-only`, `databases[0].zero_rtt: "on" is not off or read-only`},
		"bad-pool.bad.yml":            {"min_pool: 5 exceeds pool_size 4: lower min_pool (--min-pool) or raise pool_size (--pool-size)"},
		"max-pools.bad.yml":           {"max_pools: -1 must be at least 1", "pool_idle_timeout: -1s must not be negative"},
		"trust-exposed.bad.yml": {
			`auth.method: the default, trust, would let anyone who reaches tcp_listen "0.0.0.0:6432" and quic_listen ":6432" log in as any user`,
			"pass --auth-method trust (auth.method: trust) to choose trust on purpose",
		},
		"tls-half.bad.yml":            {"tls_cert and tls_key: set both or neither"},
		"require-tls.bad.yml":         {"require_tls: needs tls_cert and tls_key"},
		"ticket-keys-no-cert.bad.yml": {"tls_session_ticket_keys_file: needs tls_cert and tls_key"},
		"auth-file.bad.yml":           {`auth.file: required by auth method "scram-sha-256"`},
		"auth-method.bad.yml":         {`auth.method: "cert" is not trust`},
		"no-fronts.bad.yml":           {"tcp_listen and quic_listen are both empty"},
		"bad-listen.bad.yml":          {`tcp_listen: invalid address "6432"`},
		"bad-backend.bad.yml":         {"backend: must be a postgres:// or postgresql:// URL"},
		"two-docs.bad.yml":            {"more than one YAML document"},
		"both-wait-names.bad.yml":     {"acquire_timeout is the old name of query_wait_timeout: give only query_wait_timeout"},
		"databases.bad.yml": {
			"databases[0].name: required",
			`databases[1].name: "*" is not allowed`,
			"databases[2].backend: required",
			`databases[4]: duplicate route for database "dup" user ""`,
			"databases[5].min_pool: 3 exceeds the route's pool size 2",
		},
		"many.bad.yml": {
			`mode: "nope"`,
			`log_level: "verbose"`,
			`log_format: "xml"`,
			"max_message_bytes: 100 is below the minimum",
			"quic_max_streams: -1 must be at least 1",
			"max_starting_per_source: -1 must be at least 1",
			"quic_max_conns_per_source: -2 must not be negative",
			"quic_server_id: 70000 must be 0 (off) or 1 to 65535",
		},
	}
	files, err := filepath.Glob("testdata/*.bad.yml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(want) {
		t.Errorf("found %d bad files, table has %d", len(files), len(want))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			subs, ok := want[filepath.Base(f)]
			if !ok {
				t.Fatal("no expectation for this file")
			}
			_, err := Load(f)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			for _, s := range subs {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q\nlacks %q", err, s)
				}
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yml"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load of a missing file: %v, want a not-exist error", err)
	}
}

func TestApplyDefaultsKeepsMeaningfulZeros(t *testing.T) {
	var c Config
	c.ApplyDefaults()
	if c.TCPListen != "" || c.QUICListen != "" || c.MetricsListen != "" || c.MinPool != 0 {
		t.Errorf("ApplyDefaults changed a meaningful zero: %+v", c)
	}
	if c.PoolSize != DefaultPoolSize || c.AcquireTimeout != DefaultAcquireTimeout || c.Auth.Method != DefaultAuthMethod {
		t.Errorf("ApplyDefaults did not fill defaults: %+v", c)
	}
}

func TestEffectivePool(t *testing.T) {
	c := Default()
	tests := []struct {
		d             Database
		size, minimum int
	}{
		{Database{}, DefaultPoolSize, DefaultMinPool},
		{Database{PoolSize: 1}, 1, 1},
		{Database{PoolSize: 8, MinPool: intp(0)}, 8, 0},
		{Database{MinPool: intp(7)}, DefaultPoolSize, 7},
	}
	for _, tt := range tests {
		if got := tt.d.EffectivePoolSize(c); got != tt.size {
			t.Errorf("%+v: pool size %d, want %d", tt.d, got, tt.size)
		}
		if got := tt.d.EffectiveMinPool(c); got != tt.minimum {
			t.Errorf("%+v: min pool %d, want %d", tt.d, got, tt.minimum)
		}
	}
}

// TestZeroRTTFor: a route's own zero_rtt wins, the user's entry before the
// any-user one, and the top level answers for the rest.
func TestZeroRTTFor(t *testing.T) {
	c := Default()
	if c.ZeroRTT != ZeroRTTOff || c.AnyZeroRTT() {
		t.Fatalf("default zero_rtt %q (any %v), want off", c.ZeroRTT, c.AnyZeroRTT())
	}
	c.Databases = []Database{
		{Name: "app", Backend: "postgres://x@h/app"},
		{Name: "app", User: "ro", Backend: "postgres://x@h/app", ZeroRTT: ZeroRTTReadOnly},
		{Name: "other", Backend: "postgres://x@h/other", ZeroRTT: ZeroRTTOff},
	}
	for _, tt := range []struct{ db, user, want string }{
		{"app", "ro", ZeroRTTReadOnly}, {"app", "rw", ZeroRTTOff}, {"nope", "ro", ZeroRTTOff},
	} {
		if got := c.ZeroRTTFor(tt.db, tt.user); got != tt.want {
			t.Errorf("ZeroRTTFor(%s, %s) = %q, want %q", tt.db, tt.user, got, tt.want)
		}
	}
	if !c.AnyZeroRTT() {
		t.Error("AnyZeroRTT false with a read-only route")
	}
	c.ZeroRTT = ZeroRTTReadOnly
	if got := c.ZeroRTTFor("other", ""); got != ZeroRTTOff {
		t.Errorf("a route's off must win over the top level: got %q", got)
	}
	if got := c.ZeroRTTFor("app", "rw"); got != ZeroRTTReadOnly {
		t.Errorf("top-level read-only: got %q", got)
	}
}

func TestValidateDefault(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:6432":      true,
		"127.1.2.3:6432":      true,
		"[::1]:6432":          true,
		"localhost:6432":      true,
		"0.0.0.0:6432":        false,
		":6432":               false,
		"[::]:6432":           false,
		"10.0.0.5:6432":       false,
		"db.example.com:6432": false,
		"6432":                false,
	} {
		if got := isLoopback(addr); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// TestTrustRefusalIsOneLine checks that the refusal of default trust on an
// exposed address is a single line naming the fixes.
func TestTrustRefusalIsOneLine(t *testing.T) {
	_, err := Parse([]byte(`tcp_listen: "0.0.0.0:6432"`))
	if err == nil {
		t.Fatal("default trust on 0.0.0.0 accepted")
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Errorf("error spans lines: %q", msg)
	}
	for _, want := range []string{`tcp_listen "0.0.0.0:6432"`, "--auth-method scram-sha-256", "--auth-file", "loopback", "--auth-method trust"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	// A QUIC front on loopback and a disabled TCP front expose nothing.
	if _, err := Parse([]byte("tcp_listen: \"\"\nquic_listen: \"[::1]:6432\"")); err != nil {
		t.Errorf("loopback-only QUIC refused: %v", err)
	}
}

// TestMinPoolClamp checks that only a min_pool the user set can conflict
// with pool_size; the default is lowered to fit.
func TestMinPoolClamp(t *testing.T) {
	tests := []struct {
		yml     string
		minPool int
		err     string
	}{
		{yml: "pool_size: 1", minPool: 1},
		{yml: "pool_size: 3", minPool: 2},
		{yml: "pool_size: 1\nmin_pool: 0", minPool: 0},
		{yml: "pool_size: 1\nmin_pool: 2", err: "min_pool: 2 exceeds pool_size 1"},
		{yml: "min_pool: 25", err: "min_pool: 25 exceeds pool_size 20"},
	}
	for _, tt := range tests {
		c, err := Parse([]byte(tt.yml))
		switch {
		case tt.err != "":
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: error %v, want %q", tt.yml, err, tt.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tt.yml, err)
		case c.MinPool != tt.minPool:
			t.Errorf("%q: min_pool %d, want %d", tt.yml, c.MinPool, tt.minPool)
		}
	}
}
