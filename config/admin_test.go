package config

import (
	"slices"
	"strings"
	"testing"
)

func TestAdminUsers(t *testing.T) {
	c, err := Load("testdata/admin/comma.good.yml")
	if err != nil {
		t.Fatal(err)
	}
	if want := (UserList{"admin", "ops", "monitor"}); !slices.Equal(c.AdminUsers, want) {
		t.Errorf("admin_users = %q, want %q", c.AdminUsers, want)
	}
	for file, subs := range map[string][]string{
		"bad-name.bad.yml": {`admin_users[1]: "two words" is not a user name`, `admin_users[2]: "" is not a user name`},
		"console-route.bad.yml": {`databases[0].name: "pgbouncer" is the admin console's database`,
			`databases[1].name: "pgquic" is the admin console's database`},
		"wrong-type.bad.yml": {"want a list of user names or a comma-separated string"},
	} {
		_, err := Load("testdata/admin/" + file)
		if err == nil {
			t.Errorf("%s: loaded", file)
			continue
		}
		for _, s := range subs {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q\nlacks %q", file, err, s)
			}
		}
	}
	if got := ParseUserList(" a,, b ,"); !slices.Equal(got, UserList{"a", "b"}) {
		t.Errorf("ParseUserList = %q", got)
	}
}

func TestSettings(t *testing.T) {
	c := Default()
	c.Backend = "postgres://app:secret@db:5432/app"
	c.AdminUsers = UserList{"admin", "ops"}
	c.PoolSize = 7
	got := map[string]Setting{}
	for _, s := range c.Settings() {
		got[s.Key] = s
	}
	checks := map[string][2]string{
		"pool_size":          {"7", "20"},
		"admin_users":        {"admin,ops", ""},
		"auth.method":        {"trust", "trust"},
		"query_wait_timeout": {"30s", "30s"},
		"require_tls":        {"false", "false"},
	}
	for k, want := range checks {
		s, ok := got[k]
		if !ok || s.Value != want[0] || s.Default != want[1] {
			t.Errorf("setting %s = %+v, want value %q default %q", k, s, want[0], want[1])
		}
	}
	if b := got["backend"].Value; strings.Contains(b, "secret") || !strings.Contains(b, "db:5432") {
		t.Errorf("backend shown as %q: password not masked", b)
	}
	for _, k := range []string{"databases", "acquire_timeout"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s listed in settings", k)
		}
	}
}
