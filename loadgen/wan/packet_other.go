//go:build !linux

package wan

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"
)

// PacketPermitted reports that packet mode needs Linux.
func PacketPermitted() error { return errors.New("packet mode needs Linux network namespaces") }

// InNetns is not available outside Linux.
func InNetns(string, func() error) error { return PacketPermitted() }

func runPacket(context.Context, Config, *slog.Logger) error { return PacketPermitted() }

// TCPPathInfo is what the kernel knows of a TCP connection's path (Linux
// only).
type TCPPathInfo struct {
	Retransmits, SentPackets, LostPackets uint64
	SRTT                                  time.Duration
}

// TCPInfo needs Linux's TCP_INFO.
func TCPInfo(net.Conn) (TCPPathInfo, error) { return TCPPathInfo{}, PacketPermitted() }
