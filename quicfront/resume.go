package quicfront

// SetSessionTicketKeys replaces the keys that seal and open the TLS
// session tickets of new connections (tls.Config.SetSessionTicketKeys):
// the first seals, all open. A reload of the shared keys file rotates them
// without a restart; connections open already are not affected. It turns
// crypto/tls's automatic per-process key rotation off, as a keys file at
// start does.
func (s *Server) SetSessionTicketKeys(keys [][32]byte) {
	// quic-go clones this configuration for each new connection.
	s.tlsConf.SetSessionTicketKeys(keys)
}
