// Package quicfront is pgquic's QUIC server front: it accepts QUIC
// connections and runs every client-initiated bidirectional stream as one
// PostgreSQL session, byte for byte as on TCP, through a front.Handler (the
// pooler). Only the pgquic binary imports it; applications dial it with
// package quicclient, and libpq clients reach it through the edge sidecar.
//
// The application error codes the server sends (pgproto.QUICErrorCode,
// exported to clients as quicclient.ErrorCode) are listed in README.md.
package quicfront

import "errors"

// ErrServerClosed is returned by Listen or Serve once the server was shut down.
var ErrServerClosed = errors.New("quicfront: server closed")
