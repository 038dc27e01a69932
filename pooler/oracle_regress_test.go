package pooler

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/internal/sqllex"
)

// regressDirEnv names the directory of PostgreSQL's regression suite
// (src/test/regress of the server's version: sql/, data/,
// parallel_schedule) that TestOracleRegress runs. The suite is not part of
// this repository; .ci/run sets the variable when a copy is at hand.
const regressDirEnv = "PGQUIC_PG_REGRESS_DIR"

// psqlItem is one statement of a psql script as psql would send it, with
// the data of a COPY FROM STDIN, or a request to connect again (\c).
type psqlItem struct {
	sql       string
	copyData  []byte
	reconnect bool
}

var (
	psqlVarRef  = regexp.MustCompile(`:'(\w+)'|:"(\w+)"|(^|[^:]):(\w+)`)
	psqlSetArg  = regexp.MustCompile(`:'(\w+)'|:(\w+)|'((?:[^']|'')*)'|(\S+)`)
	copyFromStd = regexp.MustCompile(`(?is)\bfrom\s+stdin\b`)
	psqlSendCmd = map[string]bool{"g": true, "gset": true, "gx": true, "gexec": true, "gdesc": true, "crosstabview": true}
)

// splitPsql splits a psql script into the statements psql would send, one
// per semicolon, as sqllex.Statements reads them. Meta-commands (lines
// starting with a backslash, or a backslash after a statement) are skipped,
// except \set and \getenv, whose variables are interpolated (:'v', :"v",
// :v) as psql does, \g and its kin, which send the statement typed so far,
// \r, which discards it, and \c, which becomes a reconnect. \if is not
// evaluated: both branches run. env answers \getenv.
func splitPsql(src string, env map[string]string) []psqlItem {
	vars := map[string]string{}
	var items []psqlItem
	var buf strings.Builder
	copying := -1 // index of the COPY FROM STDIN item taking data lines
	var data strings.Builder

	emit := func(all bool) {
		text := buf.String()
		if !all {
			// Complete only when a sentinel after the text starts a
			// statement of its own: nothing is left open.
			probe := text + "\nx"
			last := sqllex.Stmt{}
			for st := range sqllex.Statements(probe) {
				last = st
			}
			if last.Start != len(text)+1 || last.Flags&sqllex.Incomplete != 0 {
				return
			}
		}
		for st := range sqllex.Statements(text) {
			s := text[st.Start:st.End]
			items = append(items, psqlItem{sql: s})
			if st.Flags&sqllex.Copy != 0 && copyFromStd.MatchString(s) {
				copying = len(items) - 1
			}
		}
		buf.Reset()
	}
	meta := func(cmd string) {
		fields := strings.Fields(cmd)
		if len(fields) == 0 {
			return
		}
		name := strings.TrimPrefix(fields[0], `\`)
		switch {
		case psqlSendCmd[name]:
			emit(true)
		case name == "r" || name == "reset":
			buf.Reset()
		case name == "c" || name == "connect":
			emit(true)
			items = append(items, psqlItem{reconnect: true})
		case name == "getenv" && len(fields) == 3:
			if v, ok := env[fields[2]]; ok {
				vars[fields[1]] = v
			}
		case name == "set" && len(fields) >= 2:
			rest := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(strings.TrimPrefix(cmd, fields[0])), fields[1]))
			var v strings.Builder
			for _, m := range psqlSetArg.FindAllStringSubmatch(rest, -1) {
				switch {
				case m[1] != "":
					v.WriteString(vars[m[1]])
				case m[2] != "":
					v.WriteString(vars[m[2]])
				case strings.HasPrefix(m[0], "'"):
					v.WriteString(strings.ReplaceAll(m[3], "''", "'"))
				default:
					v.WriteString(m[4])
				}
			}
			vars[fields[1]] = v.String()
		}
	}
	interpolate := func(line string) string {
		return psqlVarRef.ReplaceAllStringFunc(line, func(m string) string {
			sm := psqlVarRef.FindStringSubmatch(m)
			switch {
			case sm[1] != "":
				if v, ok := vars[sm[1]]; ok {
					return "'" + strings.ReplaceAll(v, "'", "''") + "'"
				}
			case sm[2] != "":
				if v, ok := vars[sm[2]]; ok {
					return `"` + strings.ReplaceAll(v, `"`, `""`) + `"`
				}
			default:
				if v, ok := vars[sm[4]]; ok {
					return sm[3] + v
				}
			}
			return m
		})
	}
	sc := bufio.NewScanner(strings.NewReader(src))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if copying >= 0 {
			if line == `\.` {
				items[copying].copyData = []byte(data.String())
				data.Reset()
				copying = -1
			} else {
				data.WriteString(line + "\n")
			}
			continue
		}
		// A backslash outside quotes, comments and dollar quotes starts a
		// meta-command that runs to the end of the line.
		if i := metaStart(buf.String(), line); i >= 0 {
			sqlPart := line[:i]
			if strings.TrimSpace(sqlPart) != "" {
				buf.WriteString(interpolate(sqlPart) + "\n")
			}
			meta(line[i:])
			if buf.Len() > 0 {
				emit(false)
			}
			continue
		}
		buf.WriteString(interpolate(line) + "\n")
		emit(false)
	}
	if strings.TrimSpace(buf.String()) != "" {
		emit(true)
	}
	return items
}

// metaStart returns where a meta-command begins in line, typed after the
// pending text before, or -1 when the line holds none.
func metaStart(before, line string) int {
	for i := 0; i < len(line); i++ {
		if line[i] != '\\' {
			continue
		}
		last := sqllex.Stmt{}
		probe := before + line[:i] + " x"
		for st := range sqllex.Statements(probe) {
			last = st
		}
		if last.Flags&sqllex.Incomplete == 0 {
			return i
		}
	}
	return -1
}

// regressSchedule returns the test names of parallel_schedule in order.
func regressSchedule(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "parallel_schedule"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "test:"); ok {
			names = append(names, strings.Fields(rest)...)
		}
	}
	return names
}

// TestOracleRegress runs PostgreSQL's own regression suite through the
// oracle: every file of parallel_schedule in order, in one database as
// pg_regress does, each file in a new session, each statement as psql
// would send it. Statements fail where the suite needs its C library
// (regress.so) or psql's output; errors are part of the corpus.
func TestOracleRegress(t *testing.T) {
	dir := os.Getenv(regressDirEnv)
	if dir == "" {
		t.Skip(regressDirEnv + " is not set: it names a copy of PostgreSQL's src/test/regress (sql/, data/, parallel_schedule)")
	}
	if _, err := os.Stat(filepath.Join(dir, "parallel_schedule")); err != nil {
		dir = filepath.Dir(dir) // the sql/ directory itself was given
	}
	names := regressSchedule(t, dir)
	c := oracleCluster(t, "regression")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Exec(ctx, `ALTER DATABASE regression SET lc_messages TO 'C';
		ALTER DATABASE regression SET lc_monetary TO 'C'; ALTER DATABASE regression SET lc_numeric TO 'C';
		ALTER DATABASE regression SET lc_time TO 'C'; ALTER DATABASE regression SET bytea_output TO 'hex';
		ALTER DATABASE regression SET timezone_abbreviations TO 'Default'`); err != nil {
		t.Fatal(err)
	}
	build, err := os.MkdirTemp("", "oracle-regress-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(build) })
	// The server, running as another user, writes COPY TO files there.
	for _, d := range []string{build, filepath.Join(build, "results")} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	bin, err := pgtest.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"PG_ABS_SRCDIR":   dir,
		"PG_ABS_BUILDDIR": build,
		"PG_LIBDIR":       filepath.Join(filepath.Dir(bin), "lib"),
		"PG_DLSUFFIX":     ".so",
	}
	r := newOracleRun(t, c, "regression")
	r.param["datestyle"] = "Postgres, MDY"
	r.param["timezone"] = "PST8PDT"
	start := time.Now()
	for _, name := range names {
		src, err := os.ReadFile(filepath.Join(dir, "sql", name+".sql"))
		if err != nil {
			t.Logf("oracle: %s: %v", name, err)
			continue
		}
		r.restart()
		before := len(r.gaps)
		for _, it := range splitPsql(string(src), env) {
			if it.reconnect {
				r.finish()
				r.restart()
				continue
			}
			r.run(it.sql, it.copyData)
		}
		r.finish()
		if n := len(r.gaps) - before; n > 0 {
			t.Logf("oracle: %s: %d gaps", name, n)
		}
	}
	r.report(t, time.Since(start))
}

// TestSplitPsql checks that psql scripts split as psql sends them: one
// statement per semicolon, meta-commands skipped or obeyed, variables
// interpolated, COPY data attached, and backslashes inside strings and
// dollar quotes left alone.
func TestSplitPsql(t *testing.T) {
	src := `-- a comment; not a statement
\getenv abs_srcdir PG_ABS_SRCDIR
\set filename :abs_srcdir '/data/x.data'
SELECT 1; SELECT 2
  + 3;
\pset null '(null)'
COPY t FROM :'filename';
COPY t (a) FROM stdin;
1
2
\.
SELECT E'a\\b', $$ \d $$ AS x;
SELECT 'unterminated \gset' AS y \gset
CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
  RETURN 1; -- \c ignored here
END $$;
\c - other
SELECT :"filename" FROM t WHERE a::text = 'b'
\g
`
	got := splitPsql(src, map[string]string{"PG_ABS_SRCDIR": "/src"})
	want := []psqlItem{
		{sql: "SELECT 1"},
		{sql: "SELECT 2\n  + 3"},
		{sql: "COPY t FROM '/src/data/x.data'"},
		{sql: "COPY t (a) FROM stdin", copyData: []byte("1\n2\n")},
		{sql: `SELECT E'a\\b', $$ \d $$ AS x`},
		{sql: "SELECT 'unterminated \\gset' AS y"},
		{sql: "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$\nBEGIN\n  RETURN 1; -- \\c ignored here\nEND $$"},
		{reconnect: true},
		{sql: `SELECT "/src/data/x.data" FROM t WHERE a::text = 'b'`},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d items, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].sql != want[i].sql || string(got[i].copyData) != string(want[i].copyData) || got[i].reconnect != want[i].reconnect {
			t.Errorf("item %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
