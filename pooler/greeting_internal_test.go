package pooler

import "testing"

// TestQuoteValue checks the literals set_config gets: ASCII values as plain
// literals, anything with a backslash or a byte outside ASCII as an escape
// string whose bytes no client_encoding conversion can touch.
func TestQuoteValue(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "''"},
		{"UTF8", "'UTF8'"},
		{"it's", "'it''s'"},
		{`a\b`, `E'a\\b'`},
		{"caf\u00e9", `E'caf\xc3\xa9'`},
		{"\xff'\\", `E'\xff''\\'`},
	} {
		if got := quoteValue(tc.in); got != tc.want {
			t.Errorf("quoteValue(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
