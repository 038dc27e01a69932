package quicfront

import (
	"fmt"

	"github.com/quic-go/quic-go"

	"github.com/pgquic/pgquic/internal/quiclb"
)

// serverIDGenerator issues connection IDs that carry the replica's server
// ID (internal/quiclb's format, after the QUIC-LB draft): a balancer that
// reads it sends every packet of a connection to the replica that holds
// it, also after the client's address changed (NAT rebinding, a move to
// another network), which a balancer hashing the 4-tuple cannot.
type serverIDGenerator struct{ id int }

// GenerateConnectionID returns a new routable connection ID.
func (g serverIDGenerator) GenerateConnectionID() (quic.ConnectionID, error) {
	b, err := quiclb.NewCID(g.id)
	if err != nil {
		return quic.ConnectionID{}, err
	}
	return quic.ConnectionIDFromBytes(b), nil
}

// ConnectionIDLen is quiclb.CIDLen, the same 20 bytes as without a server ID.
func (serverIDGenerator) ConnectionIDLen() int { return quiclb.CIDLen }

// cidGenerator returns the transport's ConnectionIDGenerator: nil (quic-go's
// random IDs of connIDLen bytes) without a ServerID.
func (c *ServerConfig) cidGenerator() quic.ConnectionIDGenerator {
	if c.ServerID == 0 {
		return nil
	}
	return serverIDGenerator{id: c.ServerID}
}

// validateServerID checks ServerConfig.ServerID.
func (c *ServerConfig) validateServerID() error {
	if c.ServerID != 0 && (c.ServerID < 1 || c.ServerID > 0xffff) {
		return fmt.Errorf("quicfront: ServerID %d: %w", c.ServerID, quiclb.ErrServerID)
	}
	return nil
}

// The routable IDs keep the length of the random ones.
var _ [quiclb.CIDLen - connIDLen]struct{}
var _ [connIDLen - quiclb.CIDLen]struct{}
