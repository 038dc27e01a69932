// Package hiddencode learns, from a database's catalog, which names in a
// query text may make the server run code the text does not show: a
// table's triggers, rules, column defaults, CHECK constraints, generated
// columns, index expressions and row security policies; a view's or a
// materialized view's query; a foreign table's wrapper; a domain's CHECK;
// a type's input and output functions and casts; a user-defined operator.
// Such code may change the session (SET, set_config, CREATE TEMP, LISTEN,
// advisory locks, SET ROLE) where the lexer cannot see it, so the pooler
// treats a text naming one of them as it treats a call of a user-defined
// function: it asks the server afterwards what the session holds, and
// never lets the text share a server connection with other clients.
//
// The pooler runs Query on a server connection, hands every row to
// Builder.Add, and keeps the Names that Build returns until the catalog may
// have changed. Only objects created after initdb (OID 16384 and up) are
// read, besides the built-in views with rules of their own (pg_settings):
// every other built-in object runs only built-in code, which the lexer
// already judges by name (sqllex.HarmlessBuiltin).
package hiddencode

import (
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/pgquic/pgquic/internal/sqllex"
)

// firstUserOID is PostgreSQL's FirstNormalObjectId: every object a user or
// an extension creates has an OID at least this large.
const firstUserOID = 16384

// Query reads the facts Build needs, one row each, every name qualified so
// that no object of a client's can stand in for a catalog's. Columns:
// row ("n" an object, "e" a dependency, "g" a user-defined cast between
// two built-in types, "v" the catalog's fingerprint), k (the object's
// kind: "r" relation, "t" type, "o" operator, "c" cast), id (its OID),
// name (an object's name; the fingerprint), bad (it runs user code
// itself: a user trigger, a rule other than a view's own, a foreign
// table, a user operator), rk and rid (what a dependency points at: "r",
// "t", "o" or "f" for a function) and fname (a built-in function's name,
// NULL for any other function).
//
// A dependency says that using the object may run what it points at:
// what the catalog records a default, constraint, index, policy or view
// rule uses (pg_depend); a column's type; a partition or inheritance child
// (an INSERT into the parent reaches it); a table whose foreign key
// cascades from the referenced table (a DELETE there writes here); a
// type's input, output, send, receive, typmod and analyze functions, base
// type, element type and composite relation; a range's subtype and its
// canonical and subtype_diff functions; a user-defined cast's function.
// Of a type's functions only those created after initdb count: the
// built-in ones (record_in, array_in, domain_in, range_in…) call the
// functions of the element, base, attribute or subtypes, which are
// followed themselves, and a domain's constraints.
//
// PostgreSQL records no dependency on a pinned built-in, so a view
// calling set_config leaves no trace in pg_depend: the functions every
// default, CHECK constraint, index expression and predicate, policy and
// rule calls are also read from its stored expression tree (":funcid",
// ":aggfnoid", ":winfnoid"), and each is judged by name. Reading the trees
// takes no lock, where deparsing them (pg_get_expr, pg_get_viewdef) would
// wait behind a migration's lock on the table, and costs less.
const Query = prelude +
	"WITH owner AS (\n" +
	"  SELECT 'pg_catalog.pg_attrdef'::pg_catalog.regclass AS cls, oid AS obj, 'r'::text AS k, adrelid AS id FROM pg_catalog.pg_attrdef\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_constraint'::pg_catalog.regclass, oid, 'r', conrelid FROM pg_catalog.pg_constraint WHERE conrelid <> 0\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_constraint'::pg_catalog.regclass, oid, 't', contypid FROM pg_catalog.pg_constraint WHERE contypid <> 0\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, indexrelid, 'r', indrelid FROM pg_catalog.pg_index\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_policy'::pg_catalog.regclass, oid, 'r', polrelid FROM pg_catalog.pg_policy\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_rewrite'::pg_catalog.regclass, oid, 'r', ev_class FROM pg_catalog.pg_rewrite\n" +
	"), ref AS (\n" +
	"  SELECT o.k, o.id,\n" +
	"    CASE d.refclassid WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass THEN 'f'\n" +
	"      WHEN 'pg_catalog.pg_type'::pg_catalog.regclass THEN 't'\n" +
	"      WHEN 'pg_catalog.pg_operator'::pg_catalog.regclass THEN 'o' ELSE 'r' END AS rk,\n" +
	"    d.refobjid AS rid\n" +
	"  FROM pg_catalog.pg_depend d JOIN owner o ON d.classid = o.cls AND d.objid = o.obj\n" +
	"  WHERE o.id >= 16384 AND d.refclassid IN ('pg_catalog.pg_proc'::pg_catalog.regclass, 'pg_catalog.pg_type'::pg_catalog.regclass,\n" +
	"    'pg_catalog.pg_operator'::pg_catalog.regclass, 'pg_catalog.pg_class'::pg_catalog.regclass)\n" +
	"  UNION ALL\n" +
	"  SELECT 'r', a.attrelid, 't', a.atttypid FROM pg_catalog.pg_attribute a\n" +
	"  WHERE a.attrelid >= 16384 AND a.attnum > 0 AND NOT a.attisdropped AND a.atttypid >= 16384\n" +
	"  UNION ALL SELECT 'r', inhparent, 'r', inhrelid FROM pg_catalog.pg_inherits\n" +
	"  UNION ALL SELECT 'r', confrelid, 'r', conrelid FROM pg_catalog.pg_constraint\n" +
	"  WHERE contype = 'f' AND (confdeltype NOT IN ('a', 'r') OR confupdtype NOT IN ('a', 'r'))\n" +
	"  UNION ALL SELECT 't', t.oid, 'f', f FROM pg_catalog.pg_type t,\n" +
	"    LATERAL pg_catalog.unnest(ARRAY[t.typinput, t.typoutput, t.typreceive, t.typsend, t.typmodin, t.typmodout, t.typanalyze]::pg_catalog.oid[]) f\n" +
	"  WHERE t.oid >= 16384 AND f >= 16384\n" +
	"  UNION ALL SELECT 't', oid, 't', typbasetype FROM pg_catalog.pg_type WHERE oid >= 16384 AND typbasetype <> 0\n" +
	"  UNION ALL SELECT 't', oid, 't', typelem FROM pg_catalog.pg_type WHERE oid >= 16384 AND typelem <> 0\n" +
	"  UNION ALL SELECT 't', oid, 'r', typrelid FROM pg_catalog.pg_type WHERE oid >= 16384 AND typrelid <> 0\n" +
	"  UNION ALL SELECT 't', rngtypid, 't', rngsubtype FROM pg_catalog.pg_range WHERE rngtypid >= 16384\n" +
	"  UNION ALL SELECT 't', rngtypid, 'f', f FROM pg_catalog.pg_range,\n" +
	"    LATERAL pg_catalog.unnest(ARRAY[rngcanonical, rngsubdiff]::pg_catalog.oid[]) f WHERE rngtypid >= 16384 AND f >= 16384\n" +
	"  UNION ALL SELECT 't', castsource, 'f', castfunc FROM pg_catalog.pg_cast WHERE oid >= 16384 AND castfunc <> 0\n" +
	"  UNION ALL SELECT 't', casttarget, 'f', castfunc FROM pg_catalog.pg_cast WHERE oid >= 16384 AND castfunc <> 0\n" +
	"), tree AS (\n" +
	"  SELECT 'r'::text AS k, adrelid AS id, adbin AS t FROM pg_catalog.pg_attrdef WHERE adrelid >= 16384\n" +
	"  UNION ALL SELECT 'r', conrelid, conbin FROM pg_catalog.pg_constraint WHERE conrelid >= 16384 AND conbin IS NOT NULL\n" +
	"  UNION ALL SELECT 't', contypid, conbin FROM pg_catalog.pg_constraint WHERE contypid >= 16384 AND conbin IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', indrelid, indexprs FROM pg_catalog.pg_index WHERE indrelid >= 16384 AND indexprs IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', indrelid, indpred FROM pg_catalog.pg_index WHERE indrelid >= 16384 AND indpred IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', polrelid, polqual FROM pg_catalog.pg_policy WHERE polqual IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', polrelid, polwithcheck FROM pg_catalog.pg_policy WHERE polwithcheck IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', ev_class, ev_action FROM pg_catalog.pg_rewrite WHERE ev_class >= 16384\n" +
	"  UNION ALL SELECT 'r', ev_class, ev_qual FROM pg_catalog.pg_rewrite WHERE ev_class >= 16384\n" +
	"), called AS (\n" +
	"  SELECT DISTINCT tree.k, tree.id, m[1]::pg_catalog.oid AS f\n" +
	"  FROM tree, LATERAL pg_catalog.regexp_matches(tree.t::text, ':(?:funcid|aggfnoid|winfnoid) (\\d+)', 'g') m\n" +
	")\n" +
	"SELECT 'v' AS row, 'v' AS k, 0::pg_catalog.oid AS id, " + fingerprint +
	" AS name,\n" +
	"  NULL::boolean AS bad, NULL::text AS rk, NULL::pg_catalog.oid AS rid, NULL::text AS fname\n" +
	"UNION ALL\n" +
	"SELECT 'n', 'r', c.oid, c.relname::text,\n" +
	"  (c.relkind = 'f'\n" +
	"   OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g WHERE g.tgrelid = c.oid AND NOT g.tgisinternal)\n" +
	"   OR EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite w WHERE w.ev_class = c.oid AND w.rulename <> '_RETURN')),\n" +
	"  NULL, NULL, NULL\n" +
	"FROM pg_catalog.pg_class c\n" +
	"WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND (c.oid >= 16384\n" +
	"   OR EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite w WHERE w.ev_class = c.oid AND w.rulename <> '_RETURN'))\n" +
	"UNION ALL\n" +
	"SELECT 'n', 't', t.oid, t.typname::text, false, NULL, NULL, NULL FROM pg_catalog.pg_type t WHERE t.oid >= 16384\n" +
	"UNION ALL\n" +
	"SELECT 'n', 'o', o.oid, o.oprname::text, true, NULL, NULL, NULL FROM pg_catalog.pg_operator o WHERE o.oid >= 16384\n" +
	"UNION ALL\n" +
	"SELECT 'e', ref.k, ref.id, NULL, NULL, ref.rk, ref.rid,\n" +
	"  (SELECT p.proname::text FROM pg_catalog.pg_proc p WHERE ref.rk = 'f' AND p.oid = ref.rid AND p.oid < 16384\n" +
	"     AND p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace)\n" +
	"FROM ref WHERE ref.rk <> 't' OR ref.rid >= 16384\n" +
	"UNION ALL\n" +
	"SELECT 'e', called.k, called.id, NULL, NULL, 'f', called.f,\n" +
	"  (SELECT p.proname::text FROM pg_catalog.pg_proc p WHERE p.oid = called.f AND p.oid < 16384\n" +
	"     AND p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace)\n" +
	"FROM called\n" +
	"UNION ALL\n" +
	"SELECT 'g', 'c', c.oid, NULL, NULL, 'f', c.castfunc,\n" +
	"  (SELECT p.proname::text FROM pg_catalog.pg_proc p WHERE p.oid = c.castfunc AND p.oid < 16384\n" +
	"     AND p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace)\n" +
	"FROM pg_catalog.pg_cast c WHERE c.oid >= 16384 AND c.castsource < 16384 AND c.casttarget < 16384\n" +
	"; COMMIT"

// FingerprintQuery returns, in one row, the Fingerprint that Query's
// rows would carry now: the number of rows of every catalog Query reads
// and the sum of their xmin. Any DDL that Query could see inserts,
// deletes or replaces a row in one of them, and a replaced row has a
// newer xmin, so an equal fingerprint means an equal catalog (a frozen
// row's xmin reads differently, which costs a needless full read, never
// a missed change). It costs a scan of those catalogs, a tenth of Query
// on a database of a thousand tables.
const FingerprintQuery = prelude + "SELECT " + fingerprint + "; COMMIT"

// ReadFingerprint returns the fingerprint from FingerprintQuery's DataRow.
func ReadFingerprint(body []byte) (string, error) {
	if len(body) < 6 || binary.BigEndian.Uint16(body) != 1 {
		return "", errRow
	}
	l := int32(binary.BigEndian.Uint32(body[2:]))
	if l < 0 || int(l) != len(body)-6 {
		return "", errRow
	}
	return string(body[6:]), nil
}

// fingerprint is the expression both queries compute.
const fingerprint = "(SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_class)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_attribute)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_attrdef)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_constraint)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_index)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_policy)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_rewrite)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_trigger)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_type)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_operator)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_cast)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_range)\n" +
	" || ' ' || (SELECT pg_catalog.count(*) || ':' || COALESCE(pg_catalog.sum(xmin::text::int8), 0) FROM pg_catalog.pg_inherits)\n"

// prelude runs the read in a transaction of its own with JIT compilation
// and parallel workers off (the query's estimated cost crosses the
// default jit_above_cost, and compiling it took longer than running it:
// 1.4 s against 0.3 s on a thousand tables) and a statement timeout of
// its own, whatever the connection's last client set. SET LOCAL ends
// with the transaction, so no client sees any of it.
const prelude = "BEGIN; SET LOCAL jit = off; SET LOCAL max_parallel_workers_per_gather = 0; SET LOCAL statement_timeout = '10s'; "

// Names is what Build learnt: the relation and type names whose use may run
// user code, and the symbols of user-defined operators. It is immutable.
type Names struct {
	idents map[string]struct{}
	ops    []string
	all    bool   // a user-defined cast between built-in types: any coercion may run it
	fp     string // the catalog's fingerprint when it was read (FingerprintQuery)
}

// Fingerprint returns the catalog's fingerprint as Query read it: while
// FingerprintQuery returns the same, n is still the catalog's.
func (n *Names) Fingerprint() string {
	if n == nil {
		return ""
	}
	return n.fp
}

// None is a catalog with no code behind any name, for reading texts that
// belong to no database (tests of the pooler's own readers).
var None = &Names{}

// Mentions reports whether text may run code the lexer cannot see, by the
// catalog Names was learnt from: it names one of the relations or types,
// holds one of the operators, or cannot be read (sqllex.MentionsAny). A
// nil Names (nothing learnt yet, or the catalog changed since) mentions
// everything: the pooler fails closed.
func (n *Names) Mentions(text string) bool {
	if n == nil || n.all {
		return true
	}
	return sqllex.MentionsAny(text, n.idents, n.ops)
}

// Empty reports whether no text can mention anything of n's: the
// database has no hidden code at all.
func (n *Names) Empty() bool {
	return n != nil && !n.all && len(n.idents) == 0 && len(n.ops) == 0
}

// Len returns how many names n holds, for logs and the admin console.
func (n *Names) Len() int {
	if n == nil {
		return 0
	}
	return len(n.idents) + len(n.ops)
}

type key struct {
	kind byte
	oid  uint32
}

type node struct {
	name string
	bad  bool
	// users are the objects whose use may run this one.
	users []key
}

// Builder collects Query's rows; the zero value is ready to use.
type Builder struct {
	nodes map[key]*node
	seeds []key // objects found bad by a row of their own or a dependency on a function
	ops   map[string]struct{}
	all   bool
	fp    string
}

func (b *Builder) node(k key) *node {
	if b.nodes == nil {
		b.nodes = make(map[key]*node)
	}
	n := b.nodes[k]
	if n == nil {
		n = &node{}
		b.nodes[k] = n
	}
	return n
}

// badFunc reports whether a function may change the session: every
// function created after initdb, every built-in outside pg_catalog, and
// the pg_catalog built-ins the lexer does not call harmless.
func badFunc(oid uint32, name *string) bool {
	return oid >= firstUserOID || name == nil || !sqllex.HarmlessBuiltin(*name)
}

// errRow is returned for a DataRow that is not one of Query's.
var errRow = errors.New("hiddencode: unexpected row")

// Add takes one DataRow body of Query's result.
func (b *Builder) Add(body []byte) error {
	var col [8]*string
	if len(body) < 2 || binary.BigEndian.Uint16(body) != uint16(len(col)) {
		return errRow
	}
	body = body[2:]
	for i := range col {
		if len(body) < 4 {
			return errRow
		}
		l := int32(binary.BigEndian.Uint32(body))
		body = body[4:]
		if l < 0 {
			continue
		}
		if int(l) > len(body) {
			return errRow
		}
		v := string(body[:l])
		col[i] = &v
		body = body[l:]
	}
	row, kind, id := col[0], col[1], col[2]
	if row == nil || kind == nil || id == nil || len(*row) != 1 || len(*kind) != 1 {
		return errRow
	}
	oid, err := strconv.ParseUint(*id, 10, 32)
	if err != nil {
		return errRow
	}
	k := key{(*kind)[0], uint32(oid)}
	switch (*row)[0] {
	case 'n':
		if col[3] == nil {
			return errRow
		}
		n := b.node(k)
		n.name = *col[3]
		if col[4] != nil && *col[4] == "t" {
			n.bad = true
			b.seeds = append(b.seeds, k)
		}
		if k.kind == 'o' {
			if b.ops == nil {
				b.ops = make(map[string]struct{})
			}
			b.ops[n.name] = struct{}{}
		}
	case 'v':
		if col[3] == nil {
			return errRow
		}
		b.fp = *col[3]
	case 'e', 'g':
		if col[5] == nil || col[6] == nil || len(*col[5]) != 1 {
			return errRow
		}
		roid, err := strconv.ParseUint(*col[6], 10, 32)
		if err != nil {
			return errRow
		}
		r := key{(*col[5])[0], uint32(roid)}
		switch {
		case r.kind == 'f':
			if badFunc(r.oid, col[7]) {
				if (*row)[0] == 'g' {
					b.all = true
				} else {
					b.seeds = append(b.seeds, k)
				}
			}
		case r.kind == 'o' && r.oid >= firstUserOID:
			b.seeds = append(b.seeds, k)
		default:
			t := b.node(r)
			t.users = append(t.users, k)
		}
	default:
		return errRow
	}
	return nil
}

// Build returns the names of every relation and type whose use may run
// user code, directly or through another (a view over a view with a
// trigger-free table that has a column of a domain whose CHECK calls a user
// function), and the user-defined operators' symbols.
func (b *Builder) Build() *Names {
	n := &Names{idents: make(map[string]struct{}), all: b.all, fp: b.fp}
	queue := b.seeds
	for len(queue) > 0 {
		k := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		nd := b.node(k)
		nd.bad = true
		if nd.name != "" && k.kind != 'o' && k.oid >= firstUserOID {
			// A built-in's own name (pg_settings) the lexer reads itself;
			// it is followed only to the user objects that use it.
			n.idents[nd.name] = struct{}{}
		}
		for _, u := range nd.users {
			if un := b.node(u); !un.bad {
				un.bad = true
				queue = append(queue, u)
			}
		}
		nd.users = nil
	}
	for op := range b.ops {
		n.ops = append(n.ops, op)
	}
	return n
}
