package pgauth

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"sync"
	"time"
)

// maxVerdicts bounds the chains an EdgeTrust remembers; when full it
// forgets them all, so a client presenting ever new certificates costs a
// Verify each, as without the cache, and no more memory.
const maxVerdicts = 4096

// verdictCache remembers which CA line (or none) trusted a chain, so a
// QUIC connection's sessions, which share its chain, pay x509.Verify (a
// few hundred microseconds for a chain with an intermediate) once. A
// verdict is a function of the chain, the table and the time, and the
// time matters only where a certificate of the chain or of a CA file
// becomes valid (NotBefore) or expires (after NotAfter): a verdict is kept
// until the next such moment, so an expiring certificate stops asserting
// exactly when it would without the cache, and a new table (a reload)
// starts with an empty cache.
type verdictCache struct {
	mu sync.Mutex
	m  map[[sha256.Size]byte]verdict
}

type verdict struct {
	g     *EdgeGrant // nil: no CA line trusts the chain
	until time.Time  // the verdict holds before this moment
}

// get returns the verdict on key if one holds at time at.
func (c *verdictCache) get(key [sha256.Size]byte, at time.Time) (*EdgeGrant, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[key]
	if !ok || !at.Before(v.until) {
		return nil, false
	}
	return v.g, true
}

// put remembers the verdict g on key until until.
func (c *verdictCache) put(key [sha256.Size]byte, g *EdgeGrant, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxVerdicts {
		c.m = make(map[[sha256.Size]byte]verdict)
	}
	c.m[key] = verdict{g: g, until: until}
}

// chainKey identifies a presented chain by its certificates' DER bytes.
func chainKey(certs []*x509.Certificate) [sha256.Size]byte {
	h := sha256.New()
	var n [4]byte
	for _, c := range certs {
		if c == nil {
			continue
		}
		binary.BigEndian.PutUint32(n[:], uint32(len(c.Raw)))
		h.Write(n[:])
		h.Write(c.Raw)
	}
	var k [sha256.Size]byte
	h.Sum(k[:0])
	return k
}

// validityBounds are the moments c becomes valid and stops being valid
// (x509 accepts NotAfter itself).
func validityBounds(c *x509.Certificate) []time.Time {
	return []time.Time{c.NotBefore, c.NotAfter.Add(time.Nanosecond)}
}

// nextBound returns the first validity bound after at among the chain's
// and the CA files' certificates; an hour from at when none comes sooner.
func nextBound(at time.Time, certs []*x509.Certificate, rootTimes []time.Time) time.Time {
	next := at.Add(time.Hour)
	consider := func(t time.Time) {
		if t.After(at) && t.Before(next) {
			next = t
		}
	}
	for _, t := range rootTimes {
		consider(t)
	}
	for _, c := range certs {
		if c != nil {
			for _, t := range validityBounds(c) {
				consider(t)
			}
		}
	}
	return next
}
