package pooler

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// 0-RTT: a resumed QUIC client may send its startup and first request in
// its first flight, before the handshake is confirmed. Those bytes can be
// captured and sent again by anyone, to this server or to a replica
// sharing its ticket keys, so the pooler treats them as replayable until
// the front closes Peer.HandshakeConfirmed: it reads the startup and
// authenticates (trust, an edge's certificate; a password exchange needs
// the client's answer, which comes after the client finished its
// handshake anyway), answers the startup at once, and holds every request
// until the confirmation. A replayed flight therefore never reaches a
// server connection: the replayer cannot complete the handshake, the
// confirmation never comes, and the session ends when the front reports
// the connection gone.

// confirmPoll is how often a session waiting for its handshake's
// confirmation asks the front whether the client is still there.
const confirmPoll = 20 * time.Millisecond

// awaitConfirmed holds the session's next request until the transport's
// handshake is confirmed (it returns nil at once when it is, or was never
// in doubt). It flushes what the session owes the client first, so the
// startup's answer is not held with the request. It returns an error when
// the client is gone or the session ends before the confirmation: the
// request is then never run.
func (s *session) awaitConfirmed(ctx context.Context) error {
	confirmed := s.peer.HandshakeConfirmed
	select {
	case <-confirmed:
		s.peer.HandshakeConfirmed = nil
		return nil
	default:
	}
	s.p.m.zeroRTT.WithLabelValues("deferred").Inc()
	if err := s.flushAll(); err != nil {
		return err
	}
	t := time.NewTicker(confirmPoll)
	defer t.Stop()
	for {
		select {
		case <-confirmed:
			s.peer.HandshakeConfirmed = nil
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if s.peer.Probe != nil {
				if err := s.peer.Probe(); err != nil {
					return fmt.Errorf("client gone before its handshake was confirmed: %w", err)
				}
			}
			if s.isKilled() {
				return ErrShuttingDown
			}
		}
	}
}

// newZeroRTTCounter counts the requests that arrived before their
// handshake was confirmed, by outcome: "deferred" (held until the
// confirmation, then run as usual).
func newZeroRTTCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "pgquic", Subsystem: "pooler", Name: "zero_rtt_requests_total",
		Help: "Client requests received before the transport's handshake was confirmed (0-RTT), by outcome.",
	}, []string{"outcome"})
}
