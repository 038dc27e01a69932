//go:build linux

package wan

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// stampOOB is room for one SCM_TIMESTAMPNS control message.
const stampOOB = 64

// enableRxStamps asks the kernel to stamp every datagram or segment the
// socket receives with the time it arrived (SO_TIMESTAMPNS). Delays then
// count from arrival, not from when the relay's goroutine got to read it,
// so a relay starved of CPU for a few milliseconds still delivers on time,
// as a real path would. False when the socket refuses.
func enableRxStamps(c syscall.Conn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return false
	}
	return serr == nil
}

// rxAge returns how long ago the kernel received the bytes whose control
// messages are oob: 0 when there is no stamp or the clock stepped backwards,
// and at most maxRxAge.
func rxAge(oob []byte) time.Duration {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_TIMESTAMPNS || len(m.Data) < 16 {
			continue
		}
		sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
		nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
		age := time.Since(time.Unix(sec, nsec))
		return min(max(age, 0), maxRxAge)
	}
	return 0
}

// readUDPStamped reads one datagram and its age (see rxAge).
func readUDPStamped(c *net.UDPConn, buf, oob []byte) (int, netip.AddrPort, time.Duration, error) {
	n, oobn, _, from, err := c.ReadMsgUDPAddrPort(buf, oob)
	if err != nil {
		return n, from, 0, err
	}
	return n, from, rxAge(oob[:oobn]), nil
}

// stampedTCPReader returns a read function for c that also returns the age
// of the newest segment read (see rxAge), or a plain one when the socket
// cannot be stamped. It returns io.EOF at the end of the stream, like Read.
func stampedTCPReader(c *net.TCPConn) func([]byte) (int, time.Duration, error) {
	rc, err := c.SyscallConn()
	if err != nil || !enableRxStamps(c) {
		return plainTCPReader(c)
	}
	oob := make([]byte, stampOOB)
	return func(buf []byte) (int, time.Duration, error) {
		return readTCPStamped(rc, buf, oob)
	}
}

// readTCPStamped is one recvmsg on a stamped TCP socket through the poller.
func readTCPStamped(rc syscall.RawConn, buf, oob []byte) (int, time.Duration, error) {
	var (
		n, oobn int
		rerr    error
	)
	err := rc.Read(func(fd uintptr) bool {
		for {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
			if !errors.Is(rerr, unix.EINTR) {
				break
			}
		}
		// EAGAIN: nothing to read yet; wait for the poller.
		return !errors.Is(rerr, unix.EAGAIN)
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, 0, err
	}
	if n == 0 && len(buf) > 0 {
		return 0, 0, io.EOF
	}
	return n, rxAge(oob[:oobn]), nil
}
