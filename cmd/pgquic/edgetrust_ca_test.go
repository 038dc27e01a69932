package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/internal/testca"
)

// TestServeEdgeTrustCA runs `serve --edge-trust` with CA plus subject
// lines over real QUIC and PostgreSQL, with certificates made in the test:
// a client whose chain verifies against the CA for client authentication
// and whose subject matches opens sessions without a password, directly
// and through `pgquic edge --local-auth trust` (the edge sends its
// intermediate); a certificate from another CA, expired, with a subject
// that does not match or without client-auth usage asserts nothing: a
// direct client is asked for its password as before, an edge that asserts
// a user through the trust path gets 28000; "*" does not cover the admin
// console; a reload reads the CA file again, and a CA file that no longer
// parses makes the reload fail and keeps the table in force.
func TestServeEdgeTrustCA(t *testing.T) {
	caA, caB, caOther := testca.New(t, "edge CA A"), testca.New(t, "edge CA B"), testca.New(t, "another CA")
	region := caA.Intermediate(t, "edge CA A, region 2")
	dir := t.TempDir()
	caFile := caA.WriteFile(t, dir, "edge-ca.pem")
	corp := func(cn string) testca.Options { return testca.Named(cn, "Example") }
	type certFiles struct{ cert, key string }
	issue := func(ca *testca.CA, name string, o testca.Options) certFiles {
		c, k := ca.Issue(t, o).WriteFiles(t, dir, name)
		return certFiles{c, k}
	}
	expired, serverOnly := corp("edge-1"), corp("edge-1")
	expired.NotBefore, expired.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-time.Minute)
	serverOnly.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	edge1 := issue(caA, "edge1", corp("edge-1"))
	edge2 := issue(region, "edge2", corp("edge-2")) // its file holds the intermediate too
	edge1B := issue(caB, "edge1-b", corp("edge-1"))
	bad := map[string]certFiles{
		"another CA":          issue(caOther, "other", corp("edge-1")),
		"expired":             issue(caA, "expired", expired),
		"subject not matched": issue(caA, "stranger", testca.Named("stranger")),
		"server auth only":    issue(caA, "server-only", serverOnly),
	}

	srv, _, cluster, _ := edgeTrustServer(t, func(super string) string {
		return fmt.Sprintf("ca=%s cn=edge-1 %s postgres\nca=%s subject=\"/^CN=edge-[0-9]+,O=Example$\" mallory *\n", caFile, super, caFile)
	})
	super, pw := cluster.SuperUser, cluster.SuperPassword
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cfg := *srv.live.cfg.Load()

	trusted := func(what string, cf certFiles, user, db string) {
		t.Helper()
		c, err := quicSession(ctx, t, srv, cf.cert, cf.key, user, "", db)
		if err != nil {
			t.Fatalf("%s, %s on %s without a password: %v", what, user, db, err)
		}
		res, err := c.Exec(ctx, "SELECT current_user").ReadAll()
		if err != nil || string(res[0].Rows[0][0]) != user {
			t.Errorf("%s: current_user: %v %v", what, res, err)
		}
		c.Close(ctx)
	}
	refused := func(what string, cf certFiles, user, password, db, code string) {
		t.Helper()
		if _, err := quicSession(ctx, t, srv, cf.cert, cf.key, user, password, db); sqlState(err) != code {
			t.Errorf("%s, %s on %s: %v, want %s", what, user, db, err, code)
		}
	}

	trusted("CN edge-1", edge1, super, "postgres")
	trusted("subject regexp, through an intermediate", edge2, "mallory", "postgres")
	// The first matching line decides: edge-1's grants the superuser only.
	refused("CN edge-1 asking for mallory", edge1, "mallory", "", "postgres", "28000")
	refused("CN edge-1 on another database", edge1, super, "", "template1", "28000")
	refused(`"*" and the console`, edge2, "mallory", "", "pgquic", "28000")
	for what, cf := range bad {
		refused(what+", no password", cf, super, "", "postgres", "28P01")
		c, err := quicSession(ctx, t, srv, cf.cert, cf.key, super, pw, "postgres")
		if err != nil {
			t.Fatalf("%s with the password: %v", what, err)
		}
		c.Close(ctx)
	}

	// Through edges asserting their local clients: the CA-trusted edge's
	// session runs, an untrusted edge's gets 28000 (the pooler asks it for
	// a password it will not relay).
	base := edgeConfig{listen: "127.0.0.1:0", pooler: srv.quic.Addr().String(), pin: srv.quic.Fingerprint(),
		conns: 1, streams: 10, grace: 5 * time.Second, localAuth: "trust"}
	viaEdge := func(cf certFiles, user string) error {
		ec := base
		ec.cert, ec.key = cf.cert, cf.key
		addr, logs := startEdge(t, ec)
		if !strings.Contains(logs.String(), `cert_subject="CN=edge-`) {
			t.Errorf("the edge does not log its certificate's subject:\n%s", logs.String())
		}
		c, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", user, addr))
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, "SELECT 1").ReadAll()
		return err
	}
	if err := viaEdge(edge2, "mallory"); err != nil {
		t.Errorf("CA-trusted edge with an intermediate: %v", err)
	}
	for _, what := range []string{"another CA", "expired"} {
		if err := viaEdge(bad[what], super); sqlState(err) != "28000" {
			t.Errorf("edge with a certificate from %s: %v, want 28000", what, err)
		}
	}

	// Reload with CA B in the file: A's certificates assert nothing, B's do.
	if err := os.WriteFile(caFile, caB.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := srv.Reload(ctx, &cfg); err != nil {
		t.Fatal(err)
	}
	refused("CA A after the reload", edge1, super, "", "postgres", "28P01")
	trusted("CA B after the reload", edge1B, super, "postgres")
	// A CA file that no longer parses: the reload fails, B stays trusted.
	if err := os.WriteFile(caFile, []byte("-----BEGIN CERTIFICATE-----\nnot base64\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := srv.Reload(ctx, &cfg); err == nil || !strings.Contains(err.Error(), "edge trust") || !strings.Contains(err.Error(), filepath.Base(caFile)) {
		t.Errorf("reload with a broken CA file: %v, want an edge trust error naming the file", err)
	}
	trusted("CA B after the rejected reload", edge1B, super, "postgres")
}

// TestServeSIGHUPEdgeCA: SIGHUP reads an edge-trust file's CA file again
// even when no configuration key changed; a CA file that no longer parses
// rejects the reload with an error log naming it, and the process keeps
// serving.
func TestServeSIGHUPEdgeCA(t *testing.T) {
	cluster := pgtest.New(t, pgtest.Options{})
	dir := t.TempDir()
	caFile := testca.New(t, "edge CA").WriteFile(t, dir, "edge-ca.pem")
	trustFile := filepath.Join(dir, "edges.txt")
	if err := os.WriteFile(trustFile, []byte("ca=edge-ca.pem cn=/^edge- * *\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServeProcess(t, "--backend", cluster.SuperURL("postgres"), "--tcp-listen", "127.0.0.1:0",
		"--quic-listen", "127.0.0.1:0", "--metrics-listen", "", "--edge-trust", trustFile)
	if err := os.WriteFile(caFile, []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return strings.Contains(p.logs.String(), "reload rejected; the running configuration is kept") &&
			strings.Contains(p.logs.String(), "line 1: ca edge-ca.pem: certificate 1:")
	})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, p.tcp))
	if err != nil {
		t.Fatalf("after the rejected reload: %v", err)
	}
	c.Close(ctx)
	testca.New(t, "edge CA 2").WriteFile(t, dir, "edge-ca.pem")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(p.logs.String(), `msg="configuration reloaded"`) })
}
