//go:build linux && (amd64 || arm64)

package quicwire

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// rawUDP is a *net.UDPConn whose batched reads and whose writes with
// ancillary data are raw system calls (see PacketConn). Everything else
// (addresses, deadlines, buffers, SyscallConn, Close) is the socket's own.
type rawUDP struct {
	*net.UDPConn
	rc     syscall.RawConn
	family int // AF_INET or AF_INET6, the socket's

	rmu    sync.Mutex // serializes ReadBatch; quic-go reads from one goroutine
	hdrs   []mmsghdr
	iovs   []unix.Iovec
	names  []unix.RawSockaddrInet6 // large enough for either family
	rmsgs  []ipv4.Message          // the caller's messages while a ReadBatch runs
	rn     int
	rerr   error
	addrs  addrCache
	readFn func(fd uintptr) bool // r.readFD, bound once so a read allocates nothing

	wmu     sync.Mutex // serializes WriteMsgUDP
	whdr    unix.Msghdr
	wiov    unix.Iovec
	wname   unix.RawSockaddrInet6
	wzone   string // the last send's IPv6 zone and its interface index
	wscope  uint32
	wn      int
	werr    error
	writeFn func(fd uintptr) bool // r.writeFD, bound once
}

// mmsghdr is struct mmsghdr of recvmmsg(2) on 64-bit Linux.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// newRawUDP wraps c, or returns it unchanged when its raw socket or its
// address family cannot be had.
func newRawUDP(c *net.UDPConn) net.PacketConn {
	rc, err := c.SyscallConn()
	if err != nil {
		return c
	}
	family := -1
	if cerr := rc.Control(func(fd uintptr) {
		family, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN)
	}); cerr != nil || err != nil || (family != unix.AF_INET && family != unix.AF_INET6) {
		return c
	}
	r := &rawUDP{UDPConn: c, rc: rc, family: family}
	r.readFn = r.readFD
	r.writeFn = r.writeFD
	return r
}

// ReadBatch reads up to len(ms) datagrams with one recvmmsg(2), like
// ipv4.PacketConn.ReadBatch (quic-go's batch reader): each message's first
// buffer receives the datagram and OOB its control messages; N, NN, Flags
// and Addr are set. It waits in the network poller while nothing is there;
// flags is ignored (the call itself never waits: MSG_DONTWAIT).
func (r *rawUDP) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	r.rmu.Lock()
	defer r.rmu.Unlock()
	if len(r.hdrs) < len(ms) {
		r.hdrs = make([]mmsghdr, len(ms))
		r.iovs = make([]unix.Iovec, len(ms))
		r.names = make([]unix.RawSockaddrInet6, len(ms))
	}
	for i := range ms {
		if len(ms[i].Buffers) != 1 || len(ms[i].Buffers[0]) == 0 {
			return 0, errors.New("quicwire: ReadBatch needs exactly one non-empty buffer per message")
		}
		b := ms[i].Buffers[0]
		r.iovs[i] = unix.Iovec{Base: &b[0]}
		r.iovs[i].SetLen(len(b))
		h := &r.hdrs[i].hdr
		*h = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&r.names[i])), Namelen: uint32(unsafe.Sizeof(r.names[i])), Iov: &r.iovs[i]}
		h.SetIovlen(1)
		if len(ms[i].OOB) > 0 {
			h.Control = &ms[i].OOB[0]
			h.SetControllen(len(ms[i].OOB))
		}
		r.hdrs[i].len = 0
	}
	r.rmsgs, r.rn, r.rerr = ms, 0, nil
	err := r.rc.Read(r.readFn)
	n, rerr := r.rn, r.rerr
	r.rmsgs, r.rerr = nil, nil
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, r.opError("read", nil, err)
	}
	for i := range n {
		h := &r.hdrs[i]
		ms[i].N = int(h.len)
		ms[i].NN = int(h.hdr.Controllen)
		ms[i].Flags = int(h.hdr.Flags)
		ms[i].Addr = r.peer(&r.names[i])
	}
	return n, nil
}

// readFD is called by RawConn.Read with the socket: one recvmmsg(2), false
// (wait in the poller) when nothing is there.
func (r *rawUDP) readFD(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(len(r.rmsgs)),
			unix.MSG_DONTWAIT, 0, 0)
		if e != syscall.EINTR {
			r.rn, r.rerr = int(n), callError("recvmmsg", e)
			return e != syscall.EAGAIN
		}
	}
}

// callError is a raw system call's failure as the net package reports it,
// nil for success and for EAGAIN (the caller waits in the poller and
// calls again).
func callError(name string, e syscall.Errno) error {
	if e == 0 || e == syscall.EAGAIN {
		return nil
	}
	return os.NewSyscallError(name, e)
}

// peer returns the sender address recvmmsg wrote into sa, from the cache.
func (r *rawUDP) peer(sa *unix.RawSockaddrInet6) net.Addr {
	var k peerKey
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		copy(k.ip[:], sa4.Addr[:])
		k.port, k.v4 = ntohs(sa4.Port), true
	case unix.AF_INET6:
		k.ip, k.port, k.scope = sa.Addr, ntohs(sa.Port), sa.Scope_id
	default:
		return nil
	}
	return r.addrs.get(k)
}

// WriteMsgUDP sends b with the control messages oob to addr with one raw
// sendmsg(2), like (*net.UDPConn).WriteMsgUDP; it waits in the network
// poller while the send buffer is full.
func (r *rawUDP) WriteMsgUDP(b, oob []byte, addr *net.UDPAddr) (n, oobn int, err error) {
	if addr == nil {
		return r.UDPConn.WriteMsgUDP(b, oob, addr) // a connected socket: the net package's way
	}
	r.wmu.Lock()
	defer r.wmu.Unlock()
	nameLen, ok := r.sockaddr(addr)
	if !ok {
		return 0, 0, r.opError("write", addr, os.NewSyscallError("sendmsg", syscall.EAFNOSUPPORT))
	}
	r.whdr = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&r.wname)), Namelen: nameLen}
	if len(b) > 0 {
		r.wiov = unix.Iovec{Base: &b[0]}
		r.wiov.SetLen(len(b))
		r.whdr.Iov = &r.wiov
		r.whdr.SetIovlen(1)
	}
	if len(oob) > 0 {
		r.whdr.Control = &oob[0]
		r.whdr.SetControllen(len(oob))
	}
	r.wn, r.werr = 0, nil
	err = r.rc.Write(r.writeFn)
	n, werr := r.wn, r.werr
	r.whdr, r.wiov, r.werr = unix.Msghdr{}, unix.Iovec{}, nil
	if err == nil {
		err = werr
	}
	if err != nil {
		return 0, 0, r.opError("write", addr, err)
	}
	return n, len(oob), nil
}

// writeFD is called by RawConn.Write with the socket: one sendmsg(2),
// false (wait in the poller) when the send buffer is full.
func (r *rawUDP) writeFD(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&r.whdr)), 0)
		if e != syscall.EINTR {
			r.wn, r.werr = int(n), callError("sendmsg", e)
			return e != syscall.EAGAIN
		}
	}
}

// sockaddr writes addr into r.wname in the socket's family and returns its
// length; ok is false for an IPv6 address on an IPv4 socket.
func (r *rawUDP) sockaddr(addr *net.UDPAddr) (uint32, bool) {
	if r.family == unix.AF_INET {
		ip4 := addr.IP.To4()
		if ip4 == nil {
			return 0, false
		}
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&r.wname))
		*sa = unix.RawSockaddrInet4{Family: unix.AF_INET, Port: htons(addr.Port)}
		copy(sa.Addr[:], ip4)
		return uint32(unsafe.Sizeof(*sa)), true
	}
	ip := addr.IP.To16()
	if ip == nil {
		return 0, false
	}
	r.wname = unix.RawSockaddrInet6{Family: unix.AF_INET6, Port: htons(addr.Port)}
	copy(r.wname.Addr[:], ip)
	if addr.Zone != r.wzone {
		r.wzone, r.wscope = addr.Zone, zoneIndex(addr.Zone) // looked up again only when the zone changes
	}
	r.wname.Scope_id = r.wscope
	return uint32(unsafe.Sizeof(r.wname)), true
}

// opError wraps err as the net package does for a failed read or write, so
// quic-go's checks (errors.As *os.SyscallError, errors.Is net.ErrClosed,
// a deadline's Timeout) see what they would see without the wrapper.
func (r *rawUDP) opError(op string, addr net.Addr, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err // RawConn's own "raw-read"/"raw-write" error
	}
	return &net.OpError{Op: op, Net: "udp", Source: r.LocalAddr(), Addr: addr, Err: err}
}

// htons converts a port to the network byte order a sockaddr holds (the
// architectures this file builds for are little-endian).
func htons(port int) uint16 {
	p := uint16(port)
	return p<<8 | p>>8
}

// ntohs converts a sockaddr's port to host order.
func ntohs(p uint16) uint16 { return p<<8 | p>>8 }
