package model

import (
	"fmt"
	"time"
)

// EdgeLocal is the session path of a session-per-query run through an edge
// with local startup (pgquic edge --local-startup, or the Dialer's
// LocalStartup) over a warm QUIC connection: the edge answers the startup
// itself and sends StartupMessage and the first request to the pooler in
// one flight. It is a path of the churn model only.
const EdgeLocal Transport = "edge-local"

// ChurnPaths lists the session paths the churn model covers, in the order
// reports show them.
var ChurnPaths = []Transport{TCP, TCPTLS, EdgeLocal}

// TimeWait is how long Linux keeps a closed TCP connection's port in
// TIME_WAIT (TCP_TIMEWAIT_LEN, fixed at 60 s): the side that closes first
// holds it, and with session-per-query that is the client.
const TimeWait = 60 * time.Second

// ChurnRoundTrips returns the network round trips a query costs when it
// opens its own new session (what a short-lived serverless worker does),
// from the dial to its result, on path tr with the given authentication:
//
//   - tcp: TCP's handshake (1), the startup exchange (1 with trust, more
//     with a password, see StartupRoundTrips) and the query (1): 3 with trust.
//   - tcp+tls: TCP's handshake, the SSLRequest and its 'S', TLS 1.3's
//     handshake (1 each), then startup and query: 5 with trust.
//   - quic (a fresh connection each): QUIC's handshake with TLS 1.3 (1),
//     startup and query: 3 with trust.
//   - edge-local: 1, startup and query in one flight on a warm connection.
//     The pooler trusts the edge's certificate, so no password is asked
//     whatever auth says; the edge authenticates its local clients itself,
//     on loopback, which the model counts as free.
//
// Closing costs no round trip: the client sends Terminate and closes.
func ChurnRoundTrips(tr Transport, auth string) (int, error) {
	startup, err := StartupRoundTrips(auth)
	if err != nil {
		return 0, err
	}
	switch tr {
	case TCP, QUIC:
		return 1 + startup + 1, nil
	case TCPTLS:
		return 3 + startup + 1, nil
	case EdgeLocal:
		return 1, nil
	}
	return 0, fmt.Errorf("%w: session path %q is not one of %s, %s, %s, %s", ErrInput, tr, TCP, TCPTLS, QUIC, EdgeLocal)
}

// ChurnConnectRoundTrips is the part of ChurnRoundTrips before the session
// is ready (ReadyForQuery): all but the query's own round trip, and none
// for edge-local, whose startup is answered on the client's side at once.
func ChurnConnectRoundTrips(tr Transport, auth string) (int, error) {
	n, err := ChurnRoundTrips(tr, auth)
	if err != nil || tr == EdgeLocal {
		return 0, err
	}
	return n - 1, nil
}

// ChurnPerQuery is the time one session-per-query query holds its
// concurrency slot: roundTrips x RTT + exec + overhead. The pooler's work to
// accept and authenticate a new session is part of overhead only as far as
// the caller measured it; the model otherwise counts it as free.
func ChurnPerQuery(roundTrips int, rtt, exec, overhead time.Duration) time.Duration {
	return time.Duration(roundTrips)*rtt + exec + overhead
}

// PortCeiling returns the new TCP connections per second one client
// address can open to one server address when the client closes first:
// every connection's local port stays in TIME_WAIT for TimeWait, so
// ports / 60 s. Linux reuses TIME_WAIT ports early only on loopback
// (net.ipv4.tcp_tw_reuse = 2, its default), so this bounds TCP churn across
// a real path (the packet-mode emulator), not to a loopback relay. It is a
// sustained rate: any 60 s opens at most ports connections, so a shorter
// burst may go faster. 0 when ports is unknown.
func PortCeiling(ports int) float64 {
	if ports <= 0 {
		return 0
	}
	return float64(ports) / TimeWait.Seconds()
}
