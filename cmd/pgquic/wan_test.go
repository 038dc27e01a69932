package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgquic/pgquic/loadgen/wan"
)

func TestWanUsage(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stdout string
		stderr []string
	}{
		{args: []string{"wan", "--help"}, code: 0, stdout: "-upstream"},
		{args: []string{"wan"}, code: 2, stderr: []string{"--listen is required", "--upstream is required", "--rtt is required"}},
		{args: []string{"wan", "--listen", "127.0.0.1:7000", "--upstream", "127.0.0.1:7000", "--rtt", "10ms"}, code: 2,
			stderr: []string{"are the same address"}},
		{args: []string{"wan", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:7000", "--rtt", "-5ms"}, code: 2,
			stderr: []string{"rtt -5ms must not be negative"}},
		{args: []string{"wan", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:7000", "--rtt", "10ms", "--loss", "1"}, code: 2,
			stderr: []string{"must be a probability in [0, 1)"}},
		{args: []string{"wan", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:7000", "--rtt", "10ms", "--jitter", "6ms"}, code: 2,
			stderr: []string{"must not exceed half the rtt"}},
		{args: []string{"wan", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:7000", "--rtt", "ten"}, code: 2,
			stderr: []string{`invalid value "ten" for flag -rtt`}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), tt.args, &stdout, &stderr)
			if code != tt.code {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.stdout) {
				t.Errorf("stdout lacks %q:\n%s", tt.stdout, stdout.String())
			}
			for _, want := range tt.stderr {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
				}
			}
		})
	}
}

// TestWanRun runs the subcommand in-process: it logs its address, relays
// to an echo server, and exits 0 with its counters when its context ends.
func TestWanRun(t *testing.T) {
	upstream := startEcho(t)
	var stderr lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"wan", "--listen", "127.0.0.1:0", "--upstream", upstream, "--rtt", "20ms"}, io.Discard, &stderr)
	}()
	ready := regexp.MustCompile(`msg="pgquic wan ready" listen=(\S+)`)
	var addr string
	deadline := time.Now().Add(testTimeout)
	for addr == "" {
		if m := ready.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("no ready line:\n%s", stderr.String())
		} else {
			time.Sleep(5 * time.Millisecond)
		}
	}
	start := time.Now()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 40*time.Millisecond {
		t.Errorf("dial and first exchange took %v, want at least two round trips (handshake and exchange) of 20ms", el)
	}
	_ = c.Close()
	cancel()
	if got := <-code; got != 0 {
		t.Fatalf("exit code %d\n%s", got, stderr.String())
	}
	if !strings.Contains(stderr.String(), `msg="pgquic wan stopped"`) {
		t.Fatalf("no stopped line:\n%s", stderr.String())
	}
}

// TestWanChildProcess builds the binary and runs `pgquic wan` the way the
// ramp does, through wan.StartProcess: the flags it passes and the log
// lines it reads must match what the subcommand accepts and writes.
func TestWanChildProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "pgquic")
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	upstream := startEcho(t)
	p, err := wan.StartProcess(ctx, wan.ProcessConfig{Path: bin, Args: []string{"wan"}}, wan.Config{Upstream: upstream, RTT: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	st, err := p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if st.TCP.ConnsTotal != 1 || st.TCP.Up.Bytes != 4 || st.TCP.Down.Bytes != 4 {
		t.Fatalf("final stats %+v", st)
	}
	if cpu, err := p.CPU(); err != nil || cpu <= 0 {
		t.Fatalf("child CPU %v, %v", cpu, err)
	}
}

// startEcho runs a TCP echo server on loopback until the test ends.
func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestWanNetnsCommand runs a command in packet mode's client namespace: it
// sees the path's address in PGHOST/PGPORT, reaches the upstream there over
// TCP, its exit status is wan's, and the namespaces are gone afterwards.
func TestWanNetnsCommand(t *testing.T) {
	if err := wan.PacketPermitted(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	upstream := startEcho(t)
	_, port, _ := net.SplitHostPort(upstream)
	var stdout, stderr lockedBuffer
	// The shell checks its environment and that the host's loopback
	// upstream is not what it reaches (its namespace has its own lo).
	script := `test "$PGHOST:$PGPORT" = "` + wan.ServerIP + `:` + port + `" && ip -o -4 addr show dev pgq0 | grep -q 198.18.0.1 && exit 7`
	code := run(context.Background(), []string{"wan", "--netns", "--upstream", upstream, "--rtt", "10ms", "--", "sh", "-c", script}, &stdout, &stderr)
	if code != 7 {
		t.Fatalf("exit %d, want the command's 7\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), "running sh in network namespace pgq-") {
		t.Errorf("stderr does not name the namespace: %s", stderr.String())
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), fmt.Sprintf("%s%d-", wan.NetnsPrefix, os.Getpid())) {
		t.Errorf("namespaces left: %s", out)
	}
	code = run(context.Background(), []string{"wan", "--listen", "127.0.0.1:0", "--upstream", upstream, "--rtt", "10ms", "--", "true"}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "needs --netns") {
		t.Errorf("a command without --netns: exit %d, %s", code, stderr.String())
	}
}
