package sqllex

import "testing"

// TestRoutineBodyHarmless: bodies that change nothing are harmless; any
// way of changing the session or the catalog, wherever PL/pgSQL puts it,
// is not.
func TestRoutineBodyHarmless(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{"SELECT 1", true},
		{"SELECT $1 + $2", true},
		{"BEGIN NEW.updated_at := now(); RETURN NEW; END", true},
		{"\nDECLARE\n  n int;\n  c CURSOR FOR SELECT 1;\nBEGIN\n  SELECT count(*) INTO n FROM t;\n  IF n > 0 THEN\n    UPDATE t SET a = a + 1 WHERE false;\n  END IF;\n  INSERT INTO log VALUES (TG_OP) ON CONFLICT DO NOTHING;\n  INSERT INTO log VALUES (TG_OP) ON CONFLICT (op) DO UPDATE SET op = 'x';\n  FOR r IN SELECT * FROM t LOOP\n    PERFORM 1;\n  END LOOP;\n  OPEN c; CLOSE c;\n  RETURN NEW;\nEXCEPTION WHEN others THEN\n  RAISE NOTICE 'x %', SQLERRM;\n  RETURN NULL;\nEND;\n", true},
		{"BEGIN UPDATE t AS x SET a = 1; RETURN NEW; END", true},
		{"BEGIN NOTIFY ch; RETURN NEW; END", true},

		{"BEGIN PERFORM set_config('a.b', 'c', false); RETURN NEW; END", false},
		{"BEGIN PERFORM pg_advisory_lock(1); RETURN NEW; END", false},
		{"BEGIN PERFORM my_func(); RETURN NEW; END", false},
		{"BEGIN PERFORM pg_catalog.query_to_xml('select 1', true, true, ''); RETURN NEW; END", false},
		{"BEGIN EXECUTE 'SELECT 1'; RETURN NEW; END", false},
		{"BEGIN RETURN QUERY EXECUTE 'SELECT 1'; END", false},
		{"BEGIN SET search_path = x; RETURN NEW; END", false},
		{"BEGIN IF true THEN SET work_mem = '1MB'; END IF; RETURN NEW; END", false},
		{"BEGIN IF true THEN NULL; ELSE SET role = x; END IF; END", false},
		{"BEGIN LOOP SET LOCAL a.b = 1; EXIT; END LOOP; END", false},
		{"BEGIN RETURN 1; EXCEPTION WHEN others THEN SET a.b = 1; RETURN 0; END", false},
		{"BEGIN <<l>> SET a.b = 1; END", false},
		{"SET search_path = x", false},
		{"SELECT 1; SET search_path = x", false},
		{"BEGIN LISTEN ch; END", false},
		{"BEGIN RESET ALL; END", false},
		{"BEGIN CREATE TEMP TABLE x (a int); END", false},
		{"BEGIN DROP TABLE x; END", false},
		{"BEGIN DO $$BEGIN NULL; END$$; END", false},
		{"BEGIN CALL p(); END", false},
		{"PREPARE p AS SELECT 1", false},
		{"DECLARE c CURSOR WITH HOLD FOR SELECT 1", false},
		{"BEGIN DISCARD ALL; END", false},
		{"BEGIN LOAD 'auto_explain'; END", false},
		{"BEGIN COPY t FROM '/tmp/x'; END", false},
		{"BEGIN ALTER TABLE t ADD b int; END", false},
		{"BEGIN RETURN 'unterminated; END", false},
		{`BEGIN x := 'a\'; SET search_path = y; --'; END`, false},
	} {
		if got := RoutineBodyHarmless(tc.body); got != tc.ok {
			t.Errorf("RoutineBodyHarmless(%q) = %v, want %v", tc.body, got, tc.ok)
		}
	}
	if n := testing.AllocsPerRun(100, func() { RoutineBodyHarmless("BEGIN NEW.updated_at := now(); RETURN NEW; END") }); n != 0 {
		t.Errorf("RoutineBodyHarmless allocates %v times", n)
	}
}

// FuzzRoutineBodyHarmless: no body crashes it, and a body holding SET at
// its start after any prefix ending a statement is never harmless.
func FuzzRoutineBodyHarmless(f *testing.F) {
	for _, s := range []string{"BEGIN RETURN NEW; END", "SELECT 1", "BEGIN UPDATE t SET a = 1; END", "DECLARE n int; BEGIN END"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		_ = RoutineBodyHarmless(body)
		if Classify(body).Flags&Unsure == 0 && RoutineBodyHarmless(body+"\n; SET search_path = evil") {
			t.Fatalf("%q followed by a SET is harmless", body)
		}
	})
}
