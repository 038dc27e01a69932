package model

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Linux's documented defaults, used when /proc cannot be read: the middle
// values of net.ipv4.tcp_rmem and tcp_wmem (ip-sysctl.rst) and
// net.core.rmem_max and wmem_max (212992 bytes on most systems).
const (
	DefaultTCPRecvBuffer = 131072
	DefaultTCPSendBuffer = 16384
	DefaultUDPBufferMax  = 212992
)

// SocketSizes are the kernel socket buffer sizes the model counts as each
// socket's memory. They are limits, the most the kernel will queue for a
// socket, not memory allocated up front: an idle socket holds far less.
type SocketSizes struct {
	// TCPRecv and TCPSend are a new TCP socket's buffer sizes, the middle
	// values of net.ipv4.tcp_rmem and tcp_wmem (autotuning may grow them
	// towards the third value under load).
	TCPRecv, TCPSend int64
	// UDPRecv and UDPSend are the QUIC socket's buffer sizes: the 7 MiB
	// quic-go asks for, capped at net.core.rmem_max and wmem_max unless the
	// process may exceed them (root or CAP_NET_ADMIN, which pgquic's Dialer
	// uses when it can).
	UDPRecv, UDPSend int64
	// Source says where the sizes came from: the sysctl directory read,
	// "Linux defaults", or the directory and the files it lacked.
	Source string
}

// cost returns the client file descriptors and kernel socket buffer bytes
// conns connections of a transport hold. TCP needs one socket, hence one
// descriptor, per connection; TLS adds no kernel state. pgquic's QUIC Dialer
// sends every connection through one shared UDP socket, so QUIC needs one
// descriptor and one pair of buffers whatever the number of connections and
// streams.
func (s SocketSizes) cost(tr Transport, conns int) (fds int, bytes int64) {
	if tr == QUIC {
		return 1, s.UDPRecv + s.UDPSend
	}
	return conns, int64(conns) * (s.TCPRecv + s.TCPSend)
}

// ReadSocketSizes reads the socket buffer sizes from the sysctl files under
// procSys (normally "/proc/sys"), falling back to Linux's documented
// defaults for any file it cannot read or parse. privileged tells whether
// the process may raise UDP buffers beyond net.core.rmem_max/wmem_max.
func ReadSocketSizes(procSys string, privileged bool) SocketSizes {
	var missing []string
	get := func(rel string, field int, def int64) int64 {
		p := filepath.Join(procSys, rel)
		b, err := os.ReadFile(p)
		if err == nil {
			f := strings.Fields(string(b))
			if field < len(f) {
				if v, err := strconv.ParseInt(f[field], 10, 64); err == nil && v > 0 {
					return v
				}
			}
		}
		missing = append(missing, rel)
		return def
	}
	s := SocketSizes{
		TCPRecv: get("net/ipv4/tcp_rmem", 1, DefaultTCPRecvBuffer),
		TCPSend: get("net/ipv4/tcp_wmem", 1, DefaultTCPSendBuffer),
		UDPRecv: QUICSocketBuffer,
		UDPSend: QUICSocketBuffer,
	}
	rmax := get("net/core/rmem_max", 0, DefaultUDPBufferMax)
	wmax := get("net/core/wmem_max", 0, DefaultUDPBufferMax)
	if !privileged {
		s.UDPRecv = min(s.UDPRecv, rmax)
		s.UDPSend = min(s.UDPSend, wmax)
	}
	switch len(missing) {
	case 0:
		s.Source = procSys
	case 4:
		s.Source = "Linux defaults"
	default:
		s.Source = fmt.Sprintf("%s; Linux defaults for %s", procSys, strings.Join(missing, ", "))
	}
	return s
}

// LocalSocketSizes reads this machine's socket buffer sizes from /proc/sys,
// counting the full QUIC buffers when running as root.
func LocalSocketSizes() SocketSizes {
	return ReadSocketSizes("/proc/sys", os.Geteuid() == 0)
}
