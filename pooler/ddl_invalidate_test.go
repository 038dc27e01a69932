package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/pooler"
)

// TestDDLInvalidatesStatementsOnItsConnection is node-postgres'
// type-coercion pattern: a client re-creates a (temporary) table with
// another column type, then prepares the same text under a new name in a
// pipeline that goes on after its first use. The server connection still
// holds the pooler's statement for that text, prepared before the DDL;
// without the DDL invalidating it the first use fails with 0A000 "cached
// plan must not change result type", where PostgreSQL directly succeeds.
func TestDDLInvalidatesStatementsOnItsConnection(t *testing.T) {
	c := sharedCluster(t)
	for _, mode := range []pooler.Mode{pooler.ModeTransaction, pooler.ModeSession} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t, harnessOpts{cluster: c, poolSize: 1, cfg: pooler.Config{Mode: mode}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			conn, err := pgconn.Connect(ctx, h.url())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			for i, typ := range []string{"int", "text", "numeric", "bool"} {
				if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS ddl_tt; CREATE TEMP TABLE ddl_tt (col "+typ+")").ReadAll(); err != nil {
					t.Fatal(err)
				}
				p := conn.StartPipeline(ctx)
				name := "get " + typ
				p.SendPrepare(name, "select col from ddl_tt", nil)
				p.SendQueryPrepared(name, nil, nil, nil)
				p.SendQueryParams("select $1::int + 1", [][]byte{[]byte("41")}, nil, nil, nil)
				if err := p.Sync(); err != nil {
					t.Fatal(err)
				}
				for {
					res, err := p.GetResults()
					if err != nil {
						t.Fatalf("round %d (%s): %v", i, typ, err)
					}
					if res == nil {
						break
					}
					switch r := res.(type) {
					case *pgconn.ResultReader:
						if _, err := r.Close(); err != nil {
							t.Fatalf("round %d (%s): %v", i, typ, err)
						}
					case *pgconn.StatementDescription:
					case *pgconn.PipelineSync:
					}
				}
				if err := p.Close(); err != nil {
					t.Fatalf("round %d (%s): %v", i, typ, err)
				}
			}
		})
	}
}
