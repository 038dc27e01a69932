package pooler

import (
	"testing"

	"github.com/pgquic/pgquic/pooler/hiddencode"
)

// TestInspectSQLFailsClosed checks what inspectSQL says of the texts that
// once leaked session state: each may change something (identity,
// parameters, held state or anything at all), and none may share a server
// connection with other clients' requests.
func TestInspectSQLFailsClosed(t *testing.T) {
	for _, tc := range []struct {
		sql       string
		identity  bool // an identity change outside a block
		paramsAll bool // parameters nobody can name
		holds     bool
		opaque    bool
	}{
		// paramsAll: a session-level set_config (a local one would not set it).
		{sql: "SELECT set_config('search_path', 'evil', true::boolean AND false)", paramsAll: true},
		{sql: "SELECT set_config('ro'::text || 'le', 'r2', false)", identity: true, paramsAll: true},
		{sql: "SELECT pg_catalog.set_config($1, $2, false)", identity: true, paramsAll: true},
		{sql: "UPDATE pg_settings SET setting = 'evil' WHERE name = 'search_path'", identity: true, paramsAll: true},
		{sql: "WITH x AS (SELECT 1) UPDATE ONLY pg_catalog.pg_settings SET setting = 'x'", identity: true, paramsAll: true},
		// DDL: its parameters are read back too, for an event trigger may
		// have set any.
		{sql: "SELECT 1 INTO pg_temp.leak", holds: true, opaque: true, paramsAll: true},
		{sql: "SELECT * INTO TABLE \"pg_temp\".leak FROM t", holds: true, opaque: true, paramsAll: true},
		// Temporary when search_path lists pg_temp first: the probe asks.
		{sql: "SELECT 1 INTO leak", opaque: true, paramsAll: true},
		{sql: "CREATE TABLE leak (a int)", opaque: true, paramsAll: true},
		{sql: "SELECT my_func(1)", paramsAll: true, opaque: true},
		{sql: "SELECT * FROM t WHERE app.allowed(id)", paramsAll: true, opaque: true},
		{sql: "DO $$BEGIN NULL; END$$", paramsAll: true, opaque: true},
		{sql: "CALL p()", paramsAll: true, opaque: true},
		{sql: "SELECT pg_terminate_backend(pg_backend_pid())"},
	} {
		info := inspectSQL([]byte(tc.sql))
		switch {
		case info.pipe || pipeSafeSQL([]byte(tc.sql)):
			t.Errorf("%q may share a server connection", tc.sql)
		case (info.identity && info.outside) != tc.identity:
			t.Errorf("%q: identity change %v (outside %v), want %v", tc.sql, info.identity, info.outside, tc.identity)
		case info.paramsAll != tc.paramsAll:
			t.Errorf("%q: paramsAll %v, want %v", tc.sql, info.paramsAll, tc.paramsAll)
		case (info.pins.Holds != 0) != tc.holds:
			t.Errorf("%q: holds %v, want %v", tc.sql, info.pins.Holds, tc.holds)
		case info.pins.Opaque != tc.opaque:
			t.Errorf("%q: opaque %v, want %v", tc.sql, info.pins.Opaque, tc.opaque)
		}
	}
	if info := inspectSQL([]byte("SELECT set_config('search_path', 'x', 't'::boolean)")); info.paramsAll || info.identity {
		t.Errorf("a transaction-local set_config: %+v", info)
	}
	for _, sql := range []string{"SELECT now(), lower(a), coalesce(b, 1) FROM t", "INSERT INTO t (a) VALUES ($1)"} {
		if info := inspectSQL([]byte(sql)); !info.pipe || info.paramsAll || info.pins.Opaque {
			t.Errorf("%q: %+v, want plain", sql, info)
		}
	}
}

// TestScanBatchRefusesFunctionCall: a FunctionCall message never shares a
// server connection, nor does a request calling pg_terminate_backend.
func TestScanBatchRefusesFunctionCall(t *testing.T) {
	fcall := msg('F', "\x00\x00\x08\x1e", "\x00\x00", "\x00\x00", "\x00\x00")
	for name, req := range map[string][]byte{
		"FunctionCall":           cat(fcall),
		"Query terminate":        query("SELECT pg_terminate_backend(pg_backend_pid())"),
		"Parse terminate":        cat(parse("", "SELECT pg_catalog.pg_terminate_backend($1)"), bindU, exec0, sync5),
		"Query opaque":           query("SELECT my_func(1)"),
		"Query SELECT INTO temp": query("SELECT 1 INTO pg_temp.leak"),
	} {
		typ, body, rest := split(req)
		if _, ok := scanBatch(typ, body, rest, nil, nil, nil, hiddencode.None); ok {
			t.Errorf("%s qualifies for a shared server connection", name)
		}
	}
}
