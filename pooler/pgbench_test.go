package pooler_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"
)

// pgbenchPath finds pgbench, failing under CI where it must be installed.
func pgbenchPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("pgbench")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("pgbench not found: %v", err)
		}
		t.Skip("pgbench not found")
	}
	return p
}

var failedRe = regexp.MustCompile(`number of failed transactions: (\d+)`)
var processedRe = regexp.MustCompile(`number of transactions actually processed: (\d+)`)

// TestPgbench runs pgbench -i (COPY included) and then pgbench -S in every
// query mode with 50 clients through a pool of 8 server connections.
func TestPgbench(t *testing.T) {
	bench := pgbenchPath(t)
	if testing.Short() {
		t.Skip("long")
	}
	// The pooler's warnings (a server connection lost, say) are shown
	// when the test fails, so a failure under load says what broke.
	logs := &lockedLog{}
	h := newHarness(t, harnessOpts{poolSize: 8,
		log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the pooler's warnings:\n%s", logs.String())
		}
	})
	host, port, _ := net.SplitHostPort(h.ln.Addr().String())
	env := append(os.Environ(), "PGHOST="+host, "PGPORT="+port, "PGUSER=postgres", "PGPASSWORD=postgres", "PGDATABASE=postgres", "PGSSLMODE=disable")
	run := func(t *testing.T, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bench, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("pgbench %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run(t, "-i", "-s", "1", "-q")
	dur := "10"
	if os.Getenv("PGQUIC_QUICK") != "" {
		dur = "3"
	}
	for _, mode := range []string{"simple", "extended", "prepared"} {
		t.Run(mode, func(t *testing.T) {
			out := run(t, "-S", "-M", mode, "-c", "50", "-j", "2", "-T", dur, "-n")
			m := processedRe.FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no processed count in output:\n%s", out)
			}
			n, _ := strconv.Atoi(m[1])
			if n == 0 {
				t.Fatalf("no transactions processed:\n%s", out)
			}
			if f := failedRe.FindStringSubmatch(out); f != nil && f[1] != "0" {
				t.Fatalf("failed transactions: %s\n%s", f[1], out)
			}
			t.Logf("%s: %d transactions; %s", mode, n, fmt.Sprint(regexp.MustCompile(`tps = [0-9.]+`).FindString(out)))
		})
	}
}

// lockedLog is an io.Writer for a test's logger that the pooler's
// goroutines may write to at once.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
