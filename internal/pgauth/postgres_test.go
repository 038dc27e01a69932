package pgauth

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgquic/pgquic/internal/pgtest"
)

// TestLivePostgresVerifiers checks compatibility both ways with a real
// PostgreSQL server: secrets PostgreSQL stores authenticate pgx through this
// package, and a verifier from SCRAMVerifier, installed into PostgreSQL,
// lets pgx log in to PostgreSQL itself.
func TestLivePostgresVerifiers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	c := pgtest.New(t, pgtest.Options{Auth: pgtest.AuthSCRAM})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	ours, err := SCRAMVerifier("ours-pw", 0)
	if err != nil {
		t.Fatal(err)
	}
	setup := `SET password_encryption = 'scram-sha-256';
CREATE ROLE u LOGIN PASSWORD 'pw';
CREATE ROLE "ünïcode user" LOGIN PASSWORD 'pässwörd';
SET password_encryption = 'md5';
CREATE ROLE m LOGIN PASSWORD 'md5-pw';
CREATE ROLE ours LOGIN PASSWORD '` + ours + `';`
	if err := c.Exec(ctx, setup); err != nil {
		t.Fatal(err)
	}

	// Read the stored secrets back as the superuser.
	conn, err := pgconn.Connect(ctx, c.SuperURL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	res := conn.ExecParams(ctx, `SELECT rolname, rolpassword FROM pg_authid WHERE rolname IN ('u', 'ünïcode user', 'm', 'ours') ORDER BY 1`, nil, nil, nil, nil).Read()
	_ = conn.Close(ctx)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	var lines strings.Builder
	for _, row := range res.Rows {
		fmt.Fprintf(&lines, "%q %q\n", row[0], row[1])
	}
	// %q is Go quoting, not auth_file quoting; none of these names or
	// secrets holds a quote or backslash, so the two agree here.
	users, err := ParseUserlist(strings.NewReader(lines.String()))
	if err != nil {
		t.Fatalf("userlist from pg_authid:\n%s\n%v", lines.String(), err)
	}
	if s, _ := users.Lookup("ours"); s.scram.String() != ours {
		t.Errorf("PostgreSQL stored our verifier as %v, want it unchanged", s)
	}

	a, err := New(Config{Method: MethodMD5, Users: users})
	if err != nil {
		t.Fatal(err)
	}
	for user, pw := range map[string]string{"u": "pw", "ünïcode user": "pässwörd", "m": "md5-pw", "ours": "ours-pw"} {
		if r := connectPgconn(t, a, user, pw, nil); r.clientErr != nil || r.server.err != nil {
			t.Errorf("%s via pgquic: client %v, server %v", user, r.clientErr, r.server.err)
		}
		if r := connectPgconn(t, a, user, pw+"!", nil); r.clientErr == nil {
			t.Errorf("%s via pgquic: wrong password accepted", user)
		}
	}

	// Our verifier works in PostgreSQL itself.
	pc, err := pgconn.Connect(ctx, c.URL("ours", "ours-pw", "postgres"))
	if err != nil {
		t.Fatalf("PostgreSQL rejected a SCRAMVerifier verifier: %v\n%s", err, c.LogTail())
	}
	_ = pc.Close(ctx)
}
