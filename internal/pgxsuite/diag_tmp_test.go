package pgxsuite_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/pooler"
)

func TestDiagTmp(t *testing.T) {
	run := os.Getenv("DIAG_RUN")
	if run == "" {
		t.Skip()
	}
	pc := preparePgx(t)
	c := newSuiteCluster(t)
	dir := outDir(t)
	if err := c.Exec(t.Context(), "ALTER SYSTEM SET log_statement = 'all'"); err != nil {
		t.Fatal(err)
	}
	if err := c.Exec(t.Context(), "ALTER SYSTEM SET log_line_prefix = '%m [%p] %u %c '"); err != nil {
		t.Fatal(err)
	}
	if err := c.Exec(t.Context(), "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		b, _ := os.ReadFile(filepath.Join(filepath.Dir(c.DataDir), "postgres.log"))
		_ = os.WriteFile(filepath.Join(dir, "postgres.log"), b, 0o644)
	}()
	sp := startPooler(t, c, poolerOpts{mode: pooler.ModeSession, poolSize: 150,
		logger: fileLogger(t, filepath.Join(dir, "diag-pooler.log"))})
	ctx, cancel := runContext(t, 30*time.Minute)
	defer cancel()
	res := runPgxTests(ctx, t, pc, sp.endpoint().suiteEnv(), filepath.Join(dir, "diag.jsonl"), "-timeout", "5m", "-run", run, os.Getenv("DIAG_PKG"))
	t.Logf("%s", res.summary())
	for _, k := range res.with("fail") {
		t.Logf("FAIL %s", k)
	}
	t.Logf("pooler sessions still open: %d", sp.p.Sessions())
	conn, err := pgconn.Connect(ctx, c.SuperURL(testDB))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rr := conn.ExecParams(ctx, "select usename, state, now()-state_change, left(query,60) from pg_stat_activity where datname='pgx_test' and pid<>pg_backend_pid()", nil, nil, nil, nil).Read()
	for _, r := range rr.Rows {
		t.Logf("server conn: %s | %s | %s | %s", r[0], r[1], r[2], r[3])
	}
}
