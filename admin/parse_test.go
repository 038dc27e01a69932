package admin

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		q, cmd, arg string
		bad         bool
	}{
		{"SHOW POOLS", "show", "POOLS", false},
		{"  show pools ;; ", "show", "pools", false},
		{`PAUSE "my_db"`, "pause", "my_db", false},
		{"RESUME", "resume", "", false},
		{"", "", "", false},
		{" ; ", "", "", false},
		{"SHOW POOLS x", "", "", true},
		{`PAUSE "a b"`, "", "", true},
		{`PAUSE "a"b"`, "", "", true},
		{"PAUSE a-b", "", "", true},
		{"SHOW " + strings.Repeat("p", 65), "", "", true},
		{"ÜBER", "", "", true},
	}
	for _, tc := range tests {
		cmd, arg, err := parse(tc.q)
		if (err != nil) != tc.bad || cmd != tc.cmd || arg != tc.arg {
			t.Errorf("parse(%q) = %q, %q, %v", tc.q, cmd, arg, err)
		}
	}
}

// FuzzParse feeds arbitrary query text to the command parser: it must not
// panic, and what it accepts is a lower-case word with an argument of at
// most 64 bytes free of quotes and blanks.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"SHOW POOLS", `PAUSE "db"`, "kill x;", " ; ", "\x00", `"`, `SHOW ""`, "SET a = 'b'"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		cmd, arg, err := parse(q)
		if err != nil {
			return
		}
		if cmd != strings.ToLower(cmd) || (cmd == "" && arg != "") || (cmd != "" && !isWord(cmd)) {
			t.Fatalf("parse(%q) accepted command %q", q, cmd)
		}
		if len(arg) > maxArg || strings.ContainsAny(arg, "\" \t\n;") {
			t.Fatalf("parse(%q) accepted argument %q", q, arg)
		}
	})
}
