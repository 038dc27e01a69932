package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// The admin console's virtual databases: clients that ask for them reach
// the console, never a server, so no route may use these names.
const (
	AdminDatabase = "pgquic"
	AdminAlias    = "pgbouncer"
)

// UserList is a list of user names, written in YAML as a list or, as
// PgBouncer writes admin_users, as one comma-separated string.
type UserList []string

// UnmarshalYAML accepts a sequence of names or a comma-separated scalar.
func (l *UserList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*l = ParseUserList(n.Value)
		return nil
	case yaml.SequenceNode:
		var names []string
		if err := n.Decode(&names); err != nil {
			return err
		}
		*l = names
		return nil
	}
	return fmt.Errorf("line %d: want a list of user names or a comma-separated string", n.Line)
}

// ParseUserList splits a comma-separated list of user names, dropping
// blanks around them and empty entries, as the --admin-users flag is given.
func ParseUserList(s string) UserList {
	var out UserList
	for _, u := range strings.Split(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// Setting is one configuration value as the admin console's SHOW CONFIG
// lists it.
type Setting struct {
	// Key is the YAML key; nested keys are joined with a dot (auth.method).
	Key string
	// Value is the value in force and Default the built-in default, both
	// as text, with every secret replaced by Redacted (see Redact).
	Value, Default string
}

// Settings lists every top-level and auth setting with its value and
// default, in the order of the Config struct. The databases list is left
// out (SHOW DATABASES shows the routes), and so are old key names kept for
// compatibility (fields named Legacy...), whose value is in the new key.
func (c *Config) Settings() []Setting {
	var out []Setting
	walkSettings(reflect.ValueOf(*c), reflect.ValueOf(*Default()), "", &out)
	return out
}

func walkSettings(v, d reflect.Value, prefix string, out *[]Setting) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if key == "" || key == "-" || key == "databases" || strings.HasPrefix(f.Name, "Legacy") {
			continue // Legacy fields are old key names folded into their new ones
		}
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
			walkSettings(v.Field(i), d.Field(i), prefix+key+".", out)
			continue
		}
		k := prefix + key
		*out = append(*out, Setting{Key: k, Value: Redact(k, settingText(v.Field(i))), Default: Redact(k, settingText(d.Field(i)))})
	}
}

// settingText formats one value for SHOW CONFIG.
func settingText(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case time.Duration:
		return x.String()
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	case int:
		return strconv.Itoa(x)
	case UserList:
		return strings.Join(x, ",")
	}
	return fmt.Sprint(v.Interface())
}
