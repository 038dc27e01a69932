package model

import (
	"math"
	"time"
)

// Constants of the loss-recovery model, from the transports' own
// specifications and Linux's TCP.
const (
	// TCPMinRTO is Linux's TCP_RTO_MIN: its retransmission timeout is
	// SRTT + max(4·RTTVAR, TCP_RTO_MIN), so on a steady path RTT + 200 ms.
	TCPMinRTO = 200 * time.Millisecond
	// QUICTimeThreshold is RFC 9002's kTimeThreshold: a packet is declared
	// lost 9/8 of an RTT after it was sent once a later one is
	// acknowledged, which on a connection shared by many busy streams is
	// soon.
	QUICTimeThreshold = 9.0 / 8
	// DefaultPacketsPerQuery is the packets on a small query's critical
	// path: its request one way and its answer the other.
	DefaultPacketsPerQuery = 2
)

// LossRecovery returns the time a lost packet on a query's critical path
// adds to that query, per transport.
//
// TCP (one session per connection, one segment in flight): no later
// segment can reveal the loss, and Linux's tail loss probe (2·SRTT +
// TCP_RTO_MIN with one segment out) would come after the retransmission
// timeout, so the RTO, SRTT + max(4·RTTVAR, 200 ms), resends it; the
// resent segment then needs its half of the round trip again, so the query
// takes about RTT + 200 ms longer than without the loss, and the session's
// next queries wait behind it (head-of-line).
//
// QUIC (many streams per connection): other streams' packets are
// acknowledged meanwhile, so the lost one is declared lost after 9/8·RTT
// and resent, adding 9/8·RTT to the one stream that lost it; the
// connection's other streams do not wait.
func LossRecovery(tr Transport, rtt time.Duration) time.Duration {
	if tr == QUIC {
		return time.Duration(QUICTimeThreshold * float64(rtt))
	}
	return rtt + TCPMinRTO
}

// LossHitRate is the fraction of queries that lose at least one of their
// packets when each is lost independently with probability loss.
func LossHitRate(loss float64, packets int) float64 {
	if loss <= 0 || packets <= 0 {
		return 0
	}
	return 1 - math.Pow(1-loss, float64(packets))
}

// LossInflation returns the mean latency loss adds per query:
// LossHitRate x LossRecovery. Burst losses hit fewer queries for the same
// loss rate (a burst takes out several packets of a few queries), so for
// them this is an upper bound.
func LossInflation(tr Transport, rtt time.Duration, loss float64, packets int) time.Duration {
	return time.Duration(LossHitRate(loss, packets) * float64(LossRecovery(tr, rtt)))
}

// BandwidthCeiling returns the queries per second a bottleneck of
// bitsPerSecond carries when each query puts bytesPerQuery on it (headers
// and acknowledgements included); 0 when either is unknown.
func BandwidthCeiling(bitsPerSecond int64, bytesPerQuery float64) float64 {
	if bitsPerSecond <= 0 || bytesPerQuery <= 0 {
		return 0
	}
	return float64(bitsPerSecond) / 8 / bytesPerQuery
}

// QueueDelayMax is the longest a packet waits in a full drop-tail queue of
// queueBytes drained at bitsPerSecond.
func QueueDelayMax(bitsPerSecond int64, queueBytes int) time.Duration {
	if bitsPerSecond <= 0 {
		return 0
	}
	return time.Duration(float64(queueBytes) * 8 / float64(bitsPerSecond) * float64(time.Second))
}
