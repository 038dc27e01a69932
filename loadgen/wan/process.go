package wan

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The log messages Run writes; StartProcess finds the child's address and
// final counters by them.
const (
	// ReadyMessage is logged once the relay listens, with its address in
	// the "listen" attribute.
	ReadyMessage = "pgquic wan ready"
	// StoppedMessage is logged after the relay closed, with its final Stats
	// in the "stats" attribute.
	StoppedMessage = "pgquic wan stopped"
	// StatsMessage is logged with the current Stats in the "stats"
	// attribute whenever the process gets SIGUSR2 (Process.Snapshot).
	StatsMessage = "pgquic wan stats"
)

// serveSnapshots logs StatsMessage with stats() at every SIGUSR2 until ctx
// is done, so a parent can read the counters at a moment of its choosing
// (the start of a measurement) without stopping the emulator.
func serveSnapshots(ctx context.Context, logger *slog.Logger, stats func() Stats) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR2)
	go func() {
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				logger.Info(StatsMessage, "stats", stats())
			}
		}
	}()
}

// Run starts a relay, logs ReadyMessage, relays until ctx is done, closes the
// relay and logs StoppedMessage with its counters. It is the body of
// `pgquic wan`.
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	if cfg.Packet {
		return runPacket(ctx, cfg, logger)
	}
	r, err := New(cfg, logger)
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	serveSnapshots(ctx, logger, r.Stats)
	logger.Info(ReadyMessage, "listen", r.Addr(), "upstream", r.cfg.Upstream,
		"rtt", r.cfg.RTT.String(), "jitter", r.cfg.Jitter.String(), "loss", r.cfg.Loss, "mode", ModeRelay)
	<-ctx.Done()
	_ = r.Close()
	logger.Info(StoppedMessage, "stats", r.Stats())
	return nil
}

// ProcessConfig says which executable runs the relay as a child process.
type ProcessConfig struct {
	// Path is the executable, for example the pgquic binary itself
	// (os.Executable() inside pgquic). Required.
	Path string
	// Args come before the relay's flags: []string{"wan"} for pgquic, none
	// for a test binary whose TestMain calls MainIfChild.
	Args []string
	// Env is added to the inherited environment (ChildEnv=1 for a test
	// binary).
	Env []string
	// Log receives the child's log lines (JSON); nil discards them.
	Log io.Writer
	// ReadyTimeout bounds the wait for the child's ReadyMessage. Default 30s.
	ReadyTimeout time.Duration
}

// Process is a relay running as a child process. Running the emulator in a
// process of its own is what lets a measurement report the emulator's CPU
// apart from the client's and the pooler's: Go cannot attribute CPU time to
// goroutines, but the kernel attributes it to processes.
type Process struct {
	cmd   *exec.Cmd
	addr  string
	netns string

	done     chan struct{} // closed once the child exited and was reaped
	stopOnce sync.Once
	mu       sync.Mutex
	final    *Stats
	snaps    chan Stats // StatsMessage lines, for Snapshot
	lastLine string
	waitErr  error
}

// StartProcess runs `Path Args... <cfg flags> --log-format json` and returns
// once the child listens. The child gets SIGTERM if ctx ends or if this
// process dies; call Stop to end it and collect its counters.
func StartProcess(ctx context.Context, pc ProcessConfig, cfg Config) (*Process, error) {
	if pc.Path == "" {
		return nil, errors.New("wan: ProcessConfig.Path is required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("wan: %w", err)
	}
	cfg = cfg.withDefaults()
	if pc.ReadyTimeout == 0 {
		pc.ReadyTimeout = 30 * time.Second
	}
	args := append(append(append([]string(nil), pc.Args...), cfg.Args()...), "--log-format", "json")
	cmd := exec.CommandContext(ctx, pc.Path, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = append(os.Environ(), pc.Env...)
	setParentDeathSignal(cmd)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("wan: %w", err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{}), snaps: make(chan Stats, 1)}
	// The kernel sends the parent-death signal when the thread that forked
	// the child ends, not the process, and Go ends threads (those a
	// goroutine left locked, as InNetns does). So the fork happens on a
	// thread locked until the child is reaped.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			<-p.done
		}
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("wan: start %s: %w", pc.Path, err)
	}
	ready := make(chan logLine, 1)
	go p.readLog(stderr, pc.Log, ready)

	timer := time.NewTimer(pc.ReadyTimeout)
	defer timer.Stop()
	select {
	case l := <-ready:
		p.addr, p.netns = l.Listen, l.Netns
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("wan: the relay process exited before it was ready: %w (last log line: %s)", p.waitErr, p.lastLine)
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = fmt.Errorf("no %q line within %v", ReadyMessage, pc.ReadyTimeout)
	}
	_ = cmd.Process.Kill()
	<-p.done
	return nil, fmt.Errorf("wan: the relay process did not start: %w", err)
}

// logLine is what readLog decodes from the child's JSON log lines.
type logLine struct {
	Msg    string `json:"msg"`
	Listen string `json:"listen"`
	Netns  string `json:"netns"`
	Stats  *Stats `json:"stats"`
}

// readLog copies the child's log to w, picks out the ready and stopped
// lines, then reaps the child. It owns the child's lifetime: done closes
// after Wait.
func (p *Process) readLog(r io.Reader, w io.Writer, ready chan<- logLine) {
	defer close(p.done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if w != nil {
			_, _ = fmt.Fprintf(w, "%s\n", line)
		}
		var l logLine
		if json.Unmarshal(line, &l) == nil {
			switch l.Msg {
			case ReadyMessage:
				select {
				case ready <- l:
				default:
				}
			case StoppedMessage:
				p.mu.Lock()
				p.final = l.Stats
				p.mu.Unlock()
			case StatsMessage:
				if l.Stats != nil {
					select {
					case p.snaps <- *l.Stats:
					default: // nobody asked: drop it
					}
				}
			}
		}
		p.mu.Lock()
		p.lastLine = string(line)
		p.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, r)
	err := p.cmd.Wait()
	p.mu.Lock()
	p.waitErr = err
	p.mu.Unlock()
}

// Addr is the address the child relays from, for TCP and UDP alike.
func (p *Process) Addr() string { return p.addr }

// Netns names the client network namespace in packet mode ("" in relay
// mode): clients must create their sockets there (InNetns) to reach Addr.
func (p *Process) Netns() string { return p.netns }

// Pid is the child's process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// CPU is the CPU time (user plus system) the child has used since it
// started. While it runs this is read from /proc/PID/stat, in clock ticks of
// 10 ms; after Stop it is the exact figure the kernel reported at exit.
func (p *Process) CPU() (time.Duration, error) {
	select {
	case <-p.done:
		st := p.cmd.ProcessState
		return st.UserTime() + st.SystemTime(), nil
	default:
	}
	return ProcCPU(p.cmd.Process.Pid)
}

// Snapshot asks the child for its counters now (SIGUSR2) and waits for them,
// at most timeout.
func (p *Process) Snapshot(timeout time.Duration) (Stats, error) {
	select {
	case <-p.snaps: // a stale answer
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		return Stats{}, fmt.Errorf("wan: ask the relay process for its counters: %w", err)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case st := <-p.snaps:
		return st, nil
	case <-p.done:
		return Stats{}, errors.New("wan: the relay process exited before it answered")
	case <-timer.C:
		return Stats{}, fmt.Errorf("wan: no counters from the relay process within %v", timeout)
	}
}

// Stop sends SIGTERM, waits for the child to exit (killing it after 30 s)
// and returns the counters it logged on its way out. Further calls return
// the same.
func (p *Process) Stop() (Stats, error) {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		timer := time.NewTimer(30 * time.Second)
		defer timer.Stop()
		select {
		case <-p.done:
		case <-timer.C:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.final == nil {
		return Stats{}, fmt.Errorf("wan: the relay process exited without its final counters: %w (last log line: %s)", p.waitErr, p.lastLine)
	}
	return *p.final, nil
}

// userHZ is the unit of the CPU times in /proc/PID/stat: USER_HZ, 100 on
// every Linux architecture Go supports.
const userHZ = 100

// ProcCPU reads the user plus system CPU time of process pid, all its
// threads, from /proc/PID/stat.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("wan: %w", err)
	}
	// The command name (field 2) may contain spaces; fields after it are
	// plain. utime and stime are fields 14 and 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("wan: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("wan: malformed /proc/%d/stat", pid)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("wan: /proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * time.Second / userHZ, nil
}

// ChildEnv names the environment variable that makes MainIfChild run a relay.
const ChildEnv = "PGQUIC_WAN_CHILD"

// MainIfChild turns a test binary into a relay child: when ChildEnv is "1"
// it parses the `pgquic wan` flags from os.Args, runs the relay until SIGTERM
// and exits. Call it first in TestMain; it returns at once otherwise. Tests
// then start their own binary (os.Args[0]) with StartProcess, since inside
// `go test` os.Executable() is not pgquic.
func MainIfChild() {
	if os.Getenv(ChildEnv) != "1" {
		return
	}
	os.Exit(childMain(os.Args[1:]))
}

func childMain(args []string) int {
	fs := flag.NewFlagSet("wan", flag.ContinueOnError)
	var cfg Config
	cfg.RegisterFlags(fs)
	fs.String("log-format", "json", "ignored: the child always logs JSON")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := Run(ctx, cfg, logger); err != nil {
		logger.Error("wan failed", "err", err)
		return 1
	}
	return 0
}
