package pooler_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TestSequenceStateNotSharedHostile: clients that shape their traffic so
// that the look-ahead of batchReadsSequences, or the sync-segment check on
// a connection the session still holds, might miss a read of sequence
// state. Two clients share one server connection (pool_size 1); in every
// case A's nextval leaves a value in the server process just before B's
// hostile request, and B must get 55000 "not yet defined in this session",
// never A's value. Where the pooler can know nothing is read it must not
// pay a DISCARD, and B's own nextval earlier in a batch must stay B's.
func TestSequenceStateNotSharedHostile(t *testing.T) {
	ctx := testCtx(t, 4*time.Minute)
	h, reg := catalogHarness(t, 1, time.Hour)
	clusterObjects(ctx, t, h, []string{
		"DROP FUNCTION IF EXISTS public.seq_h_peek()",
		"DROP TABLE IF EXISTS public.seq_h_t",
		"DROP SEQUENCE IF EXISTS public.seq_h",
	},
		"CREATE SEQUENCE public.seq_h START 31337",
		"CREATE TABLE public.seq_h_t (a int)",
		"CREATE FUNCTION public.seq_h_peek() RETURNS bigint LANGUAGE sql AS 'SELECT pg_catalog.lastval()'")
	a := pgConnect(ctx, t, h)
	// aNext runs A's nextval and returns the value it left on the server.
	aNext := func(t *testing.T) string {
		t.Helper()
		res, err := a.Exec(ctx, "SELECT nextval('seq_h')").ReadAll()
		if err != nil {
			t.Fatalf("A's nextval: %v", err)
		}
		return string(res[0].Rows[0][0])
	}
	discards := func() float64 {
		return metricValue(t, reg, "pgquic_pooler_sequence_discards_total", "")
	}
	// rawB logs B in as a protocol-level client and prepares rd (a read of
	// sequence state) and other (a read of nothing) for it.
	rawB := func(t *testing.T) *rawConn {
		t.Helper()
		c := hostileLogin(ctx, t, h, "seq-hostile-b")
		got := rawBatch(c, 1, &pgproto3.Parse{Name: "rd", Query: "SELECT lastval()"},
			&pgproto3.Parse{Name: "other", Query: "SELECT 1"}, &pgproto3.Sync{})
		if !slices.Equal(got, []string{"ParseComplete", "ParseComplete", "Z[I]"}) {
			t.Fatalf("B's prepares: %v", got)
		}
		return c
	}
	pbe := func(name, q string) []pgproto3.FrontendMessage {
		return []pgproto3.FrontendMessage{&pgproto3.Parse{Name: name, Query: q},
			&pgproto3.Bind{PreparedStatement: name}, &pgproto3.Execute{}}
	}
	bindRd := []pgproto3.FrontendMessage{&pgproto3.Bind{PreparedStatement: "rd"}, &pgproto3.Execute{}}

	// COPY FROM STDIN leaves the connection with a.copyOpen set until the
	// client ends its data, and the sync-segment check is skipped while
	// the server waits for that data: a batch right after the COPY, with
	// A's nextval before the COPY or between it and the batch, must still
	// be checked.
	t.Run("CopyFromThenBatch", func(t *testing.T) {
		b := pgConnect(ctx, t, h)
		for _, between := range []bool{false, true} {
			if !between {
				aNext(t)
			}
			if _, err := b.CopyFrom(ctx, strings.NewReader("1\n2\n"), "COPY seq_h_t FROM STDIN"); err != nil {
				t.Fatalf("B's COPY: %v", err)
			}
			if between {
				aNext(t)
			}
			_, err := execBatch(ctx, b, "SELECT 1", "SELECT currval('seq_h')")
			notDefined(t, fmt.Sprintf("currval in a batch after a COPY (A's nextval after the COPY: %v)", between), err)
		}
	})

	// The same in one write: the Query, its data and CopyDone, and the
	// batch, which the pooler reads while it still holds the connection
	// for the COPY.
	t.Run("CopyFromAndBatchOneWrite", func(t *testing.T) {
		c := rawB(t)
		v := aNext(t)
		msgs := append([]pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY seq_h_t FROM STDIN"},
			&pgproto3.CopyData{Data: []byte("3\n")}, &pgproto3.CopyDone{}}, pbe("", "SELECT 1")...)
		msgs = append(append(msgs, pbe("", "SELECT currval('seq_h')")...), &pgproto3.Sync{})
		seqFrames(t, "currval in a batch sent with a COPY's data", rawBatch(c, 2, msgs...), v, "55000")
	})

	// A client may send extended-protocol messages while the server waits
	// for COPY data, on a connection the pooler holds in COPY (the check
	// of a sync segment is skipped there). PostgreSQL 15 fails the COPY at
	// the first of them and ends the session (FATAL 08P01); B must see
	// nothing of A's before the end.
	t.Run("BatchInsideCopyFrom", func(t *testing.T) {
		c := rawB(t)
		v := aNext(t)
		_ = c.nc.SetDeadline(time.Now().Add(20 * time.Second))
		c.send(append(append([]pgproto3.FrontendMessage{&pgproto3.Query{String: "COPY seq_h_t FROM STDIN"},
			&pgproto3.Execute{}}, bindRd...), &pgproto3.Sync{})...)
		seqFrames(t, "a prepared lastval bound inside COPY FROM STDIN", c.untilEOF(), v, "08P01")
	})

	// A COPY sets a.copyOpen, which the client clears only by ending COPY
	// FROM STDIN data (CopyDone, CopyFail): after COPY TO STDOUT, or a
	// COPY that fails to start, it stays set until the ReadyForQuery is
	// relayed. A request pipelined behind such a Query (in the same
	// write, as libpq's pipeline mode or any client may send it) must
	// still be checked: the COPY's own borrow read nothing and left the
	// connection's sequence state mixed, not B's. (It once leaked here:
	// attachLocked skipped the check while a.copyOpen; now only once the
	// server has said it waits for COPY data.)
	t.Run("RequestBehindCopy", func(t *testing.T) {
		c := rawB(t)
		for _, tc := range []struct {
			copy string
			read []pgproto3.FrontendMessage
		}{
			{"COPY (SELECT 1) TO STDOUT", append(pbe("", "SELECT currval('seq_h')"), &pgproto3.Sync{})},
			{"COPY (SELECT 1) TO STDOUT", []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT lastval()"}}},
			{"COPY seq_h_missing FROM STDIN", []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT lastval()"}}},
		} {
			v := aNext(t)
			got := rawBatch(c, 2, append([]pgproto3.FrontendMessage{&pgproto3.Query{String: tc.copy}}, tc.read...)...)
			seqFrames(t, fmt.Sprintf("%T pipelined behind %q", tc.read[0], tc.copy), got, v, "55000")
		}
	})

	// The look-ahead remembers 16 statement names; a batch parsing more
	// must count as reading. B's own nextval first in such a batch stays
	// B's, since the DISCARD goes ahead of the batch, not into it. A batch
	// of 16 Parses reading nothing costs no DISCARD.
	t.Run("ManyParses", func(t *testing.T) {
		b := pgConnect(ctx, t, h)
		pipe := func(n int, first, last string) ([]*pgconn.Result, error) {
			t.Helper()
			var qs []string
			if first != "" {
				qs = append(qs, first)
			}
			for i := range n {
				qs = append(qs, fmt.Sprintf("SELECT %d AS many_%d", i, n))
			}
			if last != "" {
				qs = append(qs, last)
			}
			return preparedPipeline(ctx, t, b, qs)
		}
		aNext(t)
		d0 := discards()
		if _, err := pipe(16, "", ""); err != nil {
			t.Fatalf("16 prepared statements reading nothing: %v", err)
		}
		if d := discards() - d0; d != 0 {
			t.Errorf("%v DISCARD SEQUENCES for 16 Parses reading nothing", d)
		}
		aNext(t)
		_, err := pipe(19, "", "SELECT lastval()")
		notDefined(t, "lastval prepared as the 20th statement of a batch", err)
		aNext(t)
		res, err := pipe(19, "SELECT nextval('seq_h')", "SELECT currval('seq_h')")
		if err != nil {
			t.Fatalf("B's own nextval and currval around 19 Parses: %v", err)
		}
		if own, read := string(res[0].Rows[0][0]), string(res[len(res)-1].Rows[0][0]); own != read {
			t.Errorf("B's currval after its own nextval in a batch of 21 Parses: %s, want %s", read, own)
		}
	})

	// A batch split across two writes: when the first arrives the Sync is
	// not buffered, and the read in the second must not slip through.
	t.Run("SplitWrites", func(t *testing.T) {
		c := rawB(t)
		v := aNext(t)
		for _, m := range pbe("", "SELECT 1") {
			c.fe.Send(m)
		}
		if err := c.fe.Flush(); err != nil {
			t.Fatal(err)
		}
		got := rawBatch(c, 1, append(pbe("", "SELECT currval('seq_h')"), &pgproto3.Sync{})...)
		seqFrames(t, "currval in the second write of a batch", got, v, "55000")
	})

	// A segment that begins with a Describe or a Close borrows the
	// connection for a message that reads nothing; the prepared lastval
	// bound after it must be seen by the look-ahead.
	t.Run("DescribeOrCloseFirst", func(t *testing.T) {
		c := rawB(t)
		for _, first := range []pgproto3.FrontendMessage{
			&pgproto3.Describe{ObjectType: 'S', Name: "other"},
			&pgproto3.Close{ObjectType: 'S', Name: "never_prepared"},
			&pgproto3.Close{ObjectType: 'P', Name: ""},
		} {
			v := aNext(t)
			got := rawBatch(c, 1, append(append([]pgproto3.FrontendMessage{first}, bindRd...), &pgproto3.Sync{})...)
			seqFrames(t, fmt.Sprintf("a prepared lastval bound after %T", first), got, v, "55000")
		}
	})

	// A simple Query inside an extended batch, before its Sync, is a
	// request of its own that PostgreSQL runs at once; it comes inside the
	// sync segment, where no check runs, so the look-ahead must see it.
	t.Run("QueryInsideBatch", func(t *testing.T) {
		c := rawB(t)
		v := aNext(t)
		msgs := append(pbe("", "SELECT 1"), &pgproto3.Query{String: "SELECT lastval()"}, &pgproto3.Sync{})
		seqFrames(t, "a Query of lastval inside an extended batch", rawBatch(c, 2, msgs...), v, "55000")
	})

	// A function the lexer cannot see into, bound as the second statement.
	t.Run("HiddenFunctionSecond", func(t *testing.T) {
		b := pgConnect(ctx, t, h)
		aNext(t)
		_, err := execBatch(ctx, b, "SELECT 1", "SELECT seq_h_peek()")
		notDefined(t, "a function calling lastval, second in a batch", err)
	})

	// A failing first statement makes PostgreSQL skip the read after it in
	// the batch; the next batch's read is B's again after A's nextval.
	t.Run("ErrorFirst", func(t *testing.T) {
		b := pgConnect(ctx, t, h)
		aNext(t)
		_, err := execBatch(ctx, b, "SELECT 1/0", "SELECT currval('seq_h')")
		if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "22012" {
			t.Fatalf("batch of a division by zero and currval: %v, want 22012 first", err)
		}
		aNext(t)
		_, err = execBatch(ctx, b, "SELECT currval('seq_h')")
		notDefined(t, "currval in the batch after a failed one", err)
	})

	// Statement names the look-ahead judges by an earlier Parse of the
	// batch: the unnamed statement parsed again with a read, a name closed
	// and parsed again with a read, a named Bind after an unnamed Parse,
	// and a Parse the pooler refuses (42P05: B has rd already), after
	// which the Bind of rd, judged by the refused text, must not run.
	t.Run("NamesWithinBatch", func(t *testing.T) {
		c := rawB(t)
		for _, tc := range []struct {
			what string
			msgs []pgproto3.FrontendMessage
			want string
		}{
			{"the unnamed statement parsed again with lastval", append(pbe("", "SELECT 1"), pbe("", "SELECT lastval()")...), "55000"},
			{"a name closed and parsed again with lastval", append(append(pbe("x", "SELECT 1"),
				&pgproto3.Close{ObjectType: 'S', Name: "x"}), pbe("x", "SELECT lastval()")...), "55000"},
			{"a named Bind of rd after an unnamed Parse", append(pbe("", "SELECT 1"), bindRd...), "55000"},
			{"a Bind of rd after a refused Parse of rd", append(append(pbe("", "SELECT 1"),
				&pgproto3.Parse{Name: "rd", Query: "SELECT 2"}), bindRd...), "42P05"},
		} {
			v := aNext(t)
			got := rawBatch(c, 1, append(tc.msgs, &pgproto3.Sync{})...)
			seqFrames(t, tc.what, got, v, tc.want)
			if tc.want == "42P05" && slices.ContainsFunc(got, func(f string) bool { return f != "D[1]" && strings.HasPrefix(f, "D[") }) {
				t.Errorf("%s: the Bind after the refused Parse ran: %v", tc.what, got)
			}
		}
	})
}

// rawBatch sends msgs on c in one write and summarises the replies up to
// the zs-th ReadyForQuery, CopyData left out; it gives up after 20 s, so
// a pooler that loses track of a reply fails the test instead of hanging.
func rawBatch(c *rawConn, zs int, msgs ...pgproto3.FrontendMessage) []string {
	c.t.Helper()
	_ = c.nc.SetDeadline(time.Now().Add(20 * time.Second))
	defer func() { _ = c.nc.SetDeadline(time.Time{}) }()
	c.send(msgs...)
	var out []string
	for range zs {
		for {
			msg, err := c.fe.Receive()
			if err != nil {
				c.t.Fatalf("receive: %v (so far %v)", err, out)
			}
			if _, ok := msg.(*pgproto3.CopyData); ok {
				continue
			}
			out = append(out, summarise(msg))
			if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
				break
			}
		}
	}
	return out
}

// seqFrames fails t if frames (rawBatch's) hold a DataRow of aVal, the
// value A's nextval left, or lack an error of SQLSTATE want.
func seqFrames(t *testing.T, what string, frames []string, aVal, want string) {
	t.Helper()
	if slices.Contains(frames, "D["+aVal+"]") {
		t.Errorf("LEAK: %s: B read %s, the value A's nextval left: %v", what, aVal, frames)
	} else if !slices.Contains(frames, "E[ERROR "+want+"]") {
		t.Errorf("%s: %v, want an error %s", what, frames, want)
	}
}

// execBatch runs qs on c as one extended-protocol batch (one Sync) and
// returns the results and the first error.
func execBatch(ctx context.Context, c *pgconn.PgConn, qs ...string) ([]*pgconn.Result, error) {
	bt := &pgconn.Batch{}
	for _, q := range qs {
		bt.ExecParams(q, nil, nil, nil, nil)
	}
	res, err := c.ExecBatch(ctx, bt).ReadAll()
	if err != nil {
		return res, err
	}
	for _, r := range res {
		if r.Err != nil {
			return res, r.Err
		}
	}
	return res, nil
}

// preparedPipeline prepares each of qs under a name of its own and runs it,
// all in one batch (one Sync), then closes the names in a batch of their
// own. It returns the results of the runs and the first error.
func preparedPipeline(ctx context.Context, t *testing.T, c *pgconn.PgConn, qs []string) ([]*pgconn.Result, error) {
	t.Helper()
	p := c.StartPipeline(ctx)
	for i, q := range qs {
		p.SendPrepare(fmt.Sprintf("many_%d", i), q, nil)
	}
	for i := range qs {
		p.SendQueryPrepared(fmt.Sprintf("many_%d", i), nil, nil, nil)
	}
	p.SendPipelineSync()
	for i := range qs {
		p.SendDeallocate(fmt.Sprintf("many_%d", i))
	}
	p.SendPipelineSync()
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	var res []*pgconn.Result
	var first error
	for syncs := 0; syncs < 2; {
		r, err := p.GetResults()
		var pe *pgconn.PgError
		if err != nil && !errors.As(err, &pe) {
			t.Fatalf("pipeline: %v", err)
		}
		if err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		switch r := r.(type) {
		case *pgconn.PipelineSync:
			syncs++
		case *pgconn.ResultReader:
			got := r.Read()
			if got.Err != nil && first == nil {
				first = got.Err
			}
			res = append(res, got)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	return res, first
}
