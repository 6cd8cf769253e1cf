package redistest

import (
	"net/url"
	"testing"
)

// User creates (or replaces) the ACL user name on s with the password
// "pw-"+name and rules (ACL SETUSER syntax: "~sluice:*", "+@all",
// "-fcall" …; the user is enabled), and returns the URL that connects as
// it.
func (s *Server) User(t testing.TB, name string, rules ...string) string {
	t.Helper()
	pw := "pw-" + name
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">" + pw}
	for _, r := range rules {
		args = append(args, r)
	}
	s.Do(t, args...)
	return "redis://" + url.UserPassword(name, pw).String() + "@" + s.Addr
}
