package stmtcache

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestConfirmed walks the cache through what two sessions sharing a
// connection do: a Parse is its writer's until confirmed, another session
// sees it as a conflict (to be closed and prepared again), a skipped Parse
// is forgotten only by its own writer, and Settle drops what was never
// answered into doubt.
func TestConfirmed(t *testing.T) {
	var st Cache
	const a, b = 1, 2
	pending := func() int {
		n := 0
		for el := st.lru.Front(); el != nil; el = el.Next() {
			if el.Value.(*cached).by != 0 {
				n++
			}
		}
		if n != st.namedPend {
			t.Fatalf("namedPend %d, entries pending %d", st.namedPend, n)
		}
		return n
	}
	st.Add("s1", "k1", 0, a)
	if present, conflict := st.Lookup("s1", "k1", a); !present || conflict {
		t.Errorf("writer's own pending entry: present %v conflict %v", present, conflict)
	}
	if present, conflict := st.Lookup("s1", "k1", b); present || !conflict {
		t.Errorf("another session's pending entry: present %v conflict %v, want a conflict", present, conflict)
	}
	st.Confirm("s1", false, a)
	if present, _ := st.Lookup("s1", "k1", b); !present || pending() != 0 {
		t.Errorf("confirmed entry not trusted by another session")
	}
	// b's Parse of s2 is skipped, but a wrote s2 again meanwhile (after
	// closing b's): b's Forget must not drop a's record.
	st.Add("s2", "k2", 0, b)
	st.Remove("s2")
	st.Add("s2", "k2", 0, a)
	st.Forget("s2", false, b)
	if present, _ := st.Lookup("s2", "k2", a); !present {
		t.Errorf("b's skipped Parse forgot a's entry")
	}
	st.Forget("s2", false, a)
	if st.byName["s2"] != nil || pending() != 0 {
		t.Errorf("a's skipped Parse was not forgotten")
	}
	// Unnamed: trusted by its writer at once, by others once answered.
	st.WroteUnnamed("u", a)
	if !st.HasUnnamed("u", a) || st.HasUnnamed("u", b) {
		t.Errorf("unnamed while pending: writer %v other %v", st.HasUnnamed("u", a), st.HasUnnamed("u", b))
	}
	st.Confirm("", true, a)
	if !st.HasUnnamed("u", b) {
		t.Errorf("answered unnamed statement not trusted")
	}
	st.WroteUnnamed("v", a)
	st.Forget("", true, a)
	if st.HasUnnamed("v", a) || st.HasUnnamed("u", b) {
		t.Errorf("skipped unnamed Parse still trusted")
	}
	// Never answered: Settle puts the name in doubt.
	st.Add("s3", "k3", 0, b)
	st.Settle()
	if st.byName["s3"] != nil || !st.MayHold("s3") || pending() != 0 || st.unnamedPend != 0 {
		t.Errorf("settle kept an unanswered Parse")
	}
}

// TestCacheLimits covers what the pooler's eviction and DEALLOCATE
// handling rely on: Oldest is the least recently used name (a Lookup
// refreshes it), Drop(false) leaves every name in doubt and Drop(true)
// none, and the zero value works without set-up.
func TestCacheLimits(t *testing.T) {
	var c Cache
	if c.Oldest() != "" || c.Len() != 0 || c.MayHold("x") || c.Gen("x") != 0 {
		t.Fatalf("zero Cache not empty")
	}
	c.Add("s1", "k1", 3, 1)
	c.Add("s2", "k2", 4, 1)
	if c.Oldest() != "s1" || c.Len() != 2 || c.Gen("s2") != 4 {
		t.Fatalf("oldest %q len %d gen %d", c.Oldest(), c.Len(), c.Gen("s2"))
	}
	c.Lookup("s1", "k1", 1)
	if c.Oldest() != "s2" {
		t.Errorf("oldest after a lookup of s1: %q, want s2", c.Oldest())
	}
	c.MarkMaybe("s9")
	c.Unmark("s9")
	if c.MayHold("s9") {
		t.Errorf("unmarked name still in doubt")
	}
	c.WroteUnnamed("u", 1)
	c.Drop(false)
	if c.Len() != 0 || !c.MayHold("s1") || !c.MayHold("anything") || c.HasUnnamed("u", 1) {
		t.Errorf("Drop(false) left statements trusted")
	}
	c.Drop(true)
	if c.MayHold("s1") {
		t.Errorf("Drop(true) left names in doubt")
	}
}
