package pooler_test

import (
	"bufio"
	"encoding/binary"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/pooler"
)

// TestPreauthHugeSASLMessage is the regression test for unauthenticated
// clients announcing huge authentication messages. With SCRAM configured, 8
// clients each announce a 60 MiB SASLInitialResponse and try to send 16 MiB
// of it. The pooler must refuse each at its header with FATAL 08P01 (a SASL
// message is at most 1024 bytes, as in PostgreSQL) and its heap must not
// grow by more than 4 MiB over the whole attack; an authenticated client
// still gets in afterwards. Before the fix the session accepted the header
// under the 64 MiB session limit and allocated all 60 MiB at once: the heap
// grew by about 480 MiB.
func TestPreauthHugeSASLMessage(t *testing.T) {
	const (
		clients   = 8
		announced = 60 << 20
		trickle   = 16 << 20
		chunk     = 64 << 10
		maxGrowth = 4 << 20
	)
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), cfg: pooler.Config{Auth: scramAuthenticator(t)}})
	ctx := testCtx(t, 2*time.Minute)
	{ // Warm up: one full login, so the pools and learnt parameters exist.
		c := h.connect(ctx, t)
		if _, err := c.Exec(ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
	}

	heapBefore, rssBefore := heapInuse(), processRSS(t)
	type result struct {
		sent int
		msgs []serverMsg
		err  error
	}
	results := make([]result, clients)
	var readers, senders sync.WaitGroup
	for i := range clients {
		conn, err := net.Dial("tcp", h.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(time.Minute))
		if _, err := conn.Write(startupMessage()); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		if m, err := readServerMsg(br); err != nil || !m.isSASLRequest() {
			t.Fatalf("client %d: want AuthenticationSASL, got %v %v", i, m, err)
		}
		readers.Add(1)
		senders.Add(1)
		go func() { // collect what the server says until it hangs up
			defer readers.Done()
			for {
				m, err := readServerMsg(br)
				if err != nil {
					return
				}
				results[i].msgs = append(results[i].msgs, m)
			}
		}()
		go func() { // announce 60 MiB, then send as much of it as the server takes
			defer senders.Done()
			hdr := binary.BigEndian.AppendUint32([]byte{'p'}, announced+4)
			hdr = append(hdr, "SCRAM-SHA-256\x00"...)
			hdr = binary.BigEndian.AppendUint32(hdr, uint32(announced-len("SCRAM-SHA-256\x00")-4))
			if _, err := conn.Write(hdr); err != nil {
				results[i].err = err
				return
			}
			buf := make([]byte, chunk)
			for results[i].sent < trickle {
				n, err := conn.Write(buf)
				results[i].sent += n
				if err != nil {
					results[i].err = err
					return
				}
			}
		}()
	}
	// Every client either sent its 16 MiB or was cut off (the connection
	// deadline bounds the wait).
	senders.Wait()
	heapAfter, rssAfter := heapInuse(), processRSS(t)
	growth := int64(heapAfter) - int64(heapBefore)
	t.Logf("%d clients announcing %d MiB: pooler heap in use grew by %.1f MiB, process RSS by %.1f MiB",
		clients, announced>>20, float64(growth)/(1<<20), float64(int64(rssAfter)-int64(rssBefore))/(1<<20))
	if growth > maxGrowth {
		t.Fatalf("heap in use grew by %d bytes during the attack, want at most %d", growth, maxGrowth)
	}

	readers.Wait() // the server hung up on every client
	for i, r := range results {
		if len(r.msgs) != 1 || r.msgs[0].errorField('C') != "08P01" || r.msgs[0].errorField('S') != "FATAL" ||
			r.msgs[0].errorField('M') != "invalid message length" {
			t.Errorf("client %d: server said %v, want one FATAL 08P01 invalid message length", i, r.msgs)
		}
	}
	// An authenticated client is unaffected.
	c := h.connect(ctx, t)
	if _, err := c.Exec(ctx, "select 1"); err != nil {
		t.Fatalf("authenticated client after the attack: %v", err)
	}
}

// heapInuse returns the heap's in-use bytes after a collection.
func heapInuse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// processRSS returns this process's resident set size from /proc.
func processRSS(t testing.TB) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatalf("reading RSS: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("parsing %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// TestPreauthLargestPasswordPacket: with the password method, a client may
// send a password packet of up to 65535 bytes (length word included), as
// PostgreSQL allows; 8 clients that send all but the last byte of one cost
// the pooler well under 4 MiB, and a packet one byte longer is refused with
// FATAL 08P01.
func TestPreauthLargestPasswordPacket(t *testing.T) {
	const (
		clients   = 8
		maxPacket = 65535
		maxGrowth = 4 << 20
	)
	users, err := pgauth.ParseUserlist(strings.NewReader(`"postgres" "postgres"` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	authn, err := pgauth.New(pgauth.Config{Method: pgauth.MethodPassword, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, harnessOpts{cluster: sharedCluster(t), cfg: pooler.Config{Auth: authn}})
	sh := &startingHarness{harness: h, ctx: testCtx(t, 2*time.Minute)}
	t.Cleanup(sh.wg.Wait)

	// start returns a session waiting for its password after the client
	// sent a packet header announcing length bytes.
	start := func(length int) net.Conn {
		c := sh.serve(t, nil)
		if _, err := c.Write(startupMessage()); err != nil {
			t.Fatal(err)
		}
		if m, err := readServerMsg(c); err != nil || m.typ != 'R' || binary.BigEndian.Uint32(m.body) != 3 {
			t.Fatalf("want AuthenticationCleartextPassword, got %v %v", m, err)
		}
		if _, err := c.Write(binary.BigEndian.AppendUint32([]byte{'p'}, uint32(length))); err != nil {
			t.Fatal(err)
		}
		return c
	}
	heapBefore := heapInuse()
	for range clients {
		c := start(maxPacket)
		// On a pipe, Write returns once the session has read every byte.
		if _, err := c.Write(make([]byte, maxPacket-4-1)); err != nil {
			t.Fatal(err)
		}
	}
	growth := int64(heapInuse()) - int64(heapBefore)
	t.Logf("%d clients each holding a %d-byte password packet less one byte: heap in use grew by %.2f MiB",
		clients, maxPacket, float64(growth)/(1<<20))
	if growth > maxGrowth {
		t.Fatalf("heap in use grew by %d bytes, want at most %d", growth, maxGrowth)
	}

	c := start(maxPacket + 1)
	m, err := readServerMsg(c)
	if err != nil || m.errorField('S') != "FATAL" || m.errorField('C') != "08P01" || m.errorField('M') != "invalid message length" {
		t.Fatalf("password packet of %d bytes: got %v %v, want FATAL 08P01 invalid message length", maxPacket+1, m, err)
	}
	sh.closeAll()
}
