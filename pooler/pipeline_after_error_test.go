package pooler_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestPipelineContinuesAfterServerError: a client that has already seen an
// error (after Flush) keeps sending the rest of its pipeline before Sync.
// The server skips those messages without replying; the pooler must not wait
// for replies to them (it once hung here, found by pgx's own test suite).
func TestPipelineContinuesAfterServerError(t *testing.T) {
	h := newHarness(t, harnessOpts{poolSize: 2})
	// "warm": the second run meets a server that already holds the
	// statements, so the pooler answers some Parses itself.
	for _, mode := range []string{"fresh", "warm"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", h.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(15 * time.Second))
			fe := pgproto3.NewFrontend(nc, nc)
			fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
				Parameters: map[string]string{"user": "postgres", "database": "postgres"}})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			readUntilReady(t, fe)

			// Round 1: a failing Parse, then Flush; wait for the error.
			fe.Send(&pgproto3.Parse{Name: "s1", Query: "select broken syntax here("})
			fe.Send(&pgproto3.Flush{})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			msg, err := fe.Receive()
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := msg.(*pgproto3.ErrorResponse); !ok {
				t.Fatalf("want ErrorResponse, got %T", msg)
			}
			// Round 2: the rest of the pipeline, which the server skips.
			fe.Send(&pgproto3.Bind{PreparedStatement: "s1"})
			fe.Send(&pgproto3.Describe{ObjectType: 'P'})
			fe.Send(&pgproto3.Execute{})
			fe.Send(&pgproto3.Parse{Name: "s2", Query: "select 1"})
			fe.Send(&pgproto3.Sync{})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			rfq := readUntilReady(t, fe)
			if rfq != 'I' {
				t.Fatalf("status %q after Sync, want I", rfq)
			}
			// s2 was skipped, so it does not exist; s1 neither: both can be
			// prepared now, and the session still works.
			for _, name := range []string{"s1", "s2"} {
				fe.Send(&pgproto3.Parse{Name: name, Query: "select 41 + 1"})
			}
			fe.Send(&pgproto3.Bind{PreparedStatement: "s2"})
			fe.Send(&pgproto3.Execute{})
			fe.Send(&pgproto3.Sync{})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			var got string
			for {
				msg, err := fe.Receive()
				if err != nil {
					t.Fatal(err)
				}
				switch m := msg.(type) {
				case *pgproto3.ErrorResponse:
					t.Fatalf("unexpected error: %s %s", m.Code, m.Message)
				case *pgproto3.DataRow:
					got = string(m.Values[0])
				}
				if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
					break
				}
			}
			if got != "42" {
				t.Fatalf("got %q, want 42", got)
			}
			fe.Send(&pgproto3.Terminate{})
			_ = fe.Flush()
		})
	}
}

func readUntilReady(t *testing.T, fe *pgproto3.Frontend) byte {
	t.Helper()
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("waiting for ReadyForQuery: %v", err)
		}
		if r, ok := msg.(*pgproto3.ReadyForQuery); ok {
			return r.TxStatus
		}
	}
}
