package config

import (
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	for _, tc := range []struct {
		key, value, want string
	}{
		{"backend", "postgres://app:hunter2@db:5432/app", "postgres://app:***@db:5432/app"},
		{"backend", "postgres://app@db/app?password=hunter2", "postgres://app@db/app?password=***"},
		{"backend", "postgresql://db/app?sslmode=verify-full&sslpassword=hunter2&sslkey=/etc/k.pem",
			"postgresql://db/app?sslmode=verify-full&sslpassword=***&sslkey=/etc/k.pem"},
		{"backend", "postgres://u:p%40ss@db/app?PassWord=hunter2&application_name=x",
			"postgres://u:***@db/app?PassWord=***&application_name=x"},
		{"backend", "postgres://db/app?pass%77ord=hunter2", "postgres://db/app?pass%77ord=***"},
		{"backend", "postgres://u:p@[::1/app", "(unparsable URL, not shown)"},
		{"backend", "postgres://u@db/app", "postgres://u@db/app"},
		{"databases[0].backend", "host=db password='hun ter2' user=u sslpassword=x", "host=db password=*** user=u sslpassword=***"},
		{"auth.file", "/etc/pgquic/userlist.txt", "/etc/pgquic/userlist.txt"},
		{"tls_key", "/etc/pgquic/key.pem", "/etc/pgquic/key.pem"},
		{"tls_session_ticket_keys_file", "/etc/pgquic/tickets", "/etc/pgquic/tickets"},
		{"quic_stateless_reset_key_file", "/etc/pgquic/reset", "/etc/pgquic/reset"},
		{"auth.query_password", "hunter2", Redacted},
		{"tls_key_passphrase", "hunter2", Redacted},
		{"some_secret", "hunter2", Redacted},
		{"api_key", "hunter2", Redacted},
		{"tls_key_passphrase", "", ""},
		{"mode", "transaction", "transaction"},
	} {
		if got := Redact(tc.key, tc.value); got != tc.want {
			t.Errorf("Redact(%q, %q) = %q, want %q", tc.key, tc.value, got, tc.want)
		}
		if got := Redact(tc.key, Redact(tc.key, tc.value)); got != tc.want {
			t.Errorf("Redact(%q) twice = %q, want %q", tc.key, got, tc.want)
		}
	}
}

// TestSettingsHideSecrets: SHOW CONFIG's rows never carry a backend
// password, whether in the URL's user part or in its query.
func TestSettingsHideSecrets(t *testing.T) {
	c := Default()
	c.Backend = "postgres://app:userinfo-secret@db:5432/app?password=query-secret&sslpassword=ssl-secret&sslmode=require"
	for _, s := range c.Settings() {
		for _, secret := range []string{"userinfo-secret", "query-secret", "ssl-secret"} {
			if strings.Contains(s.Value, secret) || strings.Contains(s.Default, secret) {
				t.Errorf("setting %s shows %q", s.Key, s.Value)
			}
		}
		if s.Key == "backend" && !strings.Contains(s.Value, "db:5432") {
			t.Errorf("backend shown as %q: the host should stay", s.Value)
		}
	}
}
