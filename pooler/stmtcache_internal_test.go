package pooler

import "testing"

// TestServerStateConfirmed walks the per-server statement cache through
// what two sessions sharing a connection do: a Parse is its writer's until
// confirmed, another session sees it as a conflict (to be closed and
// prepared again), a skipped Parse is forgotten only by its own writer,
// and settle drops what was never answered into doubt.
func TestServerStateConfirmed(t *testing.T) {
	st := newServerState()
	const a, b = 1, 2
	pending := func() int {
		n := 0
		for el := st.lru.Front(); el != nil; el = el.Next() {
			if el.Value.(*cachedStmt).by != 0 {
				n++
			}
		}
		if n != st.namedPend {
			t.Fatalf("namedPend %d, entries pending %d", st.namedPend, n)
		}
		return n
	}
	st.add("s1", "k1", 0, a)
	if present, conflict := st.lookup("s1", "k1", a); !present || conflict {
		t.Errorf("writer's own pending entry: present %v conflict %v", present, conflict)
	}
	if present, conflict := st.lookup("s1", "k1", b); present || !conflict {
		t.Errorf("another session's pending entry: present %v conflict %v, want a conflict", present, conflict)
	}
	st.confirm(&entry{kind: eParse, stmt: "s1"}, a)
	if present, _ := st.lookup("s1", "k1", b); !present || pending() != 0 {
		t.Errorf("confirmed entry not trusted by another session")
	}
	// b's Parse of s2 is skipped, but a wrote s2 again meanwhile (after
	// closing b's): b's forget must not drop a's record.
	st.add("s2", "k2", 0, b)
	st.remove("s2")
	st.add("s2", "k2", 0, a)
	st.forget(&entry{kind: eParse, stmt: "s2"}, b)
	if present, _ := st.lookup("s2", "k2", a); !present {
		t.Errorf("b's skipped Parse forgot a's entry")
	}
	st.forget(&entry{kind: eParse, stmt: "s2"}, a)
	if st.byName["s2"] != nil || pending() != 0 {
		t.Errorf("a's skipped Parse was not forgotten")
	}
	// Unnamed: trusted by its writer at once, by others once answered.
	st.wroteUnnamed("u", a)
	if !st.hasUnnamed("u", a) || st.hasUnnamed("u", b) {
		t.Errorf("unnamed while pending: writer %v other %v", st.hasUnnamed("u", a), st.hasUnnamed("u", b))
	}
	st.confirm(&entry{kind: eParse, unnamed: true}, a)
	if !st.hasUnnamed("u", b) {
		t.Errorf("answered unnamed statement not trusted")
	}
	st.wroteUnnamed("v", a)
	st.forget(&entry{kind: eParse, unnamed: true}, a)
	if st.hasUnnamed("v", a) || st.hasUnnamed("u", b) {
		t.Errorf("skipped unnamed Parse still trusted")
	}
	// Never answered: settle puts the name in doubt.
	st.add("s3", "k3", 0, b)
	st.settle()
	if st.byName["s3"] != nil || !st.mayHold("s3") || pending() != 0 || st.unnamedPend != 0 {
		t.Errorf("settle kept an unanswered Parse")
	}
}
