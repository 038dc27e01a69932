// Package quiclb is the connection-ID format that lets a load balancer
// route a QUIC connection to its replica whatever the client's address:
// the replica's server ID sits in plaintext in every connection ID the
// replica issues, after a first octet in the style of the QUIC-LB draft
// (draft-ietf-quic-load-balancers: config rotation bits, then the length
// self-encoded). quicfront encodes it (ServerConfig.ServerID), the test
// balancer internal/udplb decodes it. Standard library only.
//
// The ID is not encrypted: an observer of the path learns which replica
// a connection uses and can tell that two connection IDs belong to the
// same replica (not to the same connection: the other 17 bytes are
// random). The QUIC-LB draft's encrypted modes hide that; this format is
// what the draft's plaintext mode was, kept because it needs no shared key
// between the balancer and the replicas.
package quiclb

import (
	"crypto/rand"
	"errors"
	"fmt"
)

const (
	// CIDLen is the length of the connection IDs issued: the longest
	// QUIC allows, as quicfront issues without a server ID too (so that a
	// client's packets are long enough to be answered by a stateless
	// reset).
	CIDLen = 20
	// ServerIDLen is the length of the server ID, after the first octet:
	// 2 bytes, so IDs 1 to 65535 (0 is "no server ID").
	ServerIDLen = 2
	// configRotation is the QUIC-LB config rotation codepoint used (the
	// top 3 bits of the first octet); 0b111 would mean "unroutable".
	configRotation = 0
	// firstOctet is the config rotation and the length self-encoding
	// (CIDLen - 1 in the low 5 bits).
	firstOctet = configRotation<<5 | (CIDLen - 1)
)

// ErrServerID reports a server ID out of range.
var ErrServerID = errors.New("quiclb: server ID must be 1 to 65535")

// NewCID returns a new connection ID carrying serverID: the first octet,
// the ID big-endian, then random bytes.
func NewCID(serverID int) ([]byte, error) {
	if serverID < 1 || serverID > 0xffff {
		return nil, fmt.Errorf("%w, got %d", ErrServerID, serverID)
	}
	b := make([]byte, CIDLen)
	b[0] = firstOctet
	b[1], b[2] = byte(serverID>>8), byte(serverID)
	if _, err := rand.Read(b[1+ServerIDLen:]); err != nil {
		return nil, fmt.Errorf("quiclb: %w", err)
	}
	return b, nil
}

// ServerID decodes the server ID of a connection ID, or reports false
// when cid is not of this format (a client-chosen Initial DCID, a replica
// without a server ID).
func ServerID(cid []byte) (int, bool) {
	if len(cid) != CIDLen || cid[0] != firstOctet {
		return 0, false
	}
	id := int(cid[1])<<8 | int(cid[2])
	return id, id != 0
}

// DestConnID returns a QUIC packet's destination connection ID. In a
// long-header packet it is length-prefixed; a short-header packet's has
// no length on the wire, and CIDLen is assumed, which is what replicas
// with a server ID issue. ok is false for a datagram too short to be a
// QUIC packet.
//
// A balancer routes by ServerID(dcid) when it decodes, and otherwise by a
// hash of dcid: that is the client's first Initial (and 0-RTT) packets,
// whose DCID the client chose at random, the same on each retransmission.
// Once the server answered, even the client's Initial packets carry the
// server's ID, so the whole handshake reaches one replica. (A random DCID
// that happens to decode is routed consistently too, and any replica
// accepts a new connection.)
func DestConnID(pkt []byte) (dcid []byte, ok bool) {
	if len(pkt) == 0 {
		return nil, false
	}
	if pkt[0]&0x80 == 0 { // short header
		if len(pkt) < 1+CIDLen {
			return nil, false
		}
		return pkt[1 : 1+CIDLen], true
	}
	// Long header: flags, version (4 bytes), DCID length, DCID.
	if len(pkt) < 6 {
		return nil, false
	}
	l := int(pkt[5])
	if l > 20 || len(pkt) < 6+l {
		return nil, false
	}
	return pkt[6 : 6+l], true
}
