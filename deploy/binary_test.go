package deploy

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// pgquicBinary builds ./cmd/pgquic once per test run the way the container
// build file does (CGO_ENABLED=0, so statically linked) and returns its path.
func pgquicBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "pgquic-deploy-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "pgquic")
		cmd := exec.Command("go", "build", "-trimpath", "-o", binPath, "../cmd/pgquic")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// TestBinaryIsStatic: the image is distroless "static" (no libc), so the
// binary must not ask for a dynamic loader.
func TestBinaryIsStatic(t *testing.T) {
	f, err := elf.Open(pgquicBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the CGO_ENABLED=0 binary has a dynamic loader (PT_INTERP)")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("the binary links shared libraries: %v", libs)
	}
}

// serveFlags returns the flags `pgquic serve --help` lists.
func serveFlags(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command(pgquicBinary(t), "serve", "--help").Output()
	if err != nil {
		t.Fatalf("pgquic serve --help: %v", err)
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if !flags["config"] || !flags["metrics-listen"] || !flags["quic-stateless-reset-key-file"] {
		t.Fatalf("serve --help lists unexpected flags: %v\n%s", flags, out)
	}
	return flags
}

// runningServe is a `pgquic serve` child process.
type runningServe struct {
	cmd                *exec.Cmd
	logs               *lockedBuffer
	tcp, quic, metrics string // bound addresses, from the ready line
	done               chan error
}

// readyLine matches the addresses in serve's one "ready" log line.
var readyLine = regexp.MustCompile(`pgquic ready.* tcp=(\S+) .*quic=(\S+) .*metrics=http://([^/\s]+)/metrics`)

// startServe runs the built binary with args (listen addresses may use port
// 0; metrics must be on), waits for its ready line and for /readyz. The
// process is killed at cleanup if still running.
func startServe(t *testing.T, args ...string) *runningServe {
	t.Helper()
	logs := &lockedBuffer{}
	cmd := exec.Command(pgquicBinary(t), append([]string{"serve"}, args...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rs := &runningServe{cmd: cmd, logs: logs, done: make(chan error, 1)}
	go func() { rs.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-rs.done
		if t.Failed() {
			t.Logf("pgquic serve %v logs:\n%s", args, logs.String())
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		if m := readyLine.FindStringSubmatch(logs.String()); m != nil {
			rs.tcp, rs.quic, rs.metrics = m[1], m[2], m[3]
			if code, _, err := httpGet("http://" + rs.metrics + "/readyz"); err == nil && code == http.StatusOK {
				return rs
			}
		}
		select {
		case err := <-rs.done:
			rs.done <- err
			t.Fatalf("pgquic serve exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgquic serve not ready within a minute:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// httpGet returns the status and body of a GET.
func httpGet(url string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// lockedBuffer collects a child's output safely.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
