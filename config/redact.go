package config

import (
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Redacted is what a secret is shown as wherever pgquic prints a setting:
// the admin console's SHOW CONFIG, and log lines naming a backend URL.
const Redacted = "***"

// Redact returns value as it may be shown for the setting key (a YAML key,
// nested keys joined with a dot): every secret in it replaced by Redacted.
// It is the one place that decides what is secret, so every printer (SHOW
// CONFIG, start-up and reload logs) hides the same things:
//
//   - in a connection string (a postgres:// URL or a keyword/value string),
//     the password of the URL's user and every parameter whose name holds
//     "password", "secret", "passphrase" or "token" (password, sslpassword);
//   - the whole value of a key whose name holds one of those words, or
//     "key", unless the value is a file's path: a name ending in "_file",
//     "file" (auth.file), or tls_key, whose file holds the secret. A path is shown so an
//     operator can tell which file is in force; the file's contents (a
//     userlist, a private key) are never read for printing.
func Redact(key, value string) string {
	if value == "" {
		return value
	}
	if isConnString(value) {
		return RedactConnString(value)
	}
	name := strings.ToLower(key)
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		name = name[i+1:]
	}
	if isPathKey(name) {
		return value
	}
	if secretName(name) || strings.Contains(name, "key") {
		return Redacted
	}
	return value
}

// pathKeys are keys named like secrets whose value is a file's path.
var pathKeys = []string{"tls_key"}

// isPathKey reports whether a key's value is a file's path.
func isPathKey(name string) bool {
	return strings.HasSuffix(name, "file") || slices.Contains(pathKeys, name)
}

// secretName reports whether a setting or connection parameter of this
// name holds a secret itself: "password", "sslpassword", anything with
// "secret", "passphrase" or "token".
func secretName(name string) bool {
	name = strings.ToLower(name)
	for _, w := range []string{"password", "secret", "passphrase", "token"} {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// isConnString reports whether s looks like a PostgreSQL connection string:
// a postgres:// or postgresql:// URL, or keyword/value pairs naming a
// secret parameter.
func isConnString(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") || kvSecret.MatchString(s)
}

// kvSecret matches one secret parameter of a keyword/value connection
// string (libpq's "password=... sslpassword='...'"), value single-quoted
// with backslash escapes or bare up to the next blank.
var kvSecret = regexp.MustCompile(`(?i)(^|\s)([a-z_]*(?:password|secret|passphrase|token)[a-z_]*)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']\S*|'[^']*$)`)

// RedactConnString hides the secrets of a PostgreSQL connection string: a
// URL's user password and its secret query parameters (password,
// sslpassword...), or a keyword/value string's secret parameters. Other
// parameters, the host and the user stay, so an operator can still tell
// which server is meant. A URL that does not parse is replaced whole,
// since where its password ends cannot be known.
func RedactConnString(s string) string {
	if !strings.HasPrefix(s, "postgres://") && !strings.HasPrefix(s, "postgresql://") {
		return kvSecret.ReplaceAllString(s, "${1}${2}="+Redacted)
	}
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL, not shown)"
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Redacted)
		}
	}
	if u.RawQuery != "" {
		pairs := strings.Split(u.RawQuery, "&")
		for i, p := range pairs {
			rawName, _, _ := strings.Cut(p, "=")
			name, err := url.QueryUnescape(rawName)
			if err != nil || secretName(name) {
				pairs[i] = rawName + "=" + Redacted
			}
		}
		u.RawQuery = strings.Join(pairs, "&")
	}
	// url escapes the asterisks of a user password; show them as typed.
	return strings.Replace(u.String(), ":%2A%2A%2A@", ":"+Redacted+"@", 1)
}
