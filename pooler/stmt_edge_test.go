package pooler_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgquic/pgquic/pooler"
)

// TestUnnamedStatementAcrossParamSync prepares the unnamed statement in one
// transaction and binds it in the next. In between, another client with a
// different application_name used the same server connection, so the pooler
// ran a SET there (a simple Query, which destroys the unnamed statement).
// The Bind must still work: the pooler has to replay the Parse.
func TestUnnamedStatementAcrossParamSync(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	a := h.connectWith(ctx, t, func(c *pgx.ConnConfig) { c.RuntimeParams["application_name"] = "aaa" }).PgConn()
	b := h.connectWith(ctx, t, func(c *pgx.ConnConfig) { c.RuntimeParams["application_name"] = "bbb" }).PgConn()
	if _, err := a.Prepare(ctx, "", "select $1::int + 1", nil); err != nil {
		t.Fatal(err)
	}
	// B touches only a named statement, never the unnamed one.
	if _, err := b.Prepare(ctx, "b_named", "select 2", nil); err != nil {
		t.Fatal(err)
	}
	res := a.ExecPrepared(ctx, "", [][]byte{[]byte("1")}, nil, nil).Read()
	if res.Err != nil {
		t.Fatalf("Bind of the unnamed statement after another client's parameter sync: %v", res.Err)
	}
	if string(res.Rows[0][0]) != "2" {
		t.Fatalf("got %q", res.Rows)
	}
}

// TestDescribeExecMixedParams runs pgx's describe-exec mode (Parse and
// Describe of the unnamed statement in one round trip, Bind and Execute in
// the next) from clients with different application names sharing one
// server connection.
func TestDescribeExecMixedParams(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for c := range 4 {
		conn := h.connectWith(ctx, t, func(cfg *pgx.ConnConfig) {
			cfg.DefaultQueryExecMode = pgx.QueryExecModeDescribeExec
			cfg.RuntimeParams["application_name"] = fmt.Sprintf("app%d", c)
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				var app string
				var n int
				if err := conn.QueryRow(ctx, "select current_setting('application_name'), $1::int", i).Scan(&app, &n); err != nil {
					errs <- fmt.Errorf("client %d iter %d: %w", c, i, err)
					return
				}
				if app != fmt.Sprintf("app%d", c) || n != i {
					errs <- fmt.Errorf("client %d iter %d: got %q %d", c, i, app, n)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestStandaloneDescribe sends a Describe of a named statement on a server
// connection that lacks it, with no Parse in that transaction: the pooler
// must replay the Parse and swallow its ParseComplete.
func TestStandaloneDescribe(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2})
	ctx := testCtx(t, time.Minute)
	c := h.rawLogin(t)
	fe := pgproto3.NewFrontend(c, c)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	roundTrip := func(msgs ...pgproto3.FrontendMessage) []string {
		t.Helper()
		for _, m := range msgs {
			fe.Send(m)
		}
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			msg, err := fe.Receive()
			if err != nil {
				t.Fatal(err)
			}
			switch m := msg.(type) {
			case *pgproto3.ReadyForQuery:
				return got
			case *pgproto3.ErrorResponse:
				got = append(got, "Error:"+m.Code)
			default:
				got = append(got, fmt.Sprintf("%T", msg)[len("*pgproto3."):])
			}
		}
	}
	if got := fmt.Sprint(roundTrip(&pgproto3.Parse{Name: "d1", Query: "select $1::int as x"})); got != "[ParseComplete]" {
		t.Fatalf("parse: %s", got)
	}
	// Make the next transaction run on the other server connection.
	blocker := h.connect(ctx, t)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "select 1"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		got := fmt.Sprint(roundTrip(&pgproto3.Describe{ObjectType: 'S', Name: "d1"}))
		if got != "[ParameterDescription RowDescription]" {
			t.Fatalf("describe %d: %s", i, got)
		}
	}
	got := fmt.Sprint(roundTrip(
		&pgproto3.Bind{PreparedStatement: "d1", Parameters: [][]byte{[]byte("5")}},
		&pgproto3.Execute{},
		&pgproto3.Close{ObjectType: 'S', Name: "d1"},
		&pgproto3.Describe{ObjectType: 'S', Name: "d1"},
	))
	if got != "[BindComplete DataRow CommandComplete CloseComplete Error:26000]" {
		t.Fatalf("bind/execute/close/describe: %s", got)
	}
	_ = tx.Rollback(ctx)
}

// TestSmallServerStatementCache runs batches of many distinct statements
// through a server-side statement cache of 4, so the pooler keeps evicting
// and replaying statements inside pipelines.
func TestSmallServerStatementCache(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 2, cfg: pooler.Config{StatementCacheSize: 4}})
	ctx := testCtx(t, time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for c := range 3 {
		conn := h.connect(ctx, t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := range 4 {
				b := &pgx.Batch{}
				for i := range 30 {
					b.Queue(fmt.Sprintf("select $1::int + %d", (i*7+round)%20), i)
				}
				br := conn.SendBatch(ctx, b)
				for i := range 30 {
					var n int
					if err := br.QueryRow().Scan(&n); err != nil {
						errs <- fmt.Errorf("client %d round %d query %d: %w", c, round, i, err)
						_ = br.Close()
						return
					}
					if n != i+(i*7+round)%20 {
						errs <- fmt.Errorf("client %d round %d query %d: got %d", c, round, i, n)
					}
				}
				if err := br.Close(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestClientStatementLimit refuses a client's named statement beyond the
// limit with 53400 and keeps the session usable.
func TestClientStatementLimit(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1, cfg: pooler.Config{ClientStatementLimit: 5}})
	ctx := testCtx(t, time.Minute)
	pc := h.connect(ctx, t).PgConn()
	for i := range 5 {
		if _, err := pc.Prepare(ctx, fmt.Sprintf("s%d", i), fmt.Sprintf("select %d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pc.Prepare(ctx, "s5", "select 5", nil); pgCode(err) != "53400" {
		t.Fatalf("sixth statement: got %v, want 53400", err)
	}
	if err := pc.Deallocate(ctx, "s0"); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Prepare(ctx, "s5", "select 5", nil); err != nil {
		t.Fatalf("after freeing one: %v", err)
	}
	res := pc.ExecPrepared(ctx, "s5", nil, nil, nil).Read()
	if res.Err != nil || string(res.Rows[0][0]) != "5" {
		t.Fatalf("s5: %q %v", res.Rows, res.Err)
	}
}

// TestFailedParseInPipeline checks that statements named in a pipeline that
// failed part-way do not stay registered: after the error, the client can
// prepare those names again, as on PostgreSQL.
func TestFailedParseInPipeline(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	pc := h.connect(ctx, t).PgConn()
	p := pc.StartPipeline(ctx)
	p.SendPrepare("ok1", "select 1", nil)
	p.SendPrepare("bad", "selec 2", nil)
	p.SendPrepare("skipped", "select 3", nil) // the server skips it after the error
	p.SendPipelineSync()
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) == 0 || got[len(got)-1] != "sync" {
		r, err := p.GetResults()
		switch {
		case err != nil:
			got = append(got, "err:"+pgCode(err))
		case r == nil:
			t.Fatalf("pipeline ended early: %v", got)
		default:
			if _, ok := r.(*pgconn.PipelineSync); ok {
				got = append(got, "sync")
			} else {
				got = append(got, "ok")
			}
		}
	}
	if g := fmt.Sprint(got); g != "[ok err:42601 sync]" {
		t.Fatalf("pipeline results: %s", g)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"bad", "skipped"} {
		if _, err := pc.Prepare(ctx, name, "select 4", nil); err != nil {
			t.Errorf("prepare %q after the failed pipeline: %v", name, err)
		}
	}
	if _, err := pc.Prepare(ctx, "ok1", "select 1", nil); pgCode(err) != "42P05" {
		t.Errorf("prepare ok1 again: got %v, want 42P05", err)
	}
}

// TestPoolerErrorAbortsTransaction checks that an error the pooler raises
// itself inside a transaction block (a duplicate prepared statement name)
// aborts the transaction as PostgreSQL would: later statements get 25P02
// and COMMIT rolls back, so the insert before the error is not kept.
func TestPoolerErrorAbortsTransaction(t *testing.T) {
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), poolSize: 1})
	ctx := testCtx(t, time.Minute)
	if err := h.cluster.Exec(ctx, "drop table if exists abort_t; create table abort_t (x int)"); err != nil {
		t.Fatal(err)
	}
	pc := h.connect(ctx, t).PgConn()
	if _, err := pc.Prepare(ctx, "dup", "select 1", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Exec(ctx, "begin; insert into abort_t values (1)").ReadAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Prepare(ctx, "dup", "select 2", nil); pgCode(err) != "42P05" {
		t.Fatalf("duplicate prepare: got %v, want 42P05", err)
	}
	status := pc.TxStatus()
	_, err := pc.Exec(ctx, "select 1").ReadAll()
	if _, cerr := pc.Exec(ctx, "commit").ReadAll(); cerr != nil {
		t.Fatal(cerr)
	}
	var n int
	res := pc.ExecParams(ctx, "select count(*) from abort_t", nil, nil, nil, nil).Read()
	if res.Err == nil {
		n, _ = strconv.Atoi(string(res.Rows[0][0]))
	}
	if status != 'E' || pgCode(err) != "25P02" || n != 0 {
		t.Fatalf("after a pooler-raised error in a transaction: status %c (want E), next statement %v (want 25P02), %d rows committed (want 0)", status, err, n)
	}
}
