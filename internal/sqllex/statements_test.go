package sqllex

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// stmtWant is what one statement must look like: its text, flags, name and
// leading words (a quoted word is written with its quotes).
type stmtWant struct {
	text  string
	flags Flags
	name  string
	words string
}

func describe(sql string, st Stmt) stmtWant {
	var words []string
	for _, w := range st.Words() {
		if w.Quoted {
			words = append(words, `"`+w.Text+`"`)
		} else {
			words = append(words, w.Text)
		}
	}
	return stmtWant{sql[st.Start:st.End], st.Flags, st.Name, strings.Join(words, " ")}
}

func TestStatements(t *testing.T) {
	long := strings.Repeat("x", 70)
	cases := []struct {
		sql  string
		want []stmtWant
	}{
		{"", nil},
		{" ; -- c\n ; /* c */ ", nil},
		{"SELECT * FROM t WHERE id = $1", []stmtWant{{"SELECT * FROM t WHERE id = $1", 0, "", "select"}}},
		{"  BEGIN ;\n SET ROLE Bob;COMMIT  ", []stmtWant{
			{"BEGIN", Begin, "", "begin"},
			{"SET ROLE Bob", SetRole, "role", "set role bob"},
			{"COMMIT", Commit, "", "commit"},
		}},
		{"SET search_path TO public", []stmtWant{{"SET search_path TO public", SetParam, "search_path", "set search_path to public"}}},
		{`SET "MyApp".User_Id = 1`, []stmtWant{{`SET "MyApp".User_Id = 1`, SetParam, "MyApp.user_id", `set "MyApp"`}}},
		{"SET LOCAL statement_timeout = 0", []stmtWant{{"SET LOCAL statement_timeout = 0", SetParamLocal, "statement_timeout", "set local statement_timeout"}}},
		{"SET TIME ZONE 'UTC'", []stmtWant{{"SET TIME ZONE 'UTC'", SetParam, "timezone", "set time zone"}}},
		{"SET NAMES 'UTF8'", []stmtWant{{"SET NAMES 'UTF8'", SetParam, "client_encoding", "set names"}}},
		{"SET SCHEMA 'app'", []stmtWant{{"SET SCHEMA 'app'", SetParam, "search_path", "set schema"}}},
		{"SET XML OPTION content", []stmtWant{{"SET XML OPTION content", SetParam, "xmloption", "set xml option content"}}},
		{"SET SESSION AUTHORIZATION alice", []stmtWant{{"SET SESSION AUTHORIZATION alice", SetSessionAuth, "session_authorization", "set session authorization alice"}}},
		{`SET "Role" TO x`, []stmtWant{{`SET "Role" TO x`, SetRole, "role", `set "Role" to x`}}},
		{"RESET TIME ZONE", []stmtWant{{"RESET TIME ZONE", ResetParam, "timezone", "reset time zone"}}},
		{"RESET app.x", []stmtWant{{"RESET app.x", ResetParam, "app.x", "reset app"}}},
		{"RESET ALL", []stmtWant{{"RESET ALL", ResetAll, "", "reset all"}}},
		{"DEALLOCATE Stmt1", []stmtWant{{"DEALLOCATE Stmt1", Deallocate, "stmt1", "deallocate stmt1"}}},
		{`DEALLOCATE PREPARE "Stmt""1"`, []stmtWant{{`DEALLOCATE PREPARE "Stmt""1"`, Deallocate, `Stmt"1`, `deallocate prepare "Stmt"1"`}}},
		{"DEALLOCATE prepare", []stmtWant{{"DEALLOCATE prepare", Deallocate, "prepare", "deallocate prepare"}}},
		{"deallocate all", []stmtWant{{"deallocate all", Deallocate | DeallocateAll, "", "deallocate all"}}},
		{`DEALLOCATE U&"d\0061t"`, []stmtWant{{`DEALLOCATE U&"d\0061t"`, Deallocate, "dat", `deallocate "dat"`}}},
		{`DEALLOCATE U&"d!0061t" UESCAPE '!'`, []stmtWant{{`DEALLOCATE U&"d!0061t" UESCAPE '!'`, Deallocate, "dat", `deallocate "dat"`}}},
		{"DEALLOCATE " + long, []stmtWant{{"DEALLOCATE " + long, Deallocate, long[:63], "deallocate " + long[:63]}}},
		{`DEALLOCATE "` + strings.Repeat("é", 40) + `"`, []stmtWant{{`DEALLOCATE "` + strings.Repeat("é", 40) + `"`, Deallocate,
			strings.Repeat("é", 31), `deallocate "` + strings.Repeat("é", 31) + `"`}}},
		{"PREPARE Q1 (int) AS SELECT $1", []stmtWant{{"PREPARE Q1 (int) AS SELECT $1", Prepare, "q1", "prepare q1"}}},
		{"EXECUTE q1 (2)", []stmtWant{{"EXECUTE q1 (2)", Execute, "q1", "execute q1"}}},
		{"PREPARE TRANSACTION 'g''1'", []stmtWant{{"PREPARE TRANSACTION 'g''1'", PrepareTransaction, "g'1", "prepare transaction"}}},
		{"COMMIT PREPARED E'g\\x31'", []stmtWant{{"COMMIT PREPARED E'g\\x31'", CommitPrepared, "g1", "commit prepared"}}},
		{"ROLLBACK TO SAVEPOINT Sp", []stmtWant{{"ROLLBACK TO SAVEPOINT Sp", RollbackTo, "sp", "rollback to savepoint sp"}}},
		{"RELEASE savepoint", []stmtWant{{"RELEASE savepoint", Release, "savepoint", "release savepoint"}}},
		{"SAVEPOINT a", []stmtWant{{"SAVEPOINT a", Savepoint, "a", "savepoint a"}}},
		{"LISTEN Chan; UNLISTEN *; NOTIFY \"Chan\"", []stmtWant{
			{"LISTEN Chan", Listen, "chan", "listen chan"},
			{"UNLISTEN *", Unlisten, "*", "unlisten"},
			{`NOTIFY "Chan"`, Notify, "Chan", `notify "Chan"`},
		}},
		{"DECLARE Cur CURSOR WITH HOLD FOR SELECT 1", []stmtWant{{"DECLARE Cur CURSOR WITH HOLD FOR SELECT 1", DeclareCursor | DeclareHold, "cur", "declare cur cursor with hold for"}}},
		{"SELECT 1 /* a */ ; /* b */ SELECT 2 -- c", []stmtWant{
			{"SELECT 1", 0, "", "select"},
			{"SELECT 2", 0, "", "select"},
		}},
		{"SELECT 'x'; SELECT 'unterminated", []stmtWant{
			{"SELECT 'x'", 0, "", "select"},
			{"SELECT 'unterminated", Incomplete, "", "select"},
		}},
		{"SELECT 1; /* open", []stmtWant{
			{"SELECT 1", 0, "", "select"},
			{"/* open", Incomplete, "", ""},
		}},
		{"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END; END", []stmtWant{
			{"CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END", 0, "", "create function f"},
			{"END", Commit, "", "end"},
		}},
		{"SELECT '\\'; SET ROLE x; --'", []stmtWant{
			{"SELECT '\\'", Ambiguous, "", "select"},
			{"SET ROLE x", SetRole | Ambiguous, "role", "set role x"},
		}},
	}
	for _, tc := range cases {
		var got []stmtWant
		for st := range Statements(tc.sql) {
			st.Flags &^= SchemaChange // TestSchemaChange covers it
			got = append(got, describe(tc.sql, st))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("Statements(%q):\n got %s\nwant %s", tc.sql, fmtStmts(got), fmtStmts(tc.want))
		}
	}
}

func fmtStmts(s []stmtWant) string {
	var b strings.Builder
	for _, w := range s {
		fmt.Fprintf(&b, "\n  {%q %v name=%q words=%q}", w.text, w.flags, w.name, w.words)
	}
	return b.String()
}

func TestStatementsStopsWhenAsked(t *testing.T) {
	n := 0
	for range Statements("SELECT 1; SELECT 2; SELECT 3") {
		n++
		if n == 2 {
			break
		}
	}
	if n != 2 {
		t.Fatalf("iterated %d statements, want 2", n)
	}
}

func TestFlagsString(t *testing.T) {
	for f, want := range map[Flags]string{
		0:                               "0",
		SetRole:                         "SetRole",
		SetRoleLocal | Begin | Commit:   "SetRoleLocal|Begin|Commit",
		AdvisoryLock | Ambiguous:        "AdvisoryLock|Ambiguous",
		Flags(1) << 55:                  "ProcessState",
		Flags(1) << 63:                  "bit63",
		Incomplete | DeclareHold | Copy: "Copy|DeclareHold|Incomplete",
	} {
		if got := f.String(); got != want {
			t.Errorf("Flags(%#x).String() = %q, want %q", uint64(f), got, want)
		}
	}
}
