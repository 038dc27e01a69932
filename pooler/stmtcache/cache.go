// Package stmtcache records the prepared statements the pooler made on one
// server connection, as far as the server has confirmed them.
//
// The pooler renames a client's statements after a hash of their text and
// parameter types (the key) and prepares them on whichever server
// connection serves the client's next transaction. A Cache is what one
// connection holds: an LRU of statements by server name, each checked
// against its full key, so two different queries can never share one
// server statement even if their hashes collided; the unnamed statement;
// and the names that may exist on the server although the cache does not
// list them (a Close the server skipped after an error, a DEALLOCATE of
// some name), which the pooler closes before it prepares them again.
//
// A Parse is recorded when it is written, but only as its writer's until
// the server confirms it with ParseComplete: on a connection shared by
// several clients' requests a Parse written by the request ahead may still
// be skipped by the server after an error in that request, so another
// session trusts an entry only once it is confirmed, and the unnamed
// statement only while no other session's unnamed Parse is still
// unanswered. Sessions are told apart by a non-zero id of the caller's.
//
// A Cache knows nothing of the wire: the caller writes the Parse and Close
// messages and tells the cache what it wrote and what the server answered.
// It is not safe for concurrent use; the caller guards it.
package stmtcache

import "container/list"

// Cache is what the pooler knows of the statements prepared on one server
// connection. The zero value is an empty cache ready to use.
type Cache struct {
	lru         list.List // of *cached, most recent first
	byName      map[string]*list.Element
	maybe       map[string]struct{} // not cached, but may still exist on the server
	unsure      bool                // any pooler name may exist on the server (a DEALLOCATE of some name ran)
	unnamedKey  string
	unnamedOK   bool
	unnamedBy   uint64 // session that wrote the last unnamed Parse
	unnamedPend int    // unnamed Parses written and not yet answered (ParseComplete, or skipped)
	namedPend   int    // cached statements whose Parse is not yet confirmed (cached.by != 0)
}

type cached struct {
	name, key string
	gen       uint64 // the statement's generation when it was prepared here
	by        uint64 // the session whose Parse of it awaits ParseComplete; 0 once confirmed
}

// Lookup reports whether the server holds name for key as far as session
// sid may trust it, and whether it may hold name otherwise: for another key
// (a hash collision), or by a Parse of another session's that the server
// has not confirmed yet and may still skip. Either way the caller closes the
// name before preparing it again. A statement found is marked as recently
// used.
func (c *Cache) Lookup(name, key string, sid uint64) (present, conflict bool) {
	el := c.byName[name]
	if el == nil {
		return false, false
	}
	cs := el.Value.(*cached)
	if cs.key != key || (cs.by != 0 && cs.by != sid) {
		return false, true
	}
	c.lru.MoveToFront(el)
	return true, false
}

// Add records a Parse of name that session sid has just written, prepared
// at generation gen (see Gen); the entry is sid's alone until confirmed.
func (c *Cache) Add(name, key string, gen, sid uint64) {
	if c.byName == nil {
		c.byName = make(map[string]*list.Element)
	}
	c.byName[name] = c.lru.PushFront(&cached{name: name, key: key, gen: gen, by: sid})
	c.namedPend++
}

// Confirm records the server's ParseComplete for a Parse of session sid's:
// of the unnamed statement, or of name.
func (c *Cache) Confirm(name string, unnamed bool, sid uint64) {
	if unnamed {
		c.unnamedPend = max(c.unnamedPend-1, 0)
		return
	}
	if el := c.byName[name]; el != nil && name != "" {
		if cs := el.Value.(*cached); cs.by == sid {
			cs.by = 0
			c.namedPend--
		}
	}
}

// WroteUnnamed records an unnamed Parse session sid has just written for
// the statement key.
func (c *Cache) WroteUnnamed(key string, sid uint64) {
	c.unnamedKey, c.unnamedOK = key, true
	c.unnamedBy = sid
	c.unnamedPend++
}

// HasUnnamed reports whether session sid may rely on the server's unnamed
// statement being key: recorded so, and every unnamed Parse still
// unanswered is sid's own (written earlier in its request, so that if the
// server skips it, it skips sid's use of it too).
func (c *Cache) HasUnnamed(key string, sid uint64) bool {
	return c.unnamedOK && c.unnamedKey == key && (c.unnamedPend == 0 || c.unnamedBy == sid)
}

// DropUnnamed records that the server's unnamed statement is gone, as
// after any simple Query.
func (c *Cache) DropUnnamed() { c.unnamedOK = false }

// Gen returns the generation name was prepared with here (0 when absent).
func (c *Cache) Gen(name string) uint64 {
	if el := c.byName[name]; el != nil {
		return el.Value.(*cached).gen
	}
	return 0
}

// Len returns the number of statements cached, for the caller's limit.
func (c *Cache) Len() int { return c.lru.Len() }

// Remove forgets name, as after a Close the caller wrote.
func (c *Cache) Remove(name string) {
	if el := c.byName[name]; el != nil {
		if el.Value.(*cached).by != 0 {
			c.namedPend--
		}
		c.lru.Remove(el)
		delete(c.byName, name)
	}
}

// Oldest returns the least recently used statement's name ("" when the
// cache is empty): the one to close first when the cache is full.
func (c *Cache) Oldest() string {
	if el := c.lru.Back(); el != nil {
		return el.Value.(*cached).name
	}
	return ""
}

// Forget drops what a failed (or skipped) Parse of session sid's would have
// created: the unnamed statement, or name. An entry another session has
// written since is left alone: its own reply settles it.
func (c *Cache) Forget(name string, unnamed bool, sid uint64) {
	if unnamed {
		c.unnamedOK = false
		c.unnamedPend = max(c.unnamedPend-1, 0)
		return
	}
	if name == "" {
		return
	}
	if el := c.byName[name]; el != nil && el.Value.(*cached).by == sid {
		c.Remove(name)
	}
}

// Settle forgets the bookkeeping of replies still owed, for a connection
// freshly borrowed with nothing in flight. A Parse written but never
// answered (its request was abandoned unread) may or may not have run: its
// name is closed before it is prepared again.
func (c *Cache) Settle() {
	c.unnamedPend = 0
	if c.namedPend == 0 {
		return
	}
	c.namedPend = 0
	for el := c.lru.Front(); el != nil; {
		next := el.Next()
		if cs := el.Value.(*cached); cs.by != 0 {
			c.MarkMaybe(cs.name)
			c.lru.Remove(el)
			delete(c.byName, cs.name)
		}
		el = next
	}
}

// MarkMaybe records that name may exist on the server although the cache
// does not list it: a Close of it that the server skipped, a Parse that
// may have run, a 42P05 answer.
func (c *Cache) MarkMaybe(name string) {
	if c.maybe == nil {
		c.maybe = make(map[string]struct{})
	}
	c.maybe[name] = struct{}{}
}

// Unmark forgets a doubt about name, for a caller that closes it anyway.
func (c *Cache) Unmark(name string) { delete(c.maybe, name) }

// MayHold reports whether name may exist on the server although the cache
// does not list it, and forgets that doubt: the caller closes it first.
func (c *Cache) MayHold(name string) bool {
	if _, ok := c.maybe[name]; ok {
		delete(c.maybe, name)
		return true
	}
	return c.unsure
}

// Drop forgets every statement after the server ran DEALLOCATE or
// DISCARD. certain says every statement is gone (DEALLOCATE ALL, DISCARD
// ALL); otherwise some unknown one is, so the cache is emptied and every
// name may still exist.
func (c *Cache) Drop(certain bool) {
	c.lru.Init()
	clear(c.byName)
	clear(c.maybe)
	c.namedPend = 0
	c.unsure = !certain
	c.unnamedOK = false
}
