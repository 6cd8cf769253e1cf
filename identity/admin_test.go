package identity

import (
	"strings"
	"testing"
)

// TokenFor gives, for a raw value, exactly the token Derive gives a request
// whose first non-empty candidate renders that value: IPs in every form,
// masked; other values hashed; literal text around one placeholder.
func TestTokenForMatchesDerive(t *testing.T) {
	d := mustDeriver(t, 24, 48, "{a}", "tenant-{b}", "{c}.x", "fixed", "{a}-{b}")
	values := []string{
		"192.0.2.1", "192.0.2.77:443", "::ffff:192.0.2.1", "[2001:db8::1]:8443", "2001:db8:0:0:1::1", "fe80::1%eth0",
		"sk_live_51HxQjKLm8q2Zt9Wv4", "alice", "{", "a/b", "a:b", "café", "\xff\xfe", strings.Repeat("A", 5000),
	}
	for _, v := range values {
		// candidate 0: {a}
		want, _ := d.Derive(mapResolver{"a": v}, nil)
		if got, ok := d.TokenFor(0, v); !ok || got != want {
			t.Errorf("TokenFor(0, %q) = %s %v, want %s", v, got, ok, want)
		}
		// candidate 1: tenant-{b}, addressed by its rendered value
		want, _ = d.Derive(mapResolver{"b": v}, nil)
		if got, ok := d.TokenFor(1, "tenant-"+v); !ok || got != want {
			t.Errorf("TokenFor(1, tenant-%q) = %s %v, want %s", v, got, ok, want)
		}
		// candidate 2: {c}.x
		want, _ = d.Derive(mapResolver{"c": v}, nil)
		if got, ok := d.TokenFor(2, v+".x"); !ok || got != want {
			t.Errorf("TokenFor(2, %q.x) = %s %v, want %s", v, got, ok, want)
		}
	}
	// Addresses masked to the zone's prefix share a token.
	a, _ := d.TokenFor(0, "192.0.2.1")
	b, _ := d.TokenFor(0, "192.0.2.200")
	if a != b || a.Kind() != KindIPv4 || a[0] != 1 {
		t.Errorf("192.0.2.1 and .200 under /24: %s and %s, want one IPv4 token of candidate 1", a, b)
	}
	// A literal-only candidate matches its text only.
	want, _ := d.Derive(mapResolver{}, nil)
	if got, ok := d.TokenFor(3, "fixed"); !ok || got != want {
		t.Errorf("TokenFor(3, fixed) = %s %v, want %s", got, ok, want)
	}
	for _, tc := range []struct {
		i   int
		raw string
	}{
		{3, "other"},   // literal differs
		{1, "tenant-"}, // the placeholder would be empty
		{1, "acme"},    // missing the literal prefix
		{2, "acme.y"},  // missing the literal suffix
		{4, "a-b"},     // several placeholders: ambiguous
		{0, ""},        // empty value: the candidate is absent
		{5, "x"},       // no such candidate
		{-1, "x"},      // no such candidate
	} {
		if tok, ok := d.TokenFor(tc.i, tc.raw); ok {
			t.Errorf("TokenFor(%d, %q) = %s, want none", tc.i, tc.raw, tok)
		}
	}
}

// ParseToken reads back every token's text form, and nothing else.
func TestParseToken(t *testing.T) {
	d := mustDeriver(t, 32, 64, "{v}", "{w}")
	toks := []Token{EmptyToken()}
	for _, v := range []string{"192.0.2.1", "2001:db8::1", "key-1", "0123456789abcdef"} {
		for i := 0; i < 2; i++ {
			tok, _ := d.TokenFor(i, v)
			toks = append(toks, tok)
		}
	}
	for _, tok := range toks[:len(toks):len(toks)] {
		toks = append(toks, tok.Scope([]byte("plan")))
	}
	for _, tok := range toks {
		s := tok.String()
		got, ok := ParseToken(s)
		if !ok || got != tok {
			t.Errorf("ParseToken(%q) = %v %v, want %v", s, got, ok, tok)
		}
		if got, ok := ParseToken(strings.ToUpper(s)); !ok || got != tok {
			t.Errorf("ParseToken(%q) (upper case) = %v %v, want %v", strings.ToUpper(s), got, ok, tok)
		}
	}
	if EmptyToken().String() != "e0-" {
		t.Errorf("EmptyToken() = %q, want e0-", EmptyToken())
	}
	for _, bad := range []string{
		"", "e", "e0", "e1-", "e0-00", "40-c0000201", "41-c00002", "41-c000020100", "41-c000020g", "h1-00",
		"h1-" + strings.Repeat("0", 34), "h01-" + strings.Repeat("0", 32), "h+1-" + strings.Repeat("0", 32),
		"h17-" + strings.Repeat("0", 32), "x1-" + strings.Repeat("0", 32), "h1" + strings.Repeat("0", 32),
		"h999-" + strings.Repeat("0", 32), "61-" + strings.Repeat("0", 31), "s1-00", "s01-" + strings.Repeat("0", 32),
	} {
		if tok, ok := ParseToken(bad); ok {
			t.Errorf("ParseToken(%q) = %s, want an error", bad, tok)
		}
	}
}

func FuzzParseToken(f *testing.F) {
	f.Add("h1-00112233445566778899aabbccddeeff")
	f.Add("41-c0000201")
	f.Add("e0-")
	f.Fuzz(func(t *testing.T, s string) {
		tok, ok := ParseToken(s)
		if ok && tok.String() != strings.ToLower(s) {
			t.Fatalf("ParseToken(%q) = %s: not its text form", s, tok)
		}
	})
}
