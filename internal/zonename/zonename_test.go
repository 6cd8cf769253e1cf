package zonename

import (
	"net/url"
	"strings"
	"testing"
)

func TestEncodings(t *testing.T) {
	for _, c := range []struct{ name, key, policy string }{
		{"login", "login", "login"},
		{"api.v2-EU_1", "api.v2-EU_1", "api.v2-EU_1"},
		{"api/v1", "api%2Fv1", "api/v1"},
		{"login:v2", "login%3Av2", "login:v2"},
		{"my zone", "my%20zone", "my zone"},
		{"a{b}", "a%7Bb%7D", "a{b}"},
		{"%41", "%2541", "%2541"},
		{`a"b\c`, "a%22b%5Cc", `a"b\c`},
		{"café", "caf%C3%A9", "caf%C3%A9"},
		{"x\x7fy", "x%7Fy", "x%7Fy"},
	} {
		if got := Key(c.name); got != c.key {
			t.Errorf("Key(%q) = %q, want %q", c.name, got, c.key)
		}
		if got := string(AppendKey([]byte("p:"), c.name)); got != "p:"+c.key {
			t.Errorf("AppendKey(%q) = %q", c.name, got)
		}
		if n, enc := KeyLen(c.name); n != len(c.key) || enc != (c.key != c.name) {
			t.Errorf("KeyLen(%q) = %d, %v", c.name, n, enc)
		}
		if got := Policy(c.name); got != c.policy {
			t.Errorf("Policy(%q) = %q, want %q", c.name, got, c.policy)
		}
		for _, enc := range []string{c.key, c.policy} {
			if dec, err := url.PathUnescape(enc); err != nil || dec != c.name {
				t.Errorf("PathUnescape(%q) = %q, %v; want %q", enc, dec, err, c.name)
			}
		}
		if strings.ContainsAny(c.key, ":{}/ ") {
			t.Errorf("key form %q holds a separator", c.key)
		}
	}
}
