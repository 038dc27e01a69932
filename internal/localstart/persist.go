package localstart

import (
	"bytes"
	"errors"
	"slices"
)

// GreetingStore keeps greetings beyond a Server's life, so that a new
// process answers its first session's startup locally too (a greeting
// learned by an earlier run). quicclient's session cache file implements
// it beside the TLS tickets: both are what a new process needs for its
// first row to be one handshake and one round trip away.
type GreetingStore interface {
	// LoadGreetings returns the greetings stored, by cache key, each as
	// EncodeGreeting made it. A Server calls it once, in New.
	LoadGreetings() map[string][]byte
	// StoreGreeting keeps a greeting the Server learned or saw change; it
	// must not block for long (a session waits on it).
	StoreGreeting(key string, greeting []byte)
}

// encodeGreeting serializes a ParameterStatus set as name NUL value NUL
// pairs, the wire's own spelling.
func encodeGreeting(params []param) []byte {
	var b []byte
	for _, p := range params {
		b = append(b, p.name...)
		b = append(b, 0)
		b = append(b, p.value...)
		b = append(b, 0)
	}
	return b
}

// errBadGreeting reports a stored greeting that is not NUL-terminated
// name and value pairs.
var errBadGreeting = errors.New("localstart: malformed stored greeting")

// decodeGreeting parses what encodeGreeting wrote.
func decodeGreeting(b []byte) ([]param, error) {
	var out []param
	for len(b) > 0 {
		name, rest, ok := bytes.Cut(b, []byte{0})
		if !ok || len(name) == 0 {
			return nil, errBadGreeting
		}
		value, rest, ok := bytes.Cut(rest, []byte{0})
		if !ok {
			return nil, errBadGreeting
		}
		out = append(out, param{string(name), string(value)})
		b = rest
	}
	return out, nil
}

// seed fills the cache from cfg.Greetings; malformed entries are skipped
// (a session then takes the ordinary path and relearns them).
func (s *Server) seed() {
	if s.cfg.Greetings == nil {
		return
	}
	for key, b := range s.cfg.Greetings.LoadGreetings() {
		params, err := decodeGreeting(b)
		if err != nil || len(s.order) >= s.cfg.MaxCached {
			continue
		}
		s.cache[key] = params
		s.order = append(s.order, key)
	}
}

// persist hands a greeting to cfg.Greetings when it is new or changed.
func (s *Server) persist(key string, old []param, had bool, params []param) {
	if s.cfg.Greetings == nil || (had && slices.Equal(old, params)) {
		return
	}
	s.cfg.Greetings.StoreGreeting(key, encodeGreeting(params))
}
