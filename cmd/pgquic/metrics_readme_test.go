package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// TestEveryMetricInREADME: each pgquic_ series family a running server
// registers is listed in the top-level README's Metrics section, so
// operators can look up what they scrape.
func TestEveryMetricInREADME(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Metrics")
	if !ok {
		t.Fatal("README.md has no Metrics section")
	}
	section, _, _ = strings.Cut(section, "\n## ")

	cluster := pgtest.New(t, pgtest.Options{})
	srv, _, stop := startTestServer(t, testConfig(cluster.SuperURL("postgres")))
	defer stop()
	// Labelled families show only once they have a series: give the
	// common ones one (a server error, a pin, a query).
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, srv.tcp.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Exec(ctx, "SELECT 1/0").ReadAll()
	if _, err := c.Exec(ctx, "LISTEN readme_check").ReadAll(); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	mfs, err := srv.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "pgquic_") {
			continue
		}
		if !strings.Contains(section, "`"+name) {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("series registered but not listed in README.md's Metrics section:\n%s", strings.Join(missing, "\n"))
	}
}
