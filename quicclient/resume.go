package quicclient

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/pgquic/pgquic/internal/localstart"
)

// Limits of a session cache file.
const (
	// MaxCachedSessions bounds the TLS sessions a SessionCache keeps, one
	// per server name; beyond it the least recently stored is dropped. A
	// client talks to a handful of poolers, so this only keeps a file that
	// many programs share from growing without end.
	MaxCachedSessions = 64
	// maxSessionCacheFile is the largest cache file read (a session is a
	// few kilobytes with its certificate chain); a larger file is ignored
	// as corrupt.
	maxSessionCacheFile = 1 << 20
	// maxSessionAge drops sessions older than TLS 1.3's longest ticket
	// lifetime (RFC 8446, section 4.6.1) when the file is read: crypto/tls
	// would refuse them anyway.
	maxSessionAge = 7 * 24 * time.Hour
	// maxCachedGreetings bounds the local-startup greetings kept (one per
	// user, database and startup parameter set); beyond it new ones are
	// not kept.
	maxCachedGreetings = 64
	// sessionCacheVersion is the file format's version; another version
	// is ignored like a corrupt file.
	sessionCacheVersion = 1
)

// SessionCache is a tls.ClientSessionCache that keeps TLS session tickets
// in memory and, when opened on a file, in that file too, so a new
// process resumes the TLS session an earlier one established: the
// server skips its certificate and the client its verification, and the
// handshake carries no certificate (what a pooler behind several replicas
// can do when they share --tls-session-ticket-keys-file). Resumption here
// is still a full round trip (0-RTT is not used).
//
// The file holds what resuming needs: the ticket and the session's
// resumption secret. Whoever reads it can resume the session as this
// client until the ticket expires (the server's lifetime, up to 7 days)
// or the server drops the ticket key that sealed it, including, with a
// client certificate, the pooler's trust of that certificate as an edge.
// Whoever can write it can plant a session that resumes without any check
// of the server's certificate (crypto/tls trusts the verification the
// session records), and so pose as the pooler. Protect it like the
// client's private key: it is written with mode 0600 and replaced
// atomically (a temporary file renamed over it); on Unix a file other
// users may read or write, or that another user owns, is refused; a file
// that cannot be parsed is ignored with a warning and overwritten by the
// next ticket. Past sessions' traffic stays safe: TLS 1.3 resumption
// here uses a fresh (EC)DHE exchange.
//
// It is safe for concurrent use; several Dialers may share one.
type SessionCache struct {
	path string // "" keeps sessions in memory only
	log  *slog.Logger

	mu        sync.Mutex
	sessions  map[string]cachedSession
	greetings map[string][]byte // localstart's, by its cache key
	gen       uint64            // bumped by every change

	writeMu sync.Mutex // serializes file writes
	written uint64     // gen last written; guarded by writeMu
	pending sync.WaitGroup
}

// cachedSession is one server's session and when it was stored.
type cachedSession struct {
	state  *tls.ClientSessionState
	stored time.Time
}

// sessionFile is the JSON form of a cache file.
type sessionFile struct {
	Version  int            `json:"version"`
	Sessions []sessionEntry `json:"sessions"`
	// Greetings are the pooler's ParameterStatus sets that local startup
	// answers with (localstart.GreetingStore), so a new process answers
	// its first session locally too.
	Greetings map[string][]byte `json:"greetings,omitempty"`
}

// sessionEntry is one session in the file: the ticket (identity) and the
// session state as crypto/tls serializes it (tls.SessionState.Bytes).
type sessionEntry struct {
	Key      string    `json:"key"`
	Stored   time.Time `json:"stored"`
	Identity []byte    `json:"identity"`
	State    []byte    `json:"state"`
}

// NewSessionCache returns a cache that keeps sessions in memory only:
// the Dialers sharing it resume each other's sessions, for as long as the
// process runs.
func NewSessionCache() *SessionCache {
	return &SessionCache{log: slog.New(slog.DiscardHandler), sessions: map[string]cachedSession{}, greetings: map[string][]byte{}}
}

// OpenSessionCache returns a cache backed by the file at path, reading
// the sessions an earlier process stored there. A missing file is an
// empty cache; an unreadable or corrupt one is ignored with a warning on
// logger (nil discards) and replaced by the next session stored. Only a
// path whose directory does not exist is an error, since no session could
// ever be written.
func OpenSessionCache(path string, logger *slog.Logger) (*SessionCache, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("quicclient: session cache %s: directory missing", path)
	}
	c := NewSessionCache()
	c.path, c.log = path, logger
	if err := c.load(); err != nil {
		logger.Warn("quicclient: session cache file ignored; the next ticket replaces it", "file", path, "err", err)
		c.sessions, c.greetings = map[string]cachedSession{}, map[string][]byte{}
	}
	return c, nil
}

// load reads the file into c.sessions and c.greetings.
func (c *SessionCache) load() error {
	f, err := os.Open(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := checkCacheFile(fi); err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSessionCacheFile+1))
	if err != nil {
		return err
	}
	if len(b) > maxSessionCacheFile {
		return fmt.Errorf("larger than %d bytes", maxSessionCacheFile)
	}
	var sf sessionFile
	if err := json.Unmarshal(b, &sf); err != nil {
		return err
	}
	if sf.Version != sessionCacheVersion {
		return fmt.Errorf("format version %d, want %d", sf.Version, sessionCacheVersion)
	}
	now := time.Now()
	for _, e := range sf.Sessions {
		if now.Sub(e.Stored) > maxSessionAge || e.Key == "" {
			continue
		}
		st, err := tls.ParseSessionState(e.State)
		if err != nil {
			return fmt.Errorf("session for %q: %w", e.Key, err)
		}
		cs, err := tls.NewResumptionState(e.Identity, st)
		if err != nil {
			return fmt.Errorf("session for %q: %w", e.Key, err)
		}
		c.sessions[e.Key] = cachedSession{state: cs, stored: e.Stored}
	}
	c.trim()
	for k, g := range sf.Greetings {
		if len(c.greetings) < maxCachedGreetings {
			c.greetings[k] = g
		}
	}
	return nil
}

// Get returns the session stored for sessionKey (crypto/tls passes the
// server name), as tls.ClientSessionCache requires.
func (c *SessionCache) Get(sessionKey string) (*tls.ClientSessionState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.sessions[sessionKey]
	return s.state, ok && s.state != nil
}

// Put stores (or, with cs nil, forgets) the session for sessionKey and,
// for a file-backed cache, starts writing the file; Flush waits for that.
func (c *SessionCache) Put(sessionKey string, cs *tls.ClientSessionState) {
	c.mu.Lock()
	if cs == nil {
		delete(c.sessions, sessionKey)
	} else {
		c.sessions[sessionKey] = cachedSession{state: cs, stored: time.Now()}
		c.trim()
	}
	c.changed()
}

// LoadGreetings returns the local-startup greetings stored
// (localstart.GreetingStore).
func (c *SessionCache) LoadGreetings() map[string][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.copyGreetings()
}

// StoreGreeting keeps a local-startup greeting (localstart.GreetingStore);
// beyond 64 kept, new ones are not.
func (c *SessionCache) StoreGreeting(key string, greeting []byte) {
	c.mu.Lock()
	if _, ok := c.greetings[key]; !ok && len(c.greetings) >= maxCachedGreetings {
		c.mu.Unlock()
		return
	}
	c.greetings[key] = greeting
	c.changed()
}

// changed records a change, with c.mu held, releases c.mu and, for a
// file-backed cache, starts writing the file; Flush waits for that.
func (c *SessionCache) changed() {
	c.gen++
	c.mu.Unlock()
	if c.path == "" {
		return
	}
	// Put runs on the connection's handshake path: write elsewhere.
	c.pending.Add(1)
	go func() {
		defer c.pending.Done()
		c.write()
	}()
}

// trim drops the oldest sessions beyond MaxCachedSessions; c.mu held.
func (c *SessionCache) trim() {
	for len(c.sessions) > MaxCachedSessions {
		oldest := ""
		for k, s := range c.sessions {
			if oldest == "" || s.stored.Before(c.sessions[oldest].stored) {
				oldest = k
			}
		}
		delete(c.sessions, oldest)
	}
}

// copyGreetings copies the greetings for a file write; c.mu held.
func (c *SessionCache) copyGreetings() map[string][]byte {
	if len(c.greetings) == 0 {
		return nil
	}
	out := make(map[string][]byte, len(c.greetings))
	for k, g := range c.greetings {
		out[k] = g
	}
	return out
}

// Len reports how many sessions the cache holds.
func (c *SessionCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sessions)
}

// Flush waits until every session stored so far is in the file.
func (c *SessionCache) Flush() {
	c.pending.Wait()
}

// write replaces the file with the current sessions, unless a later
// write already did.
func (c *SessionCache) write() {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	gen := c.gen
	if gen == c.written {
		c.mu.Unlock()
		return
	}
	sf := sessionFile{Version: sessionCacheVersion, Greetings: c.copyGreetings()}
	for k, s := range c.sessions {
		identity, st, err := s.state.ResumptionState()
		if err != nil || st == nil {
			continue
		}
		b, err := st.Bytes()
		if err != nil {
			continue
		}
		sf.Sessions = append(sf.Sessions, sessionEntry{Key: k, Stored: s.stored, Identity: identity, State: b})
	}
	c.mu.Unlock()
	slices.SortFunc(sf.Sessions, func(a, b sessionEntry) int { return a.Stored.Compare(b.Stored) })
	b, err := json.Marshal(sf)
	if err == nil {
		err = writeFileAtomic(c.path, b)
	}
	if err != nil {
		c.log.Warn("quicclient: session cache not written", "file", c.path, "err", err)
		return
	}
	c.written = gen
}

// writeFileAtomic writes b to a new file (mode 0600) beside path and
// renames it over path, so a reader sees the old file or the new one,
// never half of one.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename there is nothing to remove
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// sessionCacheFor returns the cache the Dialer's TLS configuration uses:
// cfg.SessionCache, else one opened on cfg.SessionCacheFile, else nil.
func sessionCacheFor(cfg DialerConfig, logger *slog.Logger) (*SessionCache, error) {
	switch {
	case cfg.SessionCache != nil && cfg.SessionCacheFile != "":
		return nil, errors.New("quicclient: choose SessionCache or SessionCacheFile")
	case cfg.SessionCache != nil:
		return cfg.SessionCache, nil
	case cfg.SessionCacheFile != "":
		return OpenSessionCache(cfg.SessionCacheFile, logger)
	}
	return nil, nil
}

// GreetingStore returns where local startup keeps the pooler's greetings
// for the next process: the session cache, or nil without one. The edge
// sidecar passes it to its own local-startup server.
func (d *Dialer) GreetingStore() localstart.GreetingStore {
	if d.cache == nil {
		return nil
	}
	return d.cache
}
