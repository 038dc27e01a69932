package pooler

// The differential oracle for session-state detection.
//
// In transaction mode the pooler lends a server connection per transaction
// and decides from the SQL text alone (inspectSQL, built on internal/sqllex)
// what each statement may do to the server session. A statement it takes
// for harmless is followed by no reset and no pin, so if it did change the
// session, the next client inherits the change. The oracle runs statements
// on a real PostgreSQL session, directly rather than through the pooler,
// reads the session's state from the server after each one, and compares
// what changed with what inspectSQL believed could change.
//
// State is compared only where the transaction status is idle: a block's
// changes are attributed to every statement of the block (a group). A group
// whose end state gained something (a setting at session level, a new
// identity, a temporary object, a SQL prepared statement, a WITH HOLD
// cursor, a LISTEN, a session advisory lock) while no statement of it was
// believed to change anything is a miss; one where something was believed,
// but no statement covers a kind of state that grew, is a kind gap. Losing
// state is no leak (the pooler at worst keeps a pin longer) and is neither.

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/internal/sqllex"
	"github.com/pgquic/pgquic/pooler/params"
)

// oracleStateSQL reads, on the session itself, everything a later client
// of the same server connection could notice. Every name is qualified with
// pg_catalog and operators are spelled OPERATOR(pg_catalog.=), so what the
// session did to search_path, or objects it created in pg_temp or public,
// cannot change what the query means. Custom parameters ("app.tenant")
// are not in pg_settings: oracleRun.stateSQL adds the ones it knows of.
const oracleStateSQL = `SELECT pg_catalog.concat('setting ', name, '=', setting) FROM pg_catalog.pg_settings WHERE source OPERATOR(pg_catalog.=) 'session'
UNION ALL SELECT pg_catalog.concat('identity current_user=', current_user, ' session_user=', session_user, ' role=', pg_catalog.current_setting('role'), ' session_authorization=', pg_catalog.current_setting('session_authorization'))
UNION ALL SELECT pg_catalog.concat('temp ', relkind, ' ', relname) FROM pg_catalog.pg_class WHERE relnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()
UNION ALL SELECT pg_catalog.concat('temp function ', proname) FROM pg_catalog.pg_proc WHERE pronamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()
UNION ALL SELECT pg_catalog.concat('temp type ', typname) FROM pg_catalog.pg_type WHERE typnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema() AND typrelid OPERATOR(pg_catalog.=) '0' AND typelem OPERATOR(pg_catalog.=) '0'
UNION ALL SELECT pg_catalog.concat('prepared ', name) FROM pg_catalog.pg_prepared_statements WHERE from_sql
UNION ALL SELECT pg_catalog.concat('cursor ', name) FROM pg_catalog.pg_cursors WHERE is_holdable
UNION ALL SELECT pg_catalog.concat('listen ', c) FROM pg_catalog.pg_listening_channels() c
UNION ALL SELECT pg_catalog.concat('advisory ', mode, ' ', classid, ',', objid, ',', objsubid) FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()`

// believesChange reports whether the pooler, given inspectSQL's info and
// sqllex.Classify's flags for a text, takes the text to possibly change
// the server session: an identity change, parameters set or reset, state
// it pins for (or DO/CALL, whose effect it probes), or text it could not
// read with certainty. Transaction control alone is not a belief that the
// session changed: the pooler tracks it, but resets nothing after a block.
func believesChange(info sqlInfo, flags sqllex.Flags) bool {
	return info.identity || len(info.params) > 0 || len(info.resets) > 0 ||
		info.paramsAll || info.resetAll || info.pins.Holds != 0 || info.pins.Opaque ||
		flags&sqllex.Unsure != 0
}

// oracleStep is one text the oracle sent and what inspectSQL made of it.
type oracleStep struct {
	text     string
	info     sqlInfo
	flags    sqllex.Flags
	believed bool
	reported map[string]string // ParameterStatus the server sent for it
	errMsg   string            // the server's error, if any
}

// oracleGap is a group of statements whose state change was not (fully)
// believed: a miss when nothing in the group was believed, a kind gap when
// something was, but not of the kinds of state that grew.
type oracleGap struct {
	steps []oracleStep
	added []string // state items the group created or changed
	kinds []string // kinds of added state no statement of the group covers
	miss  bool     // no statement of the group was believed to change anything
	cause string   // the pendingFixes, newFindings or oracleAllow entry that explains it, if any
	why   string   // that entry's reason
}

// texts returns the group's texts joined for reports.
func (g oracleGap) texts() string {
	var b strings.Builder
	for i, s := range g.steps {
		if i > 0 {
			b.WriteString(" ⏎ ")
		}
		b.WriteString(s.text)
		if s.errMsg != "" {
			b.WriteString(" [ERROR: " + s.errMsg + "]")
		}
	}
	return b.String()
}

// oracleCause explains a class of gaps. stmt looks at the statements of
// the group that could have caused the gap (suspects: for a miss every
// statement, for a kind gap those that do not cover the kinds that grew);
// gap, when set, looks at the whole group instead.
type oracleCause struct {
	name  string
	why   string
	kinds []string // kinds of state (stateKind) it explains; nil for any
	stmt  func(s oracleSuspect) bool
	gap   func(g oracleGap) bool
}

// oracleSuspect is one statement of a gap's group that could have caused
// it, with the names of the functions the database defines beyond the
// built-in ones.
type oracleSuspect struct {
	text      string
	flags     sqllex.Flags
	userFuncs map[string]bool
}

// funcCall finds what may be function calls: a name, then "(".
var funcCall = regexp.MustCompile(`(?i)([a-z_][a-z0-9_$]*|"(?:[^"]|"")+")\s*\(`)

// stmtMatch returns a statement matcher for re, which ignores DO and CALL:
// the code they run is theirs, whatever it spells.
func stmtMatch(re string) func(oracleSuspect) bool {
	r := regexp.MustCompile(re)
	return func(s oracleSuspect) bool {
		return s.flags&(sqllex.DoBlock|sqllex.Call) == 0 && r.MatchString(s.text)
	}
}

// pendingFixes are misses the pooler is known to have while a fix is on
// its way: tolerated with a t.Log so that work can land in steps. It is
// empty: set_config with arguments that are not plain literals, writes to
// pg_settings, SELECT INTO a pg_temp table and calls of user functions,
// the misses this oracle first found, are all believed now (the lexer
// fails closed), and any of them failing again fails the test.
var pendingFixes = []oracleCause{}

// newFindings are misses found and not yet fixed or accepted, tolerated
// like pendingFixes until someone fixes them or moves them to oracleAllow
// with the reason. It is empty: the oracle's later findings (DO or CALL
// changing parameters or the identity, EXPLAIN ANALYZE SELECT INTO pg_temp,
// EXECUTE of a statement that changes state) are believed now.
var newFindings = []oracleCause{}

// oracleAllow are misses inherent to reading SQL text, which no lexer can
// fix: each says why, and how the pooler copes at run time.
var oracleAllow = []oracleCause{
	{
		// A trigger, a view or a function's SET clause can change the
		// identity or a reported parameter from a statement whose text is a
		// plain INSERT or SELECT. The server reports these parameters
		// (ParameterStatus), and the pooler acts on the reports
		// (identityReported, the tracked-parameter sync in params.go).
		name: "covered by ParameterStatus",
		why:  "only identity or reported parameters changed, and the server reported them, which the pooler acts on",
		gap: func(g oracleGap) bool {
			rep := map[string]bool{}
			for _, s := range g.steps {
				for k := range s.reported {
					rep[strings.ToLower(k)] = true
				}
			}
			for _, a := range g.added {
				switch {
				case strings.HasPrefix(a, "identity "):
					if !rep["session_authorization"] && !rep["is_superuser"] {
						return false
					}
				case strings.HasPrefix(a, "setting "):
					name, _, _ := strings.Cut(strings.TrimPrefix(a, "setting "), "=")
					if !rep[strings.ToLower(name)] || !params.Reported(params.Canonical(name)) {
						return false
					}
				default:
					return false
				}
			}
			return true
		},
	},
	{
		// The statement names a table or a view; the trigger or the view's
		// definition that runs set_config is in the catalogue. Only the
		// server could tell, so the pooler would have to reset after every
		// statement, which transaction pooling exists to avoid.
		name: "trigger or view with side effects",
		why:  "the text names only a table or a view; a trigger on it, or the view's definition, changes the session",
		stmt: stmtMatch(`(?i)\boracle_(trig|view)\b`),
	},
}

// pinKinds are the kinds of state the pooler pins a client for (pin.go);
// the others (settings, identity) it resets or syncs per item.
var pinKinds = map[string]bool{"temp": true, "prepared": true, "cursor": true, "listen": true, "advisory": true}

// transactionSettings are run-time parameters that belong to the current
// transaction, set from default_transaction_* when each one starts:
// pg_settings may list them with source session after a SET TRANSACTION,
// but no later transaction sees the value.
var transactionSettings = []string{"transaction_isolation", "transaction_read_only", "transaction_deferrable"}

// stateKind names the kind of a state item ("setting", "identity", "temp",
// "prepared", "cursor", "listen", "advisory").
func stateKind(item string) string {
	k, _, _ := strings.Cut(item, " ")
	return k
}

// covered reports whether step s believed a change of the kind of item.
// Settings need their name among the parameters inspectSQL found, or a
// statement that may touch any parameter.
func covered(s oracleStep, item string) bool {
	in, pins := s.info, s.info.pins
	if s.flags&sqllex.Unsure != 0 {
		return true
	}
	switch stateKind(item) {
	case "setting":
		if in.paramsAll || in.resetAll {
			return true
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(item, "setting "), "=")
		if in.identity && strings.HasPrefix(name, "default_transaction_") {
			return true // SET SESSION CHARACTERISTICS; the identity reset undoes it
		}
		for _, p := range slices.Concat(in.params, in.resets) {
			if strings.EqualFold(p, name) {
				return true
			}
		}
		return false
	case "identity":
		// An opaque statement is followed by the probe, which asks the
		// server whether the identity moved and pins the client if so.
		return in.identity || pins.Opaque
	case "temp":
		return pins.Holds&sqllex.HeldTemp != 0 || pins.Opaque
	case "prepared":
		return pins.Holds&sqllex.HeldPrepare != 0 || pins.Opaque
	case "cursor":
		return pins.Holds&sqllex.HeldCursor != 0 || pins.Opaque
	case "listen":
		return pins.Holds&sqllex.HeldListen != 0 || pins.Opaque
	case "advisory":
		return pins.Holds&sqllex.HeldAdvisory != 0 || pins.Opaque
	}
	return false
}

// oracleRun drives one session of the oracle and collects its findings.
type oracleRun struct {
	t     testing.TB
	c     *pgtest.Cluster
	db    string
	param map[string]string
	conn  *oracleConn

	base  []string // state at the last idle point
	login string   // the identity item of a new session

	custom    []string // custom parameters the texts may set
	stateText string   // stateSQL's text for custom, "" when to be built
	group     []oracleStep

	// For generated text: end a failed block with ROLLBACK at once, and
	// commit a block after maxBlock texts, so that most texts run; send
	// the state query with each text (oracleConn.execThen), which runs it
	// inside open blocks too. Texts of a corpus run alone.
	rollbackFailed bool
	maxBlock       int
	pipelined      bool

	texts      int // texts sent
	errors     int // texts the server answered with an error
	unreadable int // idle points where the state could not be read
	lost       int // sessions lost (a statement outlived its cancel, or killed the session)
	gaps       []oracleGap
}

// newOracleRun opens a session in database db. Startup parameters are the
// client's (source "client"), so they never look like session changes.
func newOracleRun(t testing.TB, c *pgtest.Cluster, db string) *oracleRun {
	t.Helper()
	r := &oracleRun{t: t, c: c, db: db, param: map[string]string{
		"statement_timeout": "5s", "lock_timeout": "5s", "application_name": "oracle",
	}}
	if err := r.connect(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	return r
}

func (r *oracleRun) connect() error {
	conn, err := dialOracle(r.c, r.db, r.param)
	if err != nil {
		return err
	}
	r.conn = conn
	r.group = nil
	r.base, err = r.readState()
	if err != nil {
		return fmt.Errorf("oracle: state of a new session: %w", err)
	}
	for _, item := range r.base {
		if stateKind(item) == "identity" {
			r.login = item
		}
	}
	return nil
}

func (r *oracleRun) close() {
	if r.conn != nil {
		_ = r.conn.Close()
		r.conn = nil
	}
}

// restart replaces the session, for a broken connection or a new corpus file.
func (r *oracleRun) restart() {
	r.close()
	if err := r.connect(); err != nil {
		r.t.Fatalf("oracle: reconnect: %v", err)
	}
}

// customName finds custom parameter names ("app.tenant") in string
// constants, where set_config and current_setting take them.
var customName = regexp.MustCompile(`'([A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$.]*)'`)

// noteCustom remembers the custom parameters text may set, so the state
// query reads them: PostgreSQL lists placeholders in no view, and
// current_setting needs the name.
func (r *oracleRun) noteCustom(text string, info sqlInfo) {
	if !strings.Contains(text, ".") {
		return
	}
	add := func(name string) {
		name = strings.ToLower(name)
		if strings.Contains(name, ".") && !slices.Contains(r.custom, name) && len(r.custom) < 200 {
			r.custom = append(r.custom, name)
			r.stateText = ""
		}
	}
	for _, name := range slices.Concat(info.params, info.resets) {
		add(name)
	}
	for _, m := range customName.FindAllStringSubmatch(text, -1) {
		add(m[1])
	}
}

// stateSQL returns oracleStateSQL extended with the custom parameters
// seen so far that are placeholders (an unset one reads as NULL, a reset
// one as ""). Once a library defines the parameter (plpgsql.* when the
// session first runs PL/pgSQL), pg_settings lists it with its source and
// the placeholder query leaves it alone: its default is no change.
func (r *oracleRun) stateSQL() string {
	if r.stateText == "" {
		r.stateText = oracleStateSQL
		if len(r.custom) > 0 {
			quoted := make([]string, len(r.custom))
			for i, n := range r.custom {
				quoted[i] = `"` + n + `"`
			}
			r.stateText += "\nUNION ALL SELECT pg_catalog.concat('setting ', n, '=', v) FROM pg_catalog.unnest('{" +
				strings.ReplaceAll(strings.Join(quoted, ","), "'", "''") + "}'::pg_catalog.text[]) n CROSS JOIN LATERAL " +
				"pg_catalog.current_setting(n, true) v " +
				"LEFT JOIN pg_catalog.pg_settings s ON s.name OPERATOR(pg_catalog.=) n " +
				"WHERE v OPERATOR(pg_catalog.<>) '' AND s.name IS NULL"
		}
	}
	return r.stateText
}

// readState reads the session's state; the caller makes sure no
// transaction block is open.
func (r *oracleRun) readState() ([]string, error) {
	res, err := r.conn.exec(r.stateSQL(), nil, true)
	if err != nil {
		return nil, err
	}
	return stateRows(res)
}

// stateRows turns oracleStateSQL's answer into a sorted state.
func stateRows(res oracleResult) ([]string, error) {
	if res.err != nil {
		return nil, fmt.Errorf("%s %s", res.err.Code, res.err.Message)
	}
	rows := slices.DeleteFunc(res.rows, func(item string) bool {
		name, _, _ := strings.Cut(strings.TrimPrefix(item, "setting "), "=")
		return stateKind(item) == "setting" && slices.Contains(transactionSettings, name)
	})
	sort.Strings(rows)
	return rows, nil
}

// run sends text as one simple Query (copyData answers a COPY FROM STDIN)
// and, once no transaction block is open, compares the state.
func (r *oracleRun) run(text string, copyData []byte) {
	info := inspectSQL([]byte(text))
	flags := sqllex.Classify(text).Flags
	st := oracleStep{text: text, info: info, flags: flags, believed: believesChange(info, flags)}
	r.texts++
	r.noteCustom(text, info)
	var (
		res      oracleResult
		stateRes oracleResult
		stateOK  bool
		err      error
	)
	if r.pipelined {
		res, stateRes, stateOK, err = r.conn.execThen(text, r.stateSQL())
	} else {
		res, err = r.conn.exec(text, copyData, false)
	}
	if err != nil {
		r.t.Logf("oracle: session lost after %.200q: %v", text, err)
		r.lost++
		r.restart()
		return
	}
	st.reported = res.reported
	if res.err != nil {
		r.errors++
		st.errMsg = res.err.Code + " " + res.err.Message
	}
	r.group = append(r.group, st)
	switch {
	case r.conn.status == 'E' && r.rollbackFailed:
		r.run("ROLLBACK", nil)
		return
	case r.conn.status == 'T' && r.maxBlock > 0 && len(r.group) >= r.maxBlock:
		r.run("COMMIT", nil)
		return
	case r.conn.status != 'I':
		return
	}
	var now []string
	switch {
	case r.pipelined && stateOK:
		now, err = stateRows(stateRes)
	default:
		now, err = r.readState()
	}
	if err != nil {
		// A statement_timeout of a few milliseconds, say: keep the group
		// open and compare at the next idle point that reads.
		r.unreadable++
		if r.conn.status != 'I' {
			r.t.Fatalf("oracle: the state query left status %c", r.conn.status)
		}
		return
	}
	r.compare(now)
}

// finish ends an open block (the corpus may leave one open) and compares.
func (r *oracleRun) finish() {
	if r.conn.status != 'I' {
		r.run("ROLLBACK", nil)
	}
}

// compare records a gap when the state grew in ways the group's beliefs do
// not cover, then starts a new group.
func (r *oracleRun) compare(now []string) {
	before, group := r.base, r.group
	r.base, r.group = now, nil
	added := grown(before, now, r.login)
	if len(added) == 0 {
		return
	}
	believed := false
	for _, s := range group {
		believed = believed || s.believed
	}
	var kinds []string
	for _, item := range added {
		if slices.Contains(kinds, stateKind(item)) {
			continue
		}
		if !slices.ContainsFunc(group, func(s oracleStep) bool { return covered(s, item) }) {
			kinds = append(kinds, stateKind(item))
		}
	}
	if believed && len(kinds) == 0 {
		return
	}
	g := oracleGap{steps: group, added: added, kinds: kinds, miss: !believed}
	g.cause, g.why = explain(g, r.userFuncs())
	r.gaps = append(r.gaps, g)
}

// userFuncs returns the names of the functions and procedures the database
// defines outside pg_catalog and information_schema, read on the session
// (idle) when a gap needs explaining.
func (r *oracleRun) userFuncs() map[string]bool {
	res, err := r.conn.exec(`SELECT proname FROM pg_catalog.pg_proc
		WHERE pronamespace OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.regnamespace
		AND pronamespace OPERATOR(pg_catalog.<>) 'information_schema'::pg_catalog.regnamespace`, nil, true)
	names := map[string]bool{}
	if err != nil {
		r.t.Logf("oracle: reading user functions: %v", err)
		r.lost++
		r.restart()
		return names
	}
	for _, n := range res.rows {
		names[n] = true
	}
	return names
}

// grown returns the items of the sorted state now that are not in before
// and could leak to the next client of the connection. Coming back to the
// login identity is no leak; nor is one more object of a kind the session
// held already (an index on a temporary table, a second LISTEN): the
// pooler pins by kind and asks the server before unpinning.
func grown(before, now []string, login string) []string {
	held := map[string]bool{}
	for _, item := range before {
		held[stateKind(item)] = true
	}
	var added []string
	for _, item := range now {
		if _, found := slices.BinarySearch(before, item); found {
			continue
		}
		if k := stateKind(item); item != login && !(pinKinds[k] && held[k]) {
			added = append(added, item)
		}
	}
	return added
}

// explain names the cause that explains g, and its reason, or returns ""
// when none does: the first entry of oracleAllow, pendingFixes, then
// newFindings that matches one of g's suspects (or g itself). In a group of
// several statements that is a good guess, not a proof: the counts by cause
// are approximate, the examples of single statements exact.
func explain(g oracleGap, userFuncs map[string]bool) (cause, why string) {
	suspects := g.suspects()
	for _, list := range []struct {
		label  string
		causes []oracleCause
	}{
		// What the server reports is covered whatever the text was, and
		// the allowed statements are named precisely, so they come first.
		{"allowed", oracleAllow},
		{"pending", pendingFixes},
		{"new", newFindings},
	} {
		for _, c := range list.causes {
			if c.kinds != nil && !slices.ContainsFunc(g.kinds, func(k string) bool { return slices.Contains(c.kinds, k) }) {
				continue
			}
			if c.gap != nil && c.gap(g) {
				return list.label + ": " + c.name, c.why
			}
			if c.stmt == nil {
				continue
			}
			for _, s := range suspects {
				if c.stmt(oracleSuspect{text: s.text, flags: s.flags, userFuncs: userFuncs}) {
					return list.label + ": " + c.name, c.why
				}
			}
		}
	}
	return "", ""
}

// suspects returns the statements of g, one by one, that could have caused
// it: for a miss all of them, for a kind gap those that do not cover every
// kind of state that grew.
func (g oracleGap) suspects() []oracleStep {
	var out []oracleStep
	for _, step := range g.steps {
		for st := range sqllex.Statements(step.text) {
			text := step.text[st.Start:st.End]
			info := inspectSQL([]byte(text))
			s := oracleStep{text: text, info: info, flags: sqllex.Classify(text).Flags}
			suspect := g.miss
			for _, item := range g.added {
				if slices.Contains(g.kinds, stateKind(item)) && !covered(s, item) {
					suspect = true
				}
			}
			if suspect {
				out = append(out, s)
			}
		}
	}
	return out
}

// Flags of the oracle's long mode.
var (
	oracleN    = flag.Int("oracle.n", 0, "generated texts TestOracleGenerated runs (default 3000, or PGQUIC_ORACLE_N)")
	oracleSeed = flag.Uint64("oracle.seed", 1, "seed of TestOracleGenerated's generator")
)

// oracleCluster starts a throwaway cluster for the oracle in database db
// (created when not "postgres").
func oracleCluster(t testing.TB, db string) *pgtest.Cluster {
	t.Helper()
	c := pgtest.New(t, pgtest.Options{Settings: map[string]string{"max_prepared_transactions": "10"}})
	if db != "postgres" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Exec(ctx, "CREATE DATABASE "+db); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// setupGenerated creates the generator's objects through r's session and
// starts a fresh session that rolls failed blocks back at once.
func setupGenerated(t testing.TB, r *oracleRun) {
	t.Helper()
	res, err := r.conn.exec(oracleSetupSQL, nil, false)
	if err != nil || res.err != nil {
		t.Fatalf("oracle setup: %v %v", err, res.err)
	}
	r.restart()
	r.rollbackFailed, r.maxBlock, r.pipelined = true, 8, true
}

// TestOracleGenerated runs generated texts (oracleGen) through the oracle:
// 3000 by default, -oracle.n=1000000 (or PGQUIC_ORACLE_N) for the long run.
func TestOracleGenerated(t *testing.T) {
	n := 3000
	if v, err := strconv.Atoi(os.Getenv("PGQUIC_ORACLE_N")); err == nil && v > 0 {
		n = v
	}
	if *oracleN > 0 {
		n = *oracleN
	}
	c := oracleCluster(t, "postgres")
	r := newOracleRun(t, c, "postgres")
	setupGenerated(t, r)
	g := newOracleGen(*oracleSeed)
	start := time.Now()
	for i := range n {
		r.run(g.text(), nil)
		if i%100000 == 99999 {
			t.Logf("oracle: %d generated, %s, %v", i+1, r.counts(), time.Since(start).Round(time.Second))
		}
	}
	r.finish()
	r.report(t, time.Since(start))
}

// FuzzOracle runs texts built from the generator's statements and
// punctuation (one byte picks one token) through the oracle, one input at a
// time on a session that DISCARD ALL returns to its start between inputs.
func FuzzOracle(f *testing.F) {
	toks := oracleFuzzTokens()
	f.Add([]byte{15, 16, 2, 18, 11, 4, 20, 4, 21, 3})
	c := oracleCluster(f, "postgres")
	r := newOracleRun(f, c, "postgres")
	setupGenerated(f, r)
	f.Fuzz(func(t *testing.T, data []byte) {
		var b strings.Builder
		for _, d := range data {
			b.WriteString(toks[int(d)%len(toks)])
		}
		r.t = t
		r.gaps = nil
		r.run(b.String(), nil)
		r.finish()
		for _, g := range r.gaps {
			switch {
			case g.miss && g.cause == "":
				t.Errorf("miss: %s\nadded: %q", g.texts(), g.added)
			default:
				t.Logf("tolerated (%s): %s\nadded: %q", g.cause, g.texts(), g.added)
			}
		}
		res, err := r.conn.exec("DISCARD ALL", nil, false)
		if err != nil || res.err != nil {
			r.restart()
		}
		if r.base, err = r.readState(); err != nil {
			r.restart()
		}
		r.group = nil
	})
}

// oracleFuzzTokens are the pieces FuzzOracle builds texts from: a sample
// of generated statements (fixed seed), and punctuation and words that
// recombine them into texts the generator never writes.
func oracleFuzzTokens() []string {
	toks := []string{";", " ", "(", ")", ",", "'", "$$", "/*", "*/", "--", "\n", "::text", "||", "E'\\'", `"`,
		"SELECT ", "set_config", "'role'", "'work_mem'", "'oracle_r2'", "'64kB'", "false", "true", "SET ", "LOCAL ",
		"ROLE ", "oracle_r2", "INTO ", "pg_temp.", "TEMP ", "TABLE ", "ot1", "BEGIN", "COMMIT", "LISTEN ", "och1",
		"pg_advisory_lock(1)", "DO ", "PREPARE ", "op1 AS SELECT 1", "EXECUTE ", "DECLARE oc1 CURSOR WITH HOLD FOR SELECT 1",
		"UPDATE pg_settings SET setting = '99kB' WHERE name = 'work_mem'", "oracle_fn_set('work_mem', '96kB')"}
	g := newOracleGen(42)
	for range 256 - len(toks) {
		toks = append(toks, g.statement())
	}
	return toks
}

// counts sums up the run so far in one line.
func (r *oracleRun) counts() string {
	misses, unexplained := 0, 0
	byCause := map[string]int{}
	for _, g := range r.gaps {
		if g.miss {
			misses++
			byCause[g.cause]++
			if g.cause == "" {
				unexplained++
			}
		}
	}
	causes := slices.Sorted(maps.Keys(byCause))
	for i, c := range causes {
		causes[i] = fmt.Sprintf("%s=%d", c, byCause[c])
	}
	return fmt.Sprintf("%d texts, %d answered with an error, %d unreadable states, %d sessions lost, %d misses (%d unexplained), %d kind gaps; misses by cause: %s",
		r.texts, r.errors, r.unreadable, r.lost, misses, unexplained, len(r.gaps)-misses, strings.Join(causes, ", "))
}

// report logs the run's numbers and findings by cause, and fails the test
// for every miss or kind gap (something was believed, but not every kind
// of state that grew) that no entry of pendingFixes, newFindings or
// oracleAllow explains.
func (r *oracleRun) report(t testing.TB, elapsed time.Duration) {
	t.Helper()
	type entry struct {
		n       int
		example oracleGap
	}
	byCause := map[string]*entry{}
	var keys []string
	var unexplained []oracleGap
	misses, kindGaps := 0, 0
	for _, g := range r.gaps {
		kind := "kind gap"
		if g.miss {
			kind = "miss"
			misses++
		} else {
			kindGaps++
		}
		key := fmt.Sprintf("%s [%s] %s", kind, strings.Join(g.kinds, ","), g.cause)
		if g.cause == "" {
			unexplained = append(unexplained, g)
		}
		e := byCause[key]
		if e == nil {
			e = &entry{example: g}
			byCause[key] = e
			keys = append(keys, key)
		}
		e.n++
	}
	sort.Strings(keys)
	t.Logf("oracle: %d texts, %d answered with an error, %d unreadable states, %d sessions lost, %d misses, %d kind gaps (%d unexplained), %v",
		r.texts, r.errors, r.unreadable, r.lost, misses, kindGaps, len(unexplained), elapsed.Round(time.Millisecond))
	for _, k := range keys {
		e := byCause[k]
		t.Logf("oracle: %6d × %s\n\twhy: %s\n\texample: %.400s\n\tadded: %q", e.n, k, e.example.why, e.example.texts(), e.example.added)
	}
	for i, g := range unexplained {
		if i == 20 {
			t.Errorf("oracle: … and %d more unexplained misses and kind gaps", len(unexplained)-20)
			break
		}
		what := "kind gap"
		if g.miss {
			what = "miss"
		}
		t.Errorf("oracle: unexplained %s: %.600s\n\tadded: %q", what, g.texts(), g.added)
	}
}

// TestOracleSeesState checks the oracle itself, whatever inspectSQL
// believes: each statement changes one kind of session state, and the
// state the oracle reads must show that kind grown; a plain statement must
// show nothing.
func TestOracleSeesState(t *testing.T) {
	c := oracleCluster(t, "postgres")
	r := newOracleRun(t, c, "postgres")
	setupGenerated(t, r)
	for _, tc := range []struct{ sql, kind string }{
		{"SELECT 1", ""},
		{"SET work_mem = '3MB'", "setting"},
		{"SELECT set_config('app.tenant_id', 't7', false)", "setting"},
		{"UPDATE pg_settings SET setting = '5' WHERE name = 'geqo_threshold'", "setting"},
		{"BEGIN; SET LOCAL work_mem = '5MB'; COMMIT", ""},
		{"BEGIN; SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; COMMIT", ""},
		{"SET ROLE oracle_r2", "identity"},
		{"SET SESSION AUTHORIZATION oracle_r2", "identity"},
		{"SELECT 1 AS a INTO pg_temp.seen", "temp"},
		{"CREATE FUNCTION pg_temp.seen() RETURNS int LANGUAGE sql AS 'SELECT 1'", "temp"},
		{"CREATE TYPE pg_temp.seen AS ENUM ('a')", "temp"},
		{"PREPARE seen AS SELECT 1", "prepared"},
		{"DECLARE seen CURSOR WITH HOLD FOR SELECT 1", "cursor"},
		{"LISTEN seen", "listen"},
		{"SELECT pg_advisory_lock(99)", "advisory"},
		{"SELECT pg_advisory_xact_lock(99)", ""},
	} {
		res, err := r.conn.exec("DISCARD ALL", nil, false)
		if err != nil || res.err != nil {
			t.Fatalf("DISCARD ALL: %v %v", err, res.err)
		}
		r.noteCustom(tc.sql, inspectSQL([]byte(tc.sql)))
		before, err := r.readState()
		if err != nil {
			t.Fatal(err)
		}
		if res, err = r.conn.exec(tc.sql, nil, false); err != nil || res.err != nil {
			t.Fatalf("%s: %v %v", tc.sql, err, res.err)
		}
		now, err := r.readState()
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, item := range grown(before, now, r.login) {
			kinds = append(kinds, stateKind(item))
		}
		switch {
		case tc.kind == "" && len(kinds) > 0:
			t.Errorf("%s: the oracle saw %q grow, want nothing", tc.sql, kinds)
		case tc.kind != "" && !slices.Contains(kinds, tc.kind):
			t.Errorf("%s: the oracle saw %q grow, want %s", tc.sql, kinds, tc.kind)
		}
	}
}
