package pooler

import "github.com/pgquic/pgquic/internal/front"

// Peer describes the client end of a session as the front end that accepted
// it knows it (its address, whether the transport is encrypted, how to start
// TLS, how to probe for a vanished client). It is the contract the fronts
// and the pooler share, defined in internal/front so that neither imports
// the other.
type Peer = front.Peer

// A Pooler is what the fronts hand their sessions to.
var _ front.Handler = (*Pooler)(nil)
