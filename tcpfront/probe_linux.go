package tcpfront

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// peerClosed reads the socket's TCP state: anything but ESTABLISHED
// (CLOSE_WAIT after the client's FIN, CLOSE after a reset) means the client
// is gone, even when it left unread bytes ahead of its FIN.
func peerClosed(fd int) error {
	ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return nil // cannot tell: assume alive, the peek found no end of file
	}
	if ti.State != unix.BPF_TCP_ESTABLISHED {
		return fmt.Errorf("%w: TCP state %d", errClientGone, ti.State)
	}
	return nil
}
