package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// consoleRows runs one console command and returns its rows as text.
func consoleRows(ctx context.Context, c *pgconn.PgConn, sql string) ([][]string, error) {
	res, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	var rows [][]string
	for _, r := range res {
		for _, row := range r.Rows {
			var cells []string
			for _, v := range row {
				cells = append(cells, string(v))
			}
			rows = append(rows, cells)
		}
	}
	return rows, nil
}

// configValue returns the value SHOW CONFIG gives key.
func configValue(t *testing.T, rows [][]string, key string) string {
	t.Helper()
	for _, r := range rows {
		if r[0] == key {
			return r[1]
		}
	}
	t.Fatalf("SHOW CONFIG has no %s", key)
	return ""
}

// TestServeConsoleAdminUsersReloadAndSecrets: a backend password given in
// the URL's user part and as ?password= never appears in SHOW CONFIG nor
// in the logs; removing a user from admin_users and running RELOAD (which
// re-reads --config as SIGHUP does) refuses that user at once, both a new
// login and the next command of its open session (FATAL 42501), and SHOW
// CONFIG shows the list in force.
func TestServeConsoleAdminUsersReloadAndSecrets(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	// No server connection is opened (min_pool 0, no client of a
	// database), so the password need not be the cluster's.
	const secret = "Zq7-not-a-real-password"
	backendURL := cluster.URL(cluster.SuperUser, secret, "postgres") + "&password=" + secret + "&sslpassword=ssl-" + secret
	if !strings.Contains(backendURL, "sslmode=") {
		t.Fatalf("backend URL %q lacks the cluster's query", backendURL)
	}
	file := filepath.Join(t.TempDir(), "pgquic.yml")
	write := func(admins string) {
		yml := fmt.Sprintf("backend: %q\ntcp_listen: 127.0.0.1:0\nquic_listen: \"\"\nmetrics_listen: \"\"\nmin_pool: 0\nadmin_users: %q\n", backendURL, admins)
		if err := os.WriteFile(file, []byte(yml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("admin, ops")
	args := []string{"--config", file}
	cfg, err := parseServeFlags(args, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	srv, logs, _ := startTestServer(t, cfg)
	srv.serveArgs.Store(&args)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	consoleURL := func(user string) string {
		return fmt.Sprintf("postgres://%s@%s/pgquic?sslmode=disable", user, srv.tcp.Addr())
	}
	admin, err := pgconn.Connect(ctx, consoleURL("admin"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	ops, err := pgconn.Connect(ctx, consoleURL("ops"))
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Close(ctx)

	rows, err := consoleRows(ctx, ops, "SHOW CONFIG")
	if err != nil {
		t.Fatal(err)
	}
	if got := configValue(t, rows, "admin_users"); got != "admin,ops" {
		t.Fatalf("admin_users before the reload = %q", got)
	}
	for _, r := range rows {
		if strings.Contains(strings.Join(r, "|"), secret) {
			t.Errorf("SHOW CONFIG row shows the backend password: %q", r)
		}
	}
	if b := configValue(t, rows, "backend"); !strings.Contains(b, "password=***") || !strings.Contains(b, ":***@") {
		t.Errorf("backend shown as %q, want its passwords as ***", b)
	}

	write("admin")
	if _, err := admin.Exec(ctx, "RELOAD").ReadAll(); err != nil {
		t.Fatalf("RELOAD: %v", err)
	}
	rows, err = consoleRows(ctx, admin, "SHOW CONFIG")
	if err != nil {
		t.Fatal(err)
	}
	if got := configValue(t, rows, "admin_users"); got != "admin" {
		t.Fatalf("admin_users after the reload = %q, want admin", got)
	}

	// The open session's next command is refused and the session ends.
	_, err = consoleRows(ctx, ops, "SHOW POOLS")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("SHOW POOLS by a removed admin user on an open session: %v, want 42501", err)
	}
	if _, err := ops.Exec(ctx, "SHOW POOLS").ReadAll(); err == nil {
		t.Fatal("the removed user's session still answers after its refusal")
	}
	// A new login is refused.
	if c, err := pgconn.Connect(ctx, consoleURL("ops")); err == nil {
		c.Close(ctx)
		t.Fatal("a user removed from admin_users logged in to the console after RELOAD")
	} else if !strings.Contains(err.Error(), "not allowed") {
		t.Fatalf("login of a removed admin user: %v, want not allowed", err)
	}
	// The user kept is still served.
	if _, err := consoleRows(ctx, admin, "SHOW POOLS"); err != nil {
		t.Fatalf("SHOW POOLS by the remaining admin user: %v", err)
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("the logs show the backend password:\n%s", logs.String())
	}
}
