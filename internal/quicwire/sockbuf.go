package quicwire

import (
	"log/slog"
	"net"
	"os"
)

// udpBufferSize is the socket buffer size quic-go asks for (7 MiB); below it,
// bursts of packets are dropped by the kernel on fast links.
const udpBufferSize = 7 << 20

// RaiseUDPBuffers grows the socket's receive and send buffers to
// udpBufferSize and logs one line with the sysctl fix when the kernel caps
// them. quic-go checks the sizes again when the transport starts and would
// print its own warning through the standard logger; after logging here its
// warning is switched off (QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING), so
// operators see one clear message on the injected logger.
func RaiseUDPBuffers(conn *net.UDPConn, logger *slog.Logger) {
	_ = conn.SetReadBuffer(udpBufferSize)
	_ = conn.SetWriteBuffer(udpBufferSize)
	rcv, snd, ok := effectiveUDPBuffers(conn, udpBufferSize)
	if !ok {
		return
	}
	if rcv < udpBufferSize || snd < udpBufferSize {
		logger.Warn("UDP socket buffers are capped by the kernel; QUIC may drop packets under load. Fix: sysctl -w net.core.rmem_max=7500000 net.core.wmem_max=7500000",
			"recv_buffer_bytes", rcv, "send_buffer_bytes", snd, "wanted_bytes", udpBufferSize)
		_ = os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	}
}
