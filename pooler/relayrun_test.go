package pooler_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestRepliesMatchTheServerByteForByte sends the same raw requests to
// PostgreSQL directly and through the pooler (one server connection, so
// every request reuses it) and compares the replies byte for byte. The
// requests are built to cross the places where the relay's one-pass
// forwarding of a reply stops and hands over to the message-by-message
// path: rows on both sides of the client writer's 8 KiB and the server
// reader's buffer, a pipeline of many results, a named statement the
// pooler answers itself the second time, an error in mid-pipeline, a
// notice between results, a suspended portal, empty queries and DEALLOCATE.
func TestRepliesMatchTheServerByteForByte(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	c := sharedCluster(t)
	h := newHarness(t, harnessOpts{cluster: c, poolSize: 1})

	direct := hijacked(ctx, t, c.SuperURL("postgres"))
	pooled := hijacked(ctx, t, h.url())

	for _, tc := range replyCases() {
		want := exchangeRaw(t, direct, tc.req, tc.syncs)
		got := exchangeRaw(t, pooled, tc.req, tc.syncs)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: the pooler's reply (%d bytes) differs from the server's (%d bytes) at byte %d:\n pooler %s\n server %s",
				tc.name, len(got), len(want), firstDiff(got, want), frameTypes(got), frameTypes(want))
		}
	}
}

// replyCase is a raw request and the number of ReadyForQuery it ends with.
type replyCase struct {
	name  string
	req   []byte
	syncs int
}

func replyCases() []replyCase {
	var cases []replyCase
	add := func(name string, syncs int, req []byte) {
		cases = append(cases, replyCase{name: name, req: req, syncs: syncs})
	}
	rows := "SELECT repeat('x', $1::int) FROM generate_series(1, $2::int)"

	// One result per request, rows of every size around the buffers.
	for _, size := range []int{0, 1, 100, 4000, 8150, 8180, 8186, 8187, 8192, 9000, 20000} {
		for _, n := range []int{1, 3} {
			var b []byte
			b = parseMsg(b, "", rows)
			b = bindMsg(b, "", strconv.Itoa(size), strconv.Itoa(n))
			b = appendMsg(b, 'D', []byte{'P', 0})
			b = executeMsg(b, 0)
			b = appendMsg(b, 'S')
			add(fmt.Sprintf("extended %dx%d", n, size), 1, b)
		}
	}

	// A pipeline of many results closed by one Sync, then by a Sync each.
	var pipe, each []byte
	for i := range 40 {
		for _, b := range []*[]byte{&pipe, &each} {
			*b = parseMsg(*b, "", rows)
			*b = bindMsg(*b, "", strconv.Itoa(i*97), strconv.Itoa(1+i%4))
			*b = appendMsg(*b, 'D', []byte{'P', 0})
			*b = executeMsg(*b, 0)
		}
		each = appendMsg(each, 'S')
	}
	add("pipeline of 40, one Sync", 1, appendMsg(pipe, 'S'))
	add("pipeline of 40, a Sync each", 40, each)

	// A named statement: prepared by the server the first time, answered
	// by the pooler from its cache the second time; then closed.
	var named []byte
	for range 2 {
		named = parseMsg(named, "s1", rows)
		named = appendMsg(named, 'D', []byte{'S', 's', '1', 0})
		named = bindMsg(named, "s1", "10", "2")
		named = executeMsg(named, 0)
		named = appendMsg(named, 'S')
		named = bindMsg(named, "s1", "3", "1")
		named = executeMsg(named, 0)
		named = appendMsg(named, 'S')
		named = closeMsg(named, "s1")
		named = appendMsg(named, 'S')
	}
	add("named statement twice", 6, named)

	// The pooler's own replies in the middle of a pipeline: a statement
	// closed and prepared again, which the server connection keeps, is
	// answered by the pooler between the server's replies.
	var again []byte
	for range 3 {
		again = parseMsg(again, "s2", rows)
		again = bindMsg(again, "s2", "5", "2")
		again = executeMsg(again, 0)
		again = closeMsg(again, "s2")
	}
	add("statement prepared again mid-pipeline", 1, appendMsg(again, 'S'))

	// An error in mid-pipeline: the server skips to the Sync.
	var fail []byte
	fail = parseMsg(fail, "", "SELECT 1")
	fail = bindMsg(fail, "")
	fail = executeMsg(fail, 0)
	fail = parseMsg(fail, "", "SELECT 1/0")
	fail = bindMsg(fail, "")
	fail = executeMsg(fail, 0)
	fail = parseMsg(fail, "", "SELECT 2")
	fail = bindMsg(fail, "")
	fail = executeMsg(fail, 0)
	fail = appendMsg(fail, 'S')
	fail = parseMsg(fail, "", "SELECT 3")
	fail = bindMsg(fail, "")
	fail = executeMsg(fail, 0)
	fail = appendMsg(fail, 'S')
	add("error mid-pipeline", 2, fail)

	// A portal read two rows at a time, and a notice between results.
	var mixed []byte
	mixed = parseMsg(mixed, "", "SELECT g FROM generate_series(1, 5) g")
	mixed = bindMsg(mixed, "")
	mixed = executeMsg(mixed, 2)
	mixed = executeMsg(mixed, 2)
	mixed = executeMsg(mixed, 0)
	mixed = appendMsg(mixed, 'S')
	add("suspended portal", 1, mixed)
	add("notice in the rows", 1, appendMsg(nil, 'Q', []byte(
		"SELECT 1; DO $$BEGIN RAISE NOTICE 'between'; END$$; SELECT repeat('y', 9000); SELECT 2\x00")))

	// Empty queries, in both protocols, and DEALLOCATE of nothing.
	add("empty simple", 1, appendMsg(nil, 'Q', []byte{0}))
	var empty []byte
	empty = parseMsg(empty, "", "")
	empty = bindMsg(empty, "")
	empty = executeMsg(empty, 0)
	empty = appendMsg(empty, 'S')
	add("empty extended", 1, empty)
	add("deallocate all", 1, appendMsg(nil, 'Q', []byte("DEALLOCATE ALL\x00")))
	return cases
}

func parseMsg(b []byte, name, sql string) []byte {
	return appendMsg(b, 'P', []byte(name), []byte{0}, []byte(sql), []byte{0}, []byte{0, 0})
}

// bindMsg binds the unnamed portal to statement name with text parameters.
func bindMsg(b []byte, name string, params ...string) []byte {
	body := append([]byte{0}, name...) // portal "", statement name
	body = append(body, 0, 0, 0)       // no parameter formats
	body = binary.BigEndian.AppendUint16(body, uint16(len(params)))
	for _, p := range params {
		body = binary.BigEndian.AppendUint32(body, uint32(len(p)))
		body = append(body, p...)
	}
	body = append(body, 0, 0) // no result formats
	return appendMsg(b, 'B', body)
}

func executeMsg(b []byte, maxRows uint32) []byte {
	return appendMsg(b, 'E', []byte{0}, binary.BigEndian.AppendUint32(nil, maxRows))
}

func closeMsg(b []byte, name string) []byte {
	return appendMsg(b, 'C', []byte{'S'}, []byte(name), []byte{0})
}

// hijacked is a logged-in raw connection to url.
func hijacked(ctx context.Context, t *testing.T, url string) net.Conn {
	t.Helper()
	pc, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	hc, err := pc.Hijack()
	if err != nil {
		t.Fatalf("hijack: %v", err)
	}
	t.Cleanup(func() { _ = hc.Conn.Close() })
	return hc.Conn
}

// exchangeRaw writes req and returns every byte of the reply up to the
// syncs-th ReadyForQuery.
func exchangeRaw(t *testing.T, conn net.Conn, req []byte, syncs int) []byte {
	t.Helper()
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	// Written from its own goroutine: a large pipeline's replies could
	// fill the socket buffers while the request is still being written.
	werr := make(chan error, 1)
	go func() {
		_, err := conn.Write(req)
		werr <- err
	}()
	var out []byte
	hdr := make([]byte, 5)
	for syncs > 0 {
		if _, err := io.ReadFull(conn, hdr); err != nil {
			t.Fatalf("reading a reply: %v", err)
		}
		body := make([]byte, int(binary.BigEndian.Uint32(hdr[1:]))-4)
		if _, err := io.ReadFull(conn, body); err != nil {
			t.Fatalf("reading a reply: %v", err)
		}
		out = append(append(out, hdr...), body...)
		if hdr[0] == 'Z' {
			syncs--
		}
	}
	if err := <-werr; err != nil {
		t.Fatalf("writing the request: %v", err)
	}
	return out
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// frameTypes lists the message types of a reply, for the failure message.
func frameTypes(b []byte) string {
	var s []byte
	for len(b) >= 5 {
		s = append(s, b[0])
		n := 1 + int(binary.BigEndian.Uint32(b[1:]))
		if n > len(b) {
			break
		}
		b = b[n:]
	}
	return string(s)
}
