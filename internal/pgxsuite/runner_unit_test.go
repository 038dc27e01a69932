package pgxsuite_test

import (
	"strings"
	"testing"
)

// TestNormalizeTestName: subtests named after a t.TempDir() path compare
// across runs; other names are left alone.
func TestNormalizeTestName(t *testing.T) {
	for in, want := range map[string]string{
		"TestParseConfigSSLCertMode/servicefile='/tmp/TestParseConfigSSLCertMode3794260716/001/pg_service.conf'_service=test": "TestParseConfigSSLCertMode/servicefile='/tmp/TestParseConfigSSLCertModeTMP/001/pg_service.conf'_service=test",
		"TestNumericBinaryEncode/131068":  "TestNumericBinaryEncode/131068",
		"TestConnStress":                  "TestConnStress",
		"TestQuery/1234567/with_a_number": "TestQuery/1234567/with_a_number",
	} {
		if got := normalizeTestName(in); got != want {
			t.Errorf("normalizeTestName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestParseEventsUnfinished: a test that started but never ended counts as
// failed and is listed as unfinished; a package's counts say so.
func TestParseEventsUnfinished(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"run","Package":"github.com/jackc/pgx/v5","Test":"TestA"}`,
		`{"Action":"pass","Package":"github.com/jackc/pgx/v5","Test":"TestA"}`,
		`{"Action":"run","Package":"github.com/jackc/pgx/v5","Test":"TestHangs"}`,
		`{"Action":"run","Package":"github.com/jackc/pgx/v5","Test":"TestB"}`,
		`{"Action":"fail","Package":"github.com/jackc/pgx/v5","Test":"TestB"}`,
		`{"Action":"fail","Package":"github.com/jackc/pgx/v5"}`,
		`not json: build output`,
	}, "\n")
	res := parseEvents(strings.NewReader(stream))
	hang := testKey{pgxModulePath, "TestHangs"}
	if res.Tests[hang] != "fail" || !res.Unfinished[hang] {
		t.Fatalf("TestHangs: %q, unfinished %v", res.Tests[hang], res.Unfinished[hang])
	}
	if res.Unfinished[testKey{pgxModulePath, "TestB"}] {
		t.Fatal("TestB ended; it is not unfinished")
	}
	c := res.byPackage()[pgxModulePath]
	if c.Pass != 1 || c.Fail != 1 || c.Unfinished != 1 || c.Result != "fail" {
		t.Fatalf("package counts: %+v", c)
	}
	if !strings.Contains(res.BuildErrors, "build output") {
		t.Fatalf("build output lost: %q", res.BuildErrors)
	}
}
