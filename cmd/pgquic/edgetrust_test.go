package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/internal/quictest"
	"github.com/pgquic/pgquic/quicclient"
)

// clientCert writes a new self-signed certificate and key (writeCert) and
// returns their paths and the certificate's fingerprint.
func clientCert(t *testing.T) (certFile, keyFile, fp string) {
	t.Helper()
	certFile, keyFile = writeCert(t, t.TempDir())
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, quicclient.Fingerprint(pair.Certificate[0])
}

// edgeTrustServer starts serve with SCRAM authentication (the superuser in
// the userlist) and the edge-trust file trust, and returns the server,
// its logs and the test's cluster.
func edgeTrustServer(t *testing.T, trust func(super string) string) (*server, *lockedBuffer, *pgtest.Cluster, func(string)) {
	t.Helper()
	cluster := pgtest.New(t, pgtest.Options{})
	// mallory exists on the server (a --backend pool logs in as the
	// client's user), so a session the edge may open for her runs.
	if err := cluster.Exec(context.Background(), fmt.Sprintf("CREATE ROLE mallory LOGIN PASSWORD '%s'", cluster.SuperPassword)); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	users := filepath.Join(dir, "userlist.txt")
	if err := os.WriteFile(users, fmt.Appendf(nil, "%q %q\n", cluster.SuperUser, cluster.SuperPassword), 0o600); err != nil {
		t.Fatal(err)
	}
	trustFile := filepath.Join(dir, "edges.txt")
	write := func(s string) {
		if err := os.WriteFile(trustFile, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(trust(cluster.SuperUser))
	cfg := testConfig(cluster.SuperURL("postgres"))
	cfg.Auth.Method, cfg.Auth.File = "scram-sha-256", users
	cfg.EdgeTrust = trustFile
	srv, logs, _ := startTestServer(t, cfg)
	return srv, logs, cluster, write
}

// quicSession connects over QUIC as user to database with password (empty:
// none), presenting the client certificate certFile/keyFile (empty: none).
func quicSession(ctx context.Context, t *testing.T, srv *server, certFile, keyFile, user, password, database string) (*pgconn.PgConn, error) {
	t.Helper()
	dialer, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: srv.quic.Addr().String(), Conns: 1,
		PinSHA256: srv.quic.Fingerprint(), CertFile: certFile, KeyFile: keyFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dialer.Close() })
	pcfg := quictest.PgConfigURL(t, dialer, fmt.Sprintf("postgres://%s@quic/%s?sslmode=disable", user, database))
	pcfg.Password = password
	return pgconn.ConnectConfig(ctx, pcfg)
}

// sqlState returns err's SQLSTATE, "" when it carries none.
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// TestServeEdgeTrust: a QUIC client whose certificate the edge-trust file
// lists opens sessions for its users and databases without a password
// (SCRAM is configured for everyone else); a user or database outside its
// set gets 28000 and is logged; a certificate not in the file, or none,
// asserts nothing (no password: 28P01; the right one: in); a reload applies
// a changed file to the next session.
func TestServeEdgeTrust(t *testing.T) {
	edgeCert, edgeKey, edgeFP := clientCert(t)
	strangerCert, strangerKey, _ := clientCert(t)
	// The fingerprint spelled as openssl prints it: upper case with colons.
	var colons []string
	for i := 0; i < len(edgeFP); i += 2 {
		colons = append(colons, strings.ToUpper(edgeFP[i:i+2]))
	}
	srv, logs, cluster, writeTrust := edgeTrustServer(t, func(super string) string {
		return fmt.Sprintf("# the edge\n%s alice,%s postgres\n", strings.Join(colons, ":"), super)
	})
	super := cluster.SuperUser
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cfg := *srv.live.cfg.Load()

	query := func(c *pgconn.PgConn, sql string) string {
		t.Helper()
		res, err := c.Exec(ctx, sql).ReadAll()
		if err != nil {
			t.Fatal(err)
		}
		return string(res[0].Rows[0][0])
	}

	// Trusted, listed user and database: no password asked.
	c, err := quicSession(ctx, t, srv, edgeCert, edgeKey, super, "", "postgres")
	if err != nil {
		t.Fatalf("trusted edge, listed user: %v", err)
	}
	if got := query(c, "SELECT current_database()"); got != "postgres" {
		t.Errorf("current_database() = %q", got)
	}
	c.Close(ctx)

	// Trusted edge, user or database outside its set: 28000, logged.
	for _, tc := range []struct{ user, db string }{{"mallory", "postgres"}, {super, "template1"}, {"alice", "pgquic"}} {
		_, err := quicSession(ctx, t, srv, edgeCert, edgeKey, tc.user, cluster.SuperPassword, tc.db)
		if got := sqlState(err); got != "28000" {
			t.Errorf("trusted edge, user %q database %q: err %v (SQLSTATE %q), want 28000", tc.user, tc.db, err, got)
		}
	}
	if n := strings.Count(logs.String(), "refusing a session from a trusted edge"); n != 3 {
		t.Errorf("%d refusals logged, want 3:\n%s", n, logs.String())
	}

	// Unknown certificate or none: ordinary password authentication.
	for _, cert := range [][2]string{{strangerCert, strangerKey}, {"", ""}} {
		if _, err := quicSession(ctx, t, srv, cert[0], cert[1], super, "", "postgres"); sqlState(err) != "28P01" {
			t.Errorf("certificate %q without a password: err %v, want 28P01", cert[0], err)
		}
		if _, err := quicSession(ctx, t, srv, cert[0], cert[1], super, "wrong", "postgres"); sqlState(err) != "28P01" {
			t.Errorf("certificate %q with a wrong password: err %v, want 28P01", cert[0], err)
		}
		c, err := quicSession(ctx, t, srv, cert[0], cert[1], super, cluster.SuperPassword, "postgres")
		if err != nil {
			t.Fatalf("certificate %q with the password: %v", cert[0], err)
		}
		c.Close(ctx)
	}

	// Reload: the edge may now use any database for mallory only.
	writeTrust(fmt.Sprintf("%s mallory *\n", edgeFP))
	if _, _, err := srv.Reload(ctx, &cfg); err != nil {
		t.Fatal(err)
	}
	c, err = quicSession(ctx, t, srv, edgeCert, edgeKey, "mallory", "", "postgres")
	if err != nil {
		t.Fatalf("after the reload, mallory: %v", err)
	}
	if got := query(c, "SELECT 1"); got != "1" {
		t.Errorf("SELECT 1 = %q", got)
	}
	c.Close(ctx)
	if _, err := quicSession(ctx, t, srv, edgeCert, edgeKey, super, "", "postgres"); sqlState(err) != "28000" {
		t.Errorf("after the reload, the superuser: err %v, want 28000", err)
	}
	// "*" is not the admin console.
	if _, err := quicSession(ctx, t, srv, edgeCert, edgeKey, "mallory", "", "pgquic"); sqlState(err) != "28000" {
		t.Errorf("after the reload, the console: err %v, want 28000", err)
	}
	// A broken file is refused and the table in force kept.
	writeTrust("not-a-fingerprint * *\n")
	if _, _, err := srv.Reload(ctx, &cfg); err == nil || !strings.Contains(err.Error(), "edge trust") {
		t.Errorf("reload with a broken edge-trust file: %v", err)
	}
	c, err = quicSession(ctx, t, srv, edgeCert, edgeKey, "mallory", "", "postgres")
	if err != nil {
		t.Fatalf("after the rejected reload, mallory: %v", err)
	}
	c.Close(ctx)
	// Removing the edge makes its certificate an ordinary one.
	writeTrust("")
	if _, _, err := srv.Reload(ctx, &cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := quicSession(ctx, t, srv, edgeCert, edgeKey, "mallory", "", "postgres"); sqlState(err) != "28P01" {
		t.Errorf("edge removed: err %v, want 28P01", err)
	}
}
