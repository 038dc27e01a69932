package wan

import (
	"errors"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// TCPPathInfo is what the kernel knows of one TCP connection's path
// (TCP_INFO): the figures the ramp reports per connection.
type TCPPathInfo struct {
	// Retransmits counts segments retransmitted over the connection's life
	// (tcpi_total_retrans).
	Retransmits uint64
	// SentPackets counts segments sent (tcpi_segs_out).
	SentPackets uint64
	// LostPackets counts retransmissions the receiver did not report as
	// duplicates (total_retrans - dsack_dups): segments that were lost.
	LostPackets uint64
	// SRTT is the kernel's smoothed round-trip time.
	SRTT time.Duration
}

// TCPInfo reads TCP_INFO of c, which must be (or wrap, via NetConn) a
// *net.TCPConn.
func TCPInfo(c net.Conn) (TCPPathInfo, error) {
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return TCPPathInfo{}, errors.New("wan: not a TCP connection")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return TCPPathInfo{}, err
	}
	var info *unix.TCPInfo
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return TCPPathInfo{}, err
	}
	if gerr != nil {
		return TCPPathInfo{}, gerr
	}
	lost := uint64(info.Total_retrans)
	lost -= min(lost, uint64(info.Dsack_dups))
	return TCPPathInfo{
		Retransmits: uint64(info.Total_retrans),
		SentPackets: uint64(info.Segs_out),
		LostPackets: lost,
		SRTT:        time.Duration(info.Rtt) * time.Microsecond,
	}, nil
}
