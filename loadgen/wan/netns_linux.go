package wan

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Names and addresses of packet mode. Every namespace a run creates is
// named NetnsPrefix + the emulator's pid + a counter + "-c" (client) or
// "-s" (server), as in pgq-4242-1-c,
// so a later run can tell whose it was and remove those of a dead process.
// The addresses come from the benchmarking range 198.18.0.0/15 (RFC 2544)
// and exist only inside those namespaces.
const (
	NetnsPrefix = "pgq-"
	// ClientIP is the client namespace's address, ServerIP the server's.
	ClientIP = "198.18.0.1"
	ServerIP = "198.18.0.2"
	// tunName is the TUN device's name in both namespaces.
	tunName = "pgq0"
	// netnsDir is where `ip netns` keeps its named namespaces.
	netnsDir = "/run/netns"
)

// Linux capability bits PacketPermitted looks for.
const (
	capNetAdmin = 12
	capSysAdmin = 21
)

// PacketPermitted reports why packet mode cannot run here, or nil: it needs
// CAP_NET_ADMIN and CAP_SYS_ADMIN (root has both), /dev/net/tun and the ip
// command (iproute2).
func PacketPermitted() error {
	eff, err := effectiveCaps()
	if err != nil {
		return err
	}
	if eff&(1<<capNetAdmin) == 0 || eff&(1<<capSysAdmin) == 0 {
		return errors.New("packet mode needs root or CAP_NET_ADMIN+CAP_SYS_ADMIN, which this process lacks")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("packet mode needs /dev/net/tun: %w", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("packet mode needs the ip command (iproute2): %w", err)
	}
	return nil
}

// effectiveCaps reads CapEff from /proc/self/status.
func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("wan: read capabilities: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("wan: no CapEff in /proc/self/status")
}

// ipCmd runs the ip command with a bound on its time.
func ipCmd(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// staleName matches the namespaces packet mode creates.
var staleName = regexp.MustCompile(`^` + NetnsPrefix + `([0-9]+)-[0-9]+-[cs]$`)

// pathSeq numbers the paths one process creates, so several can run at once.
var pathSeq atomic.Int64

// RemoveStale deletes the namespaces of packet-mode runs whose process is
// gone (killed before it could clean up), and returns their names. Their
// TUN devices went with the process that held them open.
func RemoveStale() ([]string, error) {
	ents, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wan: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		m := staleName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid > 0 && unix.Kill(pid, 0) != unix.ESRCH {
			continue // alive (or not ours to signal): not stale
		}
		if err := ipCmd("netns", "delete", e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

// InNetns runs fn on an OS thread that has joined the named network
// namespace, so the sockets fn creates live there (they keep working from
// any thread afterwards). The thread is discarded when fn returns, never
// handed back to other goroutines.
func InNetns(name string, fn func() error) error {
	f, err := os.Open(netnsDir + "/" + name)
	if err != nil {
		return fmt.Errorf("wan: network namespace %s: %w", name, err)
	}
	defer f.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the goroutine exits locked, so the runtime
		// ends this thread instead of reusing it in the wrong namespace.
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("wan: join network namespace %s: %w", name, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// pathNamespaces are the two namespaces of one packet-mode emulator.
type pathNamespaces struct {
	client, server string
}

// createNamespaces makes pgq-PID-N-c and pgq-PID-N-s (N counts the paths
// of this process), removing both again if either fails.
func createNamespaces(pid int) (*pathNamespaces, error) {
	n := pathSeq.Add(1)
	ns := &pathNamespaces{
		client: fmt.Sprintf("%s%d-%d-c", NetnsPrefix, pid, n),
		server: fmt.Sprintf("%s%d-%d-s", NetnsPrefix, pid, n),
	}
	for _, n := range []string{ns.client, ns.server} {
		if err := ipCmd("netns", "add", n); err != nil {
			ns.remove()
			return nil, err
		}
		if err := ipCmd("-n", n, "link", "set", "lo", "up"); err != nil {
			ns.remove()
			return nil, err
		}
	}
	return ns, nil
}

// remove deletes both namespaces (ignoring ones already gone).
func (ns *pathNamespaces) remove() error {
	var errs []error
	for _, n := range []string{ns.client, ns.server} {
		if _, err := os.Stat(netnsDir + "/" + n); err != nil {
			continue
		}
		if err := ipCmd("netns", "delete", n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// openTUN creates the TUN device inside namespace ns, gives it local and
// its point-to-point peer, and brings it up. The returned file reads and
// writes whole IP packets (no packet-information header) through Go's
// poller.
func openTUN(ns, local, peer string) (*os.File, error) {
	var tun *os.File
	err := InNetns(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("wan: open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(tunName)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("wan: create TUN device in %s: %w", ns, err)
		}
		tun = os.NewFile(uintptr(fd), "/dev/net/tun")
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"-n", ns, "addr", "add", local, "peer", peer, "dev", tunName},
		{"-n", ns, "link", "set", tunName, "mtu", strconv.Itoa(maxPacket), "txqueuelen", "1000", "up"},
	} {
		if err := ipCmd(args...); err != nil {
			tun.Close()
			return nil, err
		}
	}
	return tun, nil
}
