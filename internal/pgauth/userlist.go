package pgauth

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// maxUserlistLine bounds one line of an auth_file. SCRAM verifiers are about
// 130 bytes; the cap only stops a wrong file (a binary, say) from being read
// into memory as a single line.
const maxUserlistLine = 64 << 10

// ErrUserlistSyntax reports a malformed auth_file line. The error that wraps
// it names the line number.
var ErrUserlistSyntax = errors.New("userlist syntax error")

// Userlist maps user names to their secrets. It is read once and then only
// looked up, so it is safe for concurrent use.
type Userlist struct {
	users map[string]Secret
}

// NewUserlist builds a Userlist from already parsed secrets, for callers that
// keep credentials somewhere other than an auth_file.
func NewUserlist(secrets map[string]Secret) *Userlist {
	u := &Userlist{users: make(map[string]Secret, len(secrets))}
	for name, s := range secrets {
		u.users[name] = s
	}
	return u
}

// Lookup returns the secret stored for user.
func (u *Userlist) Lookup(user string) (Secret, bool) {
	if u == nil {
		return Secret{}, false
	}
	s, ok := u.users[user]
	return s, ok
}

// Len returns the number of users, for logs at startup.
func (u *Userlist) Len() int {
	if u == nil {
		return 0
	}
	return len(u.users)
}

// Users returns the user names in sorted order, for diagnostics.
func (u *Userlist) Users() []string {
	if u == nil {
		return nil
	}
	names := make([]string, 0, len(u.users))
	for n := range u.users {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LoadUserlist reads a PgBouncer-style auth_file from path; see
// ParseUserlist for the format.
func LoadUserlist(path string) (*Userlist, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open userlist: %w", err)
	}
	defer f.Close()
	u, err := ParseUserlist(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return u, nil
}

// ParseUserlist reads PgBouncer's auth_file format, so existing userlist.txt
// files work unchanged. Each line holds two double-quoted fields, the user
// name and its secret (see ParseSecret), separated by white space; a doubled
// quote ("") inside a field stands for one quote character. Anything after
// the secret, separated by white space, is ignored as PgBouncer does (old
// pg_auth files carry a third column). Blank lines and lines whose first
// non-blank character is ';' or '#' are comments. Unlike PgBouncer, which
// logs and skips bad lines, any malformed line, empty user name or repeated
// user is an error naming the line, so a typo cannot silently lock a user
// out.
func ParseUserlist(r io.Reader) (*Userlist, error) {
	u := &Userlist{users: make(map[string]Secret)}
	seen := make(map[string]int)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxUserlistLine)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimRight(sc.Text(), "\r")
		trimmed := strings.TrimLeft(line, " \t")
		if trimmed == "" || trimmed[0] == ';' || trimmed[0] == '#' {
			continue
		}
		user, secret, err := parseUserlistLine(trimmed)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", lineNo, err)
		}
		if prev, dup := seen[user]; dup {
			return nil, fmt.Errorf("line %d: %w: user %q already defined on line %d", lineNo, ErrUserlistSyntax, user, prev)
		}
		s, err := ParseSecret(user, secret)
		if err != nil {
			return nil, fmt.Errorf("line %d: user %q: %w", lineNo, user, err)
		}
		seen[user] = lineNo
		u.users[user] = s
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: %w: line longer than %d bytes", lineNo+1, ErrUserlistSyntax, maxUserlistLine)
		}
		return nil, fmt.Errorf("read userlist: %w", err)
	}
	return u, nil
}

// parseUserlistLine splits one non-comment line into user and secret.
func parseUserlistLine(line string) (user, secret string, err error) {
	user, rest, err := quotedField(line)
	if err != nil {
		return "", "", fmt.Errorf("user name: %w", err)
	}
	if user == "" {
		return "", "", fmt.Errorf("%w: empty user name", ErrUserlistSyntax)
	}
	trimmed := strings.TrimLeft(rest, " \t")
	if trimmed == rest && rest != "" {
		return "", "", fmt.Errorf("%w: want white space after the user name", ErrUserlistSyntax)
	}
	if trimmed == "" {
		return "", "", fmt.Errorf("%w: missing secret after user %q", ErrUserlistSyntax, user)
	}
	secret, rest, err = quotedField(trimmed)
	if err != nil {
		return "", "", fmt.Errorf("secret for user %q: %w", user, err)
	}
	if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
		return "", "", fmt.Errorf("%w: unexpected text after the secret for user %q", ErrUserlistSyntax, user)
	}
	return user, secret, nil
}

// quotedField reads a double-quoted field at the start of s, where "" is an
// escaped quote, and returns its value and what follows the closing quote.
func quotedField(s string) (value, rest string, err error) {
	if s == "" || s[0] != '"' {
		return "", "", fmt.Errorf("%w: field must start with a double quote", ErrUserlistSyntax)
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] != '"' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '"' {
			b.WriteByte('"')
			i++
			continue
		}
		return b.String(), s[i+1:], nil
	}
	return "", "", fmt.Errorf("%w: missing closing double quote", ErrUserlistSyntax)
}
