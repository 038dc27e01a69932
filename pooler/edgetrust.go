package pooler

import (
	"crypto/x509"
	"fmt"

	"github.com/pgquic/pgquic/internal/front"
	"github.com/pgquic/pgquic/internal/pgauth"
	"github.com/pgquic/pgquic/internal/pgproto"
	"github.com/pgquic/pgquic/pooler/startup"
)

// EdgeTrust says which client certificates are trusted edges and what each
// may assert (Config.EdgeTrust). *pgauth.EdgeTrust implements it; a server
// that reloads its configuration implements it with whatever table is in
// force, so a reload applies to the next session.
type EdgeTrust interface {
	// Edge returns the grant of the client that presented this chain
	// (Peer.ClientCerts: leaf first, unverified; Edge verifies whatever
	// its lines need), false when it is not a trusted edge.
	Edge(certs []*x509.Certificate) (*pgauth.EdgeGrant, bool)
}

// edgeLogin decides a session's startup by edge trust before any password
// exchange. It reports trusted when the client's certificate is a trusted
// edge's and the edge may open sessions for the user and database asked
// for: the session then starts without authenticating, as PostgreSQL's
// cert method lets a certificate's holder in. A trusted edge asking for a
// user or database outside its set gets a FATAL 28000 refusal, logged
// with the edge's fingerprint; a certificate that is not a trusted edge's
// (or none) asserts nothing, and the session authenticates as usual. The
// admin console counts only when the grant names it, not through "*".
func (s *session) edgeLogin(sp *startup.Params) (trusted bool, refusal *PGError) {
	certs := s.peer.ClientCerts
	if s.p.cfg.EdgeTrust == nil || len(certs) == 0 || certs[0] == nil {
		return false, nil
	}
	g, ok := s.p.cfg.EdgeTrust.Edge(certs)
	if !ok {
		return false, nil
	}
	fp := front.Fingerprint(certs[0].Raw)
	dbOK := g.AllowsDatabase(sp.Database)
	if c := s.p.console(); c != nil && c.IsConsole(sp.Database) {
		dbOK = g.ListsDatabase(sp.Database)
	}
	if !g.AllowsUser(sp.User) || !dbOK {
		s.log.Warn("refusing a session from a trusted edge: user or database outside its set",
			"edge", fp, "edge_subject", pgauth.CertSubject(certs[0]), "edge_trust_line", g.Line, "user", sp.User, "database", sp.Database)
		return false, fatal(pgproto.CodeInvalidAuthSpec,
			fmt.Sprintf("edge certificate %.16s… is not allowed to open sessions for user %q on database %q", fp, sp.User, sp.Database), nil)
	}
	s.log.Debug("session started by a trusted edge", "edge", fp, "edge_subject", pgauth.CertSubject(certs[0]), "edge_trust_line", g.Line)
	return true, nil
}
