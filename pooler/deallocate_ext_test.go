package pooler_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/pooler"
)

// TestDeallocateExtendedProtocol: psycopg evicts a statement from its
// cache with "DEALLOCATE _pg3_1" sent through the extended protocol. The
// pooler renames protocol statements on the server, so passing the text on
// failed with 26000; it must drop the client's statement as PostgreSQL
// does, and leave other clients' copies of the same text working.
func TestDeallocateExtendedProtocol(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{Mode: pooler.ModeTransaction}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	b, err := pgconn.Connect(ctx, h.url())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	for _, c := range []*pgconn.PgConn{a, b} {
		if _, err := c.Prepare(ctx, "_pg3_1", "select 42", nil); err != nil {
			t.Fatal(err)
		}
		if r := c.ExecPrepared(ctx, "_pg3_1", nil, nil, nil).Read(); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	r := a.ExecParams(ctx, "DEALLOCATE _pg3_1", nil, nil, nil, nil).Read()
	if r.Err != nil || r.CommandTag.String() != "DEALLOCATE" {
		t.Fatalf("DEALLOCATE through the extended protocol: %q, %v", r.CommandTag, r.Err)
	}
	if r := a.ExecPrepared(ctx, "_pg3_1", nil, nil, nil).Read(); pgCode(r.Err) != "26000" {
		t.Fatalf("the deallocated statement: %v, want 26000", r.Err)
	}
	if r := b.ExecPrepared(ctx, "_pg3_1", nil, nil, nil).Read(); r.Err != nil || string(r.Rows[0][0]) != "42" {
		t.Fatalf("another client's statement of the same text: %v %v", r.Rows, r.Err)
	}
	if _, err := a.Prepare(ctx, "_pg3_1", "select 43", nil); err != nil {
		t.Fatalf("preparing the name again: %v", err)
	}
	if r := a.ExecPrepared(ctx, "_pg3_1", nil, nil, nil).Read(); r.Err != nil || string(r.Rows[0][0]) != "43" {
		t.Fatalf("the new statement: %v %v", r.Rows, r.Err)
	}
}
