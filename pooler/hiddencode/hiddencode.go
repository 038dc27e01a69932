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
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

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
	"  SELECT 'pg_catalog.pg_attrdef'::pg_catalog.regclass::pg_catalog.oid AS cls, oid AS obj, 'r'::pg_catalog.text AS k, adrelid AS id FROM pg_catalog.pg_attrdef\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_constraint'::pg_catalog.regclass::pg_catalog.oid, oid, 'r', conrelid FROM pg_catalog.pg_constraint WHERE conrelid OPERATOR(pg_catalog.<>) 0::pg_catalog.oid\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_constraint'::pg_catalog.regclass::pg_catalog.oid, oid, 't', contypid FROM pg_catalog.pg_constraint WHERE contypid OPERATOR(pg_catalog.<>) 0::pg_catalog.oid\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid, indexrelid, 'r', indrelid FROM pg_catalog.pg_index\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid, oid, 'r', oid FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_type'::pg_catalog.regclass::pg_catalog.oid, oid, 't', oid FROM pg_catalog.pg_type WHERE oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_policy'::pg_catalog.regclass::pg_catalog.oid, oid, 'r', polrelid FROM pg_catalog.pg_policy\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_rewrite'::pg_catalog.regclass::pg_catalog.oid, oid, 'r', ev_class FROM pg_catalog.pg_rewrite\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_trigger'::pg_catalog.regclass::pg_catalog.oid, oid, 'r', tgrelid FROM pg_catalog.pg_trigger WHERE NOT tgisinternal\n" +
	"  UNION ALL SELECT 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass::pg_catalog.oid, oid, 'r', stxrelid FROM pg_catalog.pg_statistic_ext\n" +
	"), ref AS (\n" +
	"  SELECT o.k, o.id,\n" +
	"    CASE WHEN d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid THEN 'f'\n" +
	"      WHEN d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass::pg_catalog.oid THEN 't'\n" +
	"      WHEN d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_operator'::pg_catalog.regclass::pg_catalog.oid THEN 'o'\n" +
	"      ELSE 'r' END::pg_catalog.text AS rk,\n" +
	"    d.refobjid AS rid\n" +
	"  FROM pg_catalog.pg_depend d JOIN owner o ON d.classid OPERATOR(pg_catalog.=) o.cls AND d.objid OPERATOR(pg_catalog.=) o.obj\n" +
	"  WHERE o.id OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"    AND d.refclassid OPERATOR(pg_catalog.=) ANY (ARRAY['pg_catalog.pg_proc'::pg_catalog.regclass, 'pg_catalog.pg_type'::pg_catalog.regclass,\n" +
	"      'pg_catalog.pg_operator'::pg_catalog.regclass, 'pg_catalog.pg_class'::pg_catalog.regclass]::pg_catalog.oid[])\n" +
	"    AND NOT (d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid AND d.refobjid OPERATOR(pg_catalog.=) o.id)\n" +
	"  UNION ALL\n" +
	"  SELECT 'r', a.attrelid, 't', a.atttypid FROM pg_catalog.pg_attribute a\n" +
	"  WHERE a.attrelid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND a.attnum OPERATOR(pg_catalog.>) 0::pg_catalog.int2\n" +
	"    AND NOT a.attisdropped AND a.atttypid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"  UNION ALL SELECT 'r', inhparent, 'r', inhrelid FROM pg_catalog.pg_inherits\n" +
	"  UNION ALL SELECT 'r', confrelid, 'r', conrelid FROM pg_catalog.pg_constraint WHERE contype OPERATOR(pg_catalog.=) 'f'::pg_catalog.\"char\"\n" +
	"  UNION ALL SELECT 'r', i.indrelid, 'f', ap.amproc\n" +
	"  FROM pg_catalog.pg_index i, LATERAL pg_catalog.unnest(i.indclass::pg_catalog.oid[]) oc, pg_catalog.pg_opclass c, pg_catalog.pg_amproc ap\n" +
	"  WHERE oc OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND c.oid OPERATOR(pg_catalog.=) oc AND ap.amprocfamily OPERATOR(pg_catalog.=) c.opcfamily\n" +
	"  UNION ALL SELECT 'r', pt.partrelid, 'f', ap.amproc\n" +
	"  FROM pg_catalog.pg_partitioned_table pt, LATERAL pg_catalog.unnest(pt.partclass::pg_catalog.oid[]) oc, pg_catalog.pg_opclass c, pg_catalog.pg_amproc ap\n" +
	"  WHERE oc OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND c.oid OPERATOR(pg_catalog.=) oc AND ap.amprocfamily OPERATOR(pg_catalog.=) c.opcfamily\n" +
	"  UNION ALL SELECT 't', t.oid, 'f', f FROM pg_catalog.pg_type t,\n" +
	"    LATERAL pg_catalog.unnest(ARRAY[t.typinput, t.typoutput, t.typreceive, t.typsend, t.typmodin, t.typmodout, t.typanalyze]::pg_catalog.oid[]) f\n" +
	"  WHERE t.oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND f OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"  UNION ALL SELECT 't', oid, 't', typbasetype FROM pg_catalog.pg_type WHERE oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND typbasetype OPERATOR(pg_catalog.<>) 0::pg_catalog.oid\n" +
	"  UNION ALL SELECT 't', oid, 't', typelem FROM pg_catalog.pg_type WHERE oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND typelem OPERATOR(pg_catalog.<>) 0::pg_catalog.oid\n" +
	"  UNION ALL SELECT 't', oid, 'r', typrelid FROM pg_catalog.pg_type WHERE oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND typrelid OPERATOR(pg_catalog.<>) 0::pg_catalog.oid\n" +
	"  UNION ALL SELECT 't', rngtypid, 't', rngsubtype FROM pg_catalog.pg_range WHERE rngtypid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"  UNION ALL SELECT 't', rngtypid, 'f', f FROM pg_catalog.pg_range,\n" +
	"    LATERAL pg_catalog.unnest(ARRAY[rngcanonical, rngsubdiff]::pg_catalog.oid[]) f\n" +
	"  WHERE rngtypid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND f OPERATOR(pg_catalog.<>) 0::pg_catalog.oid\n" +
	"  UNION ALL SELECT 't', castsource, 'f', castfunc FROM pg_catalog.pg_cast\n" +
	"  WHERE oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND castfunc OPERATOR(pg_catalog.<>) 0::pg_catalog.oid\n" +
	"  UNION ALL SELECT 't', casttarget, 'f', castfunc FROM pg_catalog.pg_cast\n" +
	"  WHERE oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND castfunc OPERATOR(pg_catalog.<>) 0::pg_catalog.oid\n" +
	"), tree AS (\n" +
	"  SELECT 'r'::pg_catalog.text AS k, adrelid AS id, adbin AS t FROM pg_catalog.pg_attrdef WHERE adrelid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"  UNION ALL SELECT 'r', conrelid, conbin FROM pg_catalog.pg_constraint WHERE conrelid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND conbin IS NOT NULL\n" +
	"  UNION ALL SELECT 't', contypid, conbin FROM pg_catalog.pg_constraint WHERE contypid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND conbin IS NOT NULL\n" +
	"  UNION ALL SELECT 't', oid, typdefaultbin FROM pg_catalog.pg_type WHERE oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND typdefaultbin IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', indrelid, indexprs FROM pg_catalog.pg_index WHERE indrelid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND indexprs IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', indrelid, indpred FROM pg_catalog.pg_index WHERE indrelid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND indpred IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', partrelid, partexprs FROM pg_catalog.pg_partitioned_table WHERE partexprs IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', stxrelid, stxexprs FROM pg_catalog.pg_statistic_ext WHERE stxexprs IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', polrelid, polqual FROM pg_catalog.pg_policy WHERE polqual IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', polrelid, polwithcheck FROM pg_catalog.pg_policy WHERE polwithcheck IS NOT NULL\n" +
	"  UNION ALL SELECT 'r', ev_class, ev_action FROM pg_catalog.pg_rewrite WHERE ev_class OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"  UNION ALL SELECT 'r', ev_class, ev_qual FROM pg_catalog.pg_rewrite WHERE ev_class OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"  UNION ALL SELECT 'r', tgrelid, tgqual FROM pg_catalog.pg_trigger\n" +
	"  WHERE tgrelid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND NOT tgisinternal AND tgqual IS NOT NULL\n" +
	"), called AS (\n" +
	"  SELECT DISTINCT tree.k, tree.id, m[1]::pg_catalog.oid AS f\n" +
	"  FROM tree, LATERAL pg_catalog.regexp_matches(tree.t::pg_catalog.text, ':(?:funcid|aggfnoid|winfnoid) (\\d+)', 'g') m\n" +
	"), " +
	fingerprintCTE + "\n" +
	fingerprintRows + "\n" +
	"UNION ALL\n" +
	"SELECT 'n', 'r', c.oid, c.relname::pg_catalog.text,\n" +
	"  (c.relkind OPERATOR(pg_catalog.=) 'f'::pg_catalog.\"char\"\n" +
	"   OR EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite w WHERE w.ev_class OPERATOR(pg_catalog.=) c.oid\n" +
	"     AND w.rulename OPERATOR(pg_catalog.<>) '_RETURN'::pg_catalog.name)),\n" +
	"  NULL, NULL, NULL\n" +
	"FROM pg_catalog.pg_class c\n" +
	"WHERE c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'p', 'v', 'm', 'f']::pg_catalog.\"char\"[])\n" +
	"  AND (c.oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"   OR EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite w WHERE w.ev_class OPERATOR(pg_catalog.=) c.oid\n" +
	"     AND w.rulename OPERATOR(pg_catalog.<>) '_RETURN'::pg_catalog.name))\n" +
	"UNION ALL\n" +
	"SELECT 'n', 't', t.oid, t.typname::pg_catalog.text, false, NULL, NULL, NULL FROM pg_catalog.pg_type t\n" +
	"WHERE t.oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"UNION ALL\n" +
	"SELECT 'n', 'o', o.oid, o.oprname::pg_catalog.text, true, NULL, NULL, NULL FROM pg_catalog.pg_operator o\n" +
	"WHERE o.oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"UNION ALL\n" +
	"SELECT 'f', 'f', p.oid, p.proname::pg_catalog.text,\n" +
	"  NOT (l.lanname OPERATOR(pg_catalog.=) ANY (ARRAY['sql', 'plpgsql']::pg_catalog.name[])\n" +
	"    AND p.prokind OPERATOR(pg_catalog.=) 'f'::pg_catalog.\"char\" AND p.prosrc OPERATOR(pg_catalog.<>) ''::pg_catalog.text),\n" +
	"  NULL, NULL,\n" +
	"  CASE WHEN l.lanname OPERATOR(pg_catalog.=) ANY (ARRAY['sql', 'plpgsql']::pg_catalog.name[]) THEN p.prosrc END\n" +
	"FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_language l ON l.oid OPERATOR(pg_catalog.=) p.prolang\n" +
	"WHERE p.oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"UNION ALL\n" +
	"SELECT 's', 'f', p.oid, p.proname::pg_catalog.text, NULL, NULL, NULL, NULL FROM pg_catalog.pg_proc p\n" +
	"WHERE p.oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid AND EXISTS (SELECT 1 FROM pg_catalog.pg_proc b\n" +
	"  WHERE b.proname OPERATOR(pg_catalog.=) p.proname AND b.oid OPERATOR(pg_catalog.<) 16384::pg_catalog.oid)\n" +
	"UNION ALL\n" +
	"SELECT 'n', 'x', e.oid, e.evtname::pg_catalog.text, true, NULL, NULL, NULL FROM pg_catalog.pg_event_trigger e\n" +
	"UNION ALL\n" +
	"SELECT 'e', ref.k, ref.id, NULL, NULL, ref.rk, ref.rid,\n" +
	"  (SELECT p.proname::pg_catalog.text FROM pg_catalog.pg_proc p WHERE ref.rk OPERATOR(pg_catalog.=) 'f'::pg_catalog.text\n" +
	"     AND p.oid OPERATOR(pg_catalog.=) ref.rid AND p.oid OPERATOR(pg_catalog.<) 16384::pg_catalog.oid\n" +
	"     AND p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid)\n" +
	"FROM ref WHERE ref.rk OPERATOR(pg_catalog.<>) 't'::pg_catalog.text OR ref.rid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"UNION ALL\n" +
	"SELECT 'e', called.k, called.id, NULL, NULL, 'f', called.f,\n" +
	"  (SELECT p.proname::pg_catalog.text FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) called.f\n" +
	"     AND p.oid OPERATOR(pg_catalog.<) 16384::pg_catalog.oid\n" +
	"     AND p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid)\n" +
	"FROM called\n" +
	"UNION ALL\n" +
	"SELECT 'g', 'c', c.oid, NULL, NULL, 'f', c.castfunc,\n" +
	"  (SELECT p.proname::pg_catalog.text FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) c.castfunc\n" +
	"     AND p.oid OPERATOR(pg_catalog.<) 16384::pg_catalog.oid\n" +
	"     AND p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace::pg_catalog.oid)\n" +
	"FROM pg_catalog.pg_cast c WHERE c.oid OPERATOR(pg_catalog.>=) 16384::pg_catalog.oid\n" +
	"  AND c.castsource OPERATOR(pg_catalog.<) 16384::pg_catalog.oid AND c.casttarget OPERATOR(pg_catalog.<) 16384::pg_catalog.oid\n" +
	"  AND c.castfunc OPERATOR(pg_catalog.<>) 0::pg_catalog.oid" +
	"; COMMIT"

// FingerprintQuery returns the "v" rows Query's result carries: for every
// catalog Query reads, its number of rows and the sum of their xmin. Any
// DDL Query could see inserts, deletes or replaces a row in one of them,
// and a replaced row has a newer xmin, so an equal fingerprint means an
// equal catalog (a frozen row's xmin reads differently, which costs a
// needless full read, never a missed change). It costs a scan of those
// catalogs, a sixth of Query on a database of a thousand tables.
const FingerprintQuery = prelude + "WITH " + fingerprintCTE + "\n" + fingerprintRows + "; COMMIT"

const fingerprintCTE = "fp AS (\n" +
	"  SELECT 'pg_class'::pg_catalog.text AS cat, pg_catalog.count(*) AS n, pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) AS x FROM pg_catalog.pg_class\n" +
	"  UNION ALL SELECT 'pg_attribute', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_attribute\n" +
	"  UNION ALL SELECT 'pg_attrdef', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_attrdef\n" +
	"  UNION ALL SELECT 'pg_constraint', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_constraint\n" +
	"  UNION ALL SELECT 'pg_index', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_index\n" +
	"  UNION ALL SELECT 'pg_policy', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_policy\n" +
	"  UNION ALL SELECT 'pg_rewrite', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_rewrite\n" +
	"  UNION ALL SELECT 'pg_trigger', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_trigger\n" +
	"  UNION ALL SELECT 'pg_event_trigger', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_event_trigger\n" +
	"  UNION ALL SELECT 'pg_type', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_type\n" +
	"  UNION ALL SELECT 'pg_operator', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_operator\n" +
	"  UNION ALL SELECT 'pg_opclass', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_opclass\n" +
	"  UNION ALL SELECT 'pg_amproc', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_amproc\n" +
	"  UNION ALL SELECT 'pg_cast', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_cast\n" +
	"  UNION ALL SELECT 'pg_range', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_range\n" +
	"  UNION ALL SELECT 'pg_inherits', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_inherits\n" +
	"  UNION ALL SELECT 'pg_partitioned_table', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_partitioned_table\n" +
	"  UNION ALL SELECT 'pg_statistic_ext', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_statistic_ext\n" +
	"  UNION ALL SELECT 'pg_proc', pg_catalog.count(*), pg_catalog.sum(xmin::pg_catalog.text::pg_catalog.int8) FROM pg_catalog.pg_proc\n" +
	")"

const fingerprintRows = "SELECT 'v'::pg_catalog.text AS row, 'v'::pg_catalog.text AS k, 0::pg_catalog.oid AS id, fp.cat AS name, NULL::pg_catalog.bool AS bad,\n" +
	"  fp.n::pg_catalog.text AS rk, NULL::pg_catalog.oid AS rid, COALESCE(fp.x, 0)::pg_catalog.text AS fname\n" +
	"FROM fp"

// prelude runs the read in a transaction of its own with JIT compilation
// and parallel workers off (the query's estimated cost crosses the
// default jit_above_cost, and compiling it took longer than running it:
// 1.4 s against 0.3 s on a thousand tables) and a statement timeout of
// its own, whatever the connection's last client set. SET LOCAL ends
// with the transaction, so no client sees any of it. Every operator is
// written OPERATOR(pg_catalog.…) and every constant typed, so that no
// operator a user created (a public.>= on (oid, integer)) can stand in.
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

// SameCode reports whether n and o hold the same names and operators,
// so that a text mentions code behind a name by one exactly when it does
// by the other: DDL that changed the catalog between them added and
// removed no such code (the pooler keeps a server connection whose
// requests ran while that DDL committed). A nil Names (nothing known) is
// the same as none.
func (n *Names) SameCode(o *Names) bool {
	switch {
	case n == nil || o == nil:
		return false
	case n == o:
		return true
	case n.all != o.all || len(n.idents) != len(o.idents) || len(n.ops) != len(o.ops):
		return false
	}
	for id := range n.idents {
		if _, ok := o.idents[id]; !ok {
			return false
		}
	}
	for _, op := range n.ops { // distinct in each, and few
		if !slices.Contains(o.ops, op) {
			return false
		}
	}
	return true
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
	// bodies are the user functions in LANGUAGE sql or plpgsql, by OID:
	// harmless while their body is (sqllex.RoutineBodyHarmless) and
	// names nothing bad.
	bodies map[uint32]string
	shadow map[string]struct{} // user functions' names that built-ins have too
	events bool                // a user event trigger exists
	all    bool
	fp     map[string]string // "v" rows: rows and xmin sum by catalog
}

// Fingerprint returns the fingerprint of the "v" rows added so far, Query's
// or FingerprintQuery's: catalog by catalog, in name order.
func (b *Builder) Fingerprint() string {
	cats := make([]string, 0, len(b.fp))
	for c := range b.fp {
		cats = append(cats, c)
	}
	slices.Sort(cats)
	var s strings.Builder
	for _, c := range cats {
		s.WriteString(c)
		s.WriteByte('=')
		s.WriteString(b.fp[c])
		s.WriteByte(' ')
	}
	return s.String()
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

// badBuiltin reports whether a built-in function may change the session:
// one outside pg_catalog (name is nil then), or one the lexer does not
// call harmless.
func badBuiltin(name *string) bool {
	return name == nil || !sqllex.HarmlessBuiltin(*name)
}

// errRow is returned for a DataRow that is not one of Query's.
var errRow = errors.New("hiddencode: unexpected row")

// Add takes one DataRow body of Query's result.
func (b *Builder) Add(body []byte) error {
	col, ok := columns(body)
	if !ok {
		return errRow
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
	case 'n', 'f':
		return b.addObject(k, (*row)[0] == 'f', &col)
	case 's':
		if col[3] == nil {
			return errRow
		}
		if b.shadow == nil {
			b.shadow = make(map[string]struct{})
		}
		b.shadow[*col[3]] = struct{}{}
	case 'v':
		if col[3] == nil || col[5] == nil || col[7] == nil {
			return errRow
		}
		if b.fp == nil {
			b.fp = make(map[string]string)
		}
		b.fp[*col[3]] = *col[5] + ":" + *col[7]
	case 'e', 'g':
		return b.addUse(k, (*row)[0] == 'g', &col)
	default:
		return errRow
	}
	return nil
}

// columns splits a DataRow body into Query's eight columns, nil for NULL,
// and reports false when it is not a row of eight. It is split from Add so
// that reading the wire format and reading the facts stay apart.
func columns(body []byte) (col [8]*string, ok bool) {
	if len(body) < 2 || binary.BigEndian.Uint16(body) != uint16(len(col)) {
		return col, false
	}
	body = body[2:]
	for i := range col {
		if len(body) < 4 {
			return col, false
		}
		l := int32(binary.BigEndian.Uint32(body))
		body = body[4:]
		if l < 0 {
			continue
		}
		if int(l) > len(body) {
			return col, false
		}
		v := string(body[:l])
		col[i] = &v
		body = body[l:]
	}
	return col, true
}

// addObject takes an "n" row (an object) or, with function set, an "f"
// row (a user function, with its body when it is in a language the bodies
// are read in) for the object k: its name, whether it runs user code
// itself, and what its kind implies (an event trigger, an operator's
// symbol). It is one of Add's row kinds, given a function of its own to
// keep Add short.
func (b *Builder) addObject(k key, function bool, col *[8]*string) error {
	if col[3] == nil {
		return errRow
	}
	n := b.node(k)
	n.name = *col[3]
	if col[4] != nil && *col[4] == "t" {
		b.seeds = append(b.seeds, k)
	} else if function {
		if col[7] == nil {
			return errRow
		}
		if b.bodies == nil {
			b.bodies = make(map[uint32]string)
		}
		b.bodies[k.oid] = *col[7]
	}
	if k.kind == 'x' {
		b.events = true
	}
	if k.kind == 'o' {
		if b.ops == nil {
			b.ops = make(map[string]struct{})
		}
		b.ops[n.name] = struct{}{}
	}
	return nil
}

// addUse takes an "e" row (a dependency: using k may run what it points
// at) or, with cast set, a "g" row (a user cast between two built-in
// types, whose function it points at). It is one of Add's row kinds,
// given a function of its own because it holds the rules for what a use
// of a built-in, a user operator or another object implies.
func (b *Builder) addUse(k key, cast bool, col *[8]*string) error {
	if col[5] == nil || col[6] == nil || len(*col[5]) != 1 {
		return errRow
	}
	roid, err := strconv.ParseUint(*col[6], 10, 32)
	if err != nil {
		return errRow
	}
	r := key{(*col[5])[0], uint32(roid)}
	switch {
	case cast:
		// A user cast between two built-in types: it may run behind
		// any coercion, unless its function is a harmless built-in.
		if r.oid >= firstUserOID || badBuiltin(col[7]) {
			b.all = true
		}
	case r.kind == 'f' && r.oid < firstUserOID:
		if badBuiltin(col[7]) {
			b.seeds = append(b.seeds, k)
		}
	case r.kind == 'o' && r.oid >= firstUserOID:
		b.seeds = append(b.seeds, k)
	default:
		t := b.node(r)
		t.users = append(t.users, k)
	}
	return nil
}

// impliedOps are the operator names the grammar looks up by name for
// keywords that show no operator (IN, LIKE, BETWEEN, NULLIF, IS DISTINCT
// FROM, a simple CASE, USING and NATURAL joins); impliedWords those
// keywords. A user operator of one of these names makes the keywords
// mentions of it.
var (
	impliedOps = map[string]struct{}{
		"=": {}, "<>": {}, "<": {}, ">": {}, "<=": {}, ">=": {},
		"~~": {}, "!~~": {}, "~~*": {}, "!~~*": {}, "~": {}, "!~": {},
	}
	impliedWords = []string{"in", "like", "ilike", "similar", "between", "nullif", "distinct", "case", "using", "natural"}
	// eventWords are the statements besides CREATE, ALTER, DROP and
	// SELECT INTO that fire an event trigger.
	eventWords = []string{"comment", "grant", "revoke", "security", "import", "refresh"}
)

// Build returns the names of every relation and type whose use may run
// user code, directly or through another (a view over a view over a table
// whose trigger inserts into a table with a column of a domain whose CHECK
// calls set_config), the user-defined operators' symbols, and the names of
// user functions that built-ins share (a call PostgreSQL may resolve to
// either).
func (b *Builder) Build() *Names {
	n := &Names{idents: make(map[string]struct{}), all: b.all, fp: b.Fingerprint()}
	if b.events {
		// An event trigger runs on DDL. CREATE, ALTER, DROP and SELECT
		// INTO are opaque already; these statements fire it too.
		for _, w := range eventWords {
			n.idents[w] = struct{}{}
		}
	}
	for oid, body := range b.bodies {
		if !sqllex.RoutineBodyHarmless(body) {
			b.seeds = append(b.seeds, key{'f', oid})
		}
	}
	// A user function without a row of its own (not in a language the
	// bodies are read in) is bad.
	for k, nd := range b.nodes {
		if _, read := b.bodies[k.oid]; k.kind == 'f' && k.oid >= firstUserOID && !read && !nd.bad {
			b.seeds = append(b.seeds, k)
		}
	}
	for op := range b.ops {
		n.ops = append(n.ops, op)
		if _, ok := impliedOps[op]; ok {
			for _, w := range impliedWords {
				n.idents[w] = struct{}{}
			}
		}
	}
	for name := range b.shadow {
		n.idents[name] = struct{}{}
	}
	for {
		b.spread(n)
		// A body naming something bad runs it: bad too, and everything
		// that uses it. Each round can only add.
		more := false
		for oid, body := range b.bodies {
			k := key{'f', oid}
			if b.node(k).bad || !sqllex.MentionsAny(body, n.idents, n.ops) {
				continue
			}
			b.seeds = append(b.seeds, k)
			more = true
		}
		if !more {
			return n
		}
	}
}

// clip returns name as the lexer reads a client's spelling of it: at most
// 63 bytes of UTF-8, cut before a character that does not fit. The server
// cuts names at 63 bytes of its own encoding: in a LATIN1 database a name
// of 44 accented letters is whole (44 bytes) while its UTF-8 spelling
// takes 88, and in SQL_ASCII a cut may split a character.
func clip(name string) string {
	if len(name) > 63 {
		name = name[:63]
	}
	for len(name) > 0 && !utf8.ValidString(name) {
		name = name[:len(name)-1]
	}
	return name
}

// spread marks bad every object that reaches a seed, and names the
// relations and types among them in n.
func (b *Builder) spread(n *Names) {
	queue := b.seeds
	b.seeds = nil
	for len(queue) > 0 {
		k := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		nd := b.node(k)
		nd.bad = true
		if nd.name != "" && (k.kind == 'r' || k.kind == 't') && k.oid >= firstUserOID {
			// A built-in's own name (pg_settings) the lexer reads itself;
			// it is followed only to the user objects that use it.
			n.idents[nd.name] = struct{}{}
			if c := clip(nd.name); c != nd.name {
				n.idents[c] = struct{}{}
			}
		}
		for _, u := range nd.users {
			if un := b.node(u); !un.bad {
				un.bad = true
				queue = append(queue, u)
			}
		}
		nd.users = nil
	}
}
