package identity

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

// mapResolver is a placeholder resolver backed by a map. Values are stored as
// any already, so Get itself does not allocate.
type mapResolver map[string]any

func (m mapResolver) Get(name string) (any, bool) {
	v, ok := m[name]
	return v, ok
}

func mustCompile(t testing.TB, s string) Candidate {
	t.Helper()
	c, err := Compile(s)
	if err != nil {
		t.Fatalf("Compile(%q): %v", s, err)
	}
	return c
}

func mustDeriver(t testing.TB, v4, v6 int, cands ...string) *Deriver {
	t.Helper()
	var cs []Candidate
	for _, s := range cands {
		cs = append(cs, mustCompile(t, s))
	}
	d, err := NewDeriver(cs, v4, v6)
	if err != nil {
		t.Fatalf("NewDeriver(%q, %d, %d): %v", cands, v4, v6, err)
	}
	return d
}

// derive derives with a single placeholder {v} set to value.
func derive(d *Deriver, value string) Token {
	tok, _ := d.Derive(mapResolver{"v": value}, nil)
	return tok
}

func isTextSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == '-') {
			return false
		}
	}
	return true
}

func TestIPv4FormsShareAToken(t *testing.T) {
	d := mustDeriver(t, 32, 64, "{v}")
	want := derive(d, "1.2.3.4")
	if want.Kind() != KindIPv4 || want[0] != 1 {
		t.Fatalf("1.2.3.4: kind %q candidate %d", want.Kind(), want[0])
	}
	if got := want.String(); got != "41-01020304" {
		t.Fatalf("String() = %q, want 41-01020304", got)
	}
	for _, v := range []string{"1.2.3.4:5678", "::ffff:1.2.3.4", "[::ffff:1.2.3.4]:80", "[::ffff:1.2.3.4]", "1.2.3.4:0"} {
		if got := derive(d, v); got != want {
			t.Errorf("%q: token %s, want %s", v, got, want)
		}
	}
	for _, v := range []string{"1.2.3.5", "4.3.2.1:5678", "::ffff:1.2.3.5"} {
		if got := derive(d, v); got == want {
			t.Errorf("%q shares 1.2.3.4's token", v)
		}
	}
}

func TestIPv4PrefixMasks(t *testing.T) {
	d := mustDeriver(t, 24, 64, "{v}")
	a := derive(d, "1.2.3.4")
	for _, v := range []string{"1.2.3.0", "1.2.3.255", "1.2.3.77:443", "::ffff:1.2.3.9"} {
		if got := derive(d, v); got != a {
			t.Errorf("/24: %q token %s, want %s", v, got, a)
		}
	}
	if got := a.String(); got != "41-01020300" {
		t.Errorf("/24 String() = %q, want 41-01020300", got)
	}
	if derive(d, "1.2.4.4") == a {
		t.Errorf("/24: 1.2.4.4 shares 1.2.3.0/24's token")
	}
	d8 := mustDeriver(t, 8, 64, "{v}")
	if derive(d8, "10.1.2.3") != derive(d8, "10.200.0.1") || derive(d8, "10.1.2.3") == derive(d8, "11.1.2.3") {
		t.Errorf("/8 masking wrong")
	}
}

func TestIPv6PrefixMasks(t *testing.T) {
	d := mustDeriver(t, 32, 64, "{v}")
	a := derive(d, "2001:db8:1:2::1")
	if a.Kind() != KindIPv6 {
		t.Fatalf("kind %q, want IPv6", a.Kind())
	}
	if got := a.String(); got != "61-20010db8000100020000000000000000" {
		t.Errorf("String() = %q", got)
	}
	if b := derive(d, "2001:db8:1:2:ffff:ffff:ffff:ffff"); b != a {
		t.Errorf("same /64 gives different tokens: %s vs %s", a, b)
	}
	if b := derive(d, "2001:db8:1:3::1"); b == a {
		t.Errorf("different /64s share token %s", a)
	}
	// Canonical forms: brackets and port, zone.
	x := derive(d, "2001:db8::1")
	for _, v := range []string{"[2001:db8::1]:443", "2001:db8::1%eth0", "[2001:db8::1%eth0]:443", "2001:0db8:0000::0001", "[2001:db8::1]"} {
		if got := derive(d, v); got != x {
			t.Errorf("%q: token %s, want %s", v, got, x)
		}
	}
	// /128 keeps the whole address.
	d128 := mustDeriver(t, 32, 128, "{v}")
	if derive(d128, "2001:db8::1") == derive(d128, "2001:db8::2") {
		t.Errorf("/128 merged two addresses")
	}
	if got := derive(d128, "[2001:db8::1]:443").String(); got != "61-20010db8000000000000000000000001" {
		t.Errorf("/128 String() = %q", got)
	}
	// IPv4 and IPv6 tokens never collide, even for the "same" bits.
	if derive(d, "::1.2.3.4") == derive(d, "1.2.3.4") {
		t.Errorf("IPv4-compatible (not mapped) IPv6 was unmapped")
	}
}

func TestParseAddr(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.1":          "192.0.2.1",
		"192.0.2.1:443":      "192.0.2.1",
		"[2001:db8::1]:443":  "2001:db8::1",
		"fe80::1%eth0":       "fe80::1",
		"::ffff:192.0.2.1":   "192.0.2.1",
		"[::ffff:192.0.2.1]": "192.0.2.1",
	} {
		a, ok := ParseAddr(in)
		if !ok || a.String() != want {
			t.Errorf("ParseAddr(%q) = %v, %v; want %s", in, a, ok, want)
		}
	}
	for _, in := range []string{"", "example.com", "example.com:80", "[2001:db8::1", "1.2.3", "::ffff:1.2.3.4.5", "user@1.2.3.4", "[]", "%"} {
		if a, ok := ParseAddr(in); ok {
			t.Errorf("ParseAddr(%q) = %v, want not an address", in, a)
		}
	}
}

func TestCandidateFallback(t *testing.T) {
	d := mustDeriver(t, 32, 64, "{user}", "tenant-{a}", "{ip}")
	// First non-empty wins.
	tok, _ := d.Derive(mapResolver{"user": "alice", "a": "acme", "ip": "1.2.3.4"}, nil)
	if tok.Kind() != KindHash || tok[0] != 1 {
		t.Fatalf("user present: kind %q candidate %d, want hash from candidate 1", tok.Kind(), tok[0])
	}
	// Empty user (present but "") falls through to the tenant.
	tok, _ = d.Derive(mapResolver{"user": "", "a": "acme", "ip": "1.2.3.4"}, nil)
	if tok.Kind() != KindHash || tok[0] != 2 {
		t.Fatalf("user empty: kind %q candidate %d, want hash from candidate 2", tok.Kind(), tok[0])
	}
	// A candidate with any empty placeholder is skipped: "tenant-" is not a value.
	tok, _ = d.Derive(mapResolver{"a": "", "ip": "1.2.3.4"}, nil)
	if tok.Kind() != KindIPv4 || tok[0] != 3 {
		t.Fatalf("tenant empty: kind %q candidate %d, want IPv4 from candidate 3", tok.Kind(), tok[0])
	}
	// Unknown placeholders and nil values count as empty.
	tok, _ = d.Derive(mapResolver{"user": nil, "ip": "1.2.3.4"}, nil)
	if tok.Kind() != KindIPv4 || tok[0] != 3 {
		t.Fatalf("user nil, tenant unknown: kind %q candidate %d", tok.Kind(), tok[0])
	}
	// Everything empty: the shared empty token.
	tok, _ = d.Derive(mapResolver{"user": "", "a": ""}, nil)
	want := Token{}
	want[1] = byte(KindEmpty)
	if tok != want || tok.Kind() != KindEmpty {
		t.Fatalf("all empty: %v, want %v", tok, want)
	}
	if tok.String() != "e0-" {
		t.Fatalf("empty String() = %q, want e0-", tok.String())
	}
	if tok2, _ := d.Derive(mapResolver{}, nil); tok2 != want {
		t.Fatalf("no values at all: %v", tok2)
	}
}

func TestSameValueDifferentCandidatesDiffer(t *testing.T) {
	d := mustDeriver(t, 32, 64, "{a}", "{b}")
	for _, v := range []string{"alice", "1.2.3.4", "2001:db8::1"} {
		t0, _ := d.Derive(mapResolver{"a": v, "b": v}, nil)
		t1, _ := d.Derive(mapResolver{"b": v}, nil)
		if t0 == t1 {
			t.Errorf("%q: candidate 0 and candidate 1 share token %s", v, t0)
		}
		if t0[0] != 1 || t1[0] != 2 || !bytes.Equal(t0[1:], t1[1:]) {
			t.Errorf("%q: tokens %s and %s should differ only in the candidate byte", v, t0, t1)
		}
	}
}

func TestHashedValueNeverShown(t *testing.T) {
	d := mustDeriver(t, 32, 64, "{v}", "key-{w}")
	secrets := []string{"sk_live_SuperSecretToken", "hunter2", "zzz-private-zzz", "Bearer xyz.abc.def"}
	for _, s := range secrets {
		for _, r := range []mapResolver{{"v": s}, {"v": "", "w": s}} {
			tok, _ := d.Derive(r, nil)
			if tok.Kind() != KindHash {
				t.Fatalf("%q: kind %q, want hash", s, tok.Kind())
			}
			text := tok.String()
			if strings.Contains(text, s) || strings.Contains(strings.ToLower(text), strings.ToLower(s)) {
				t.Errorf("token text %q contains the raw value %q", text, s)
			}
			if len(text) != 2+1+32 || !isTextSafe(text) {
				t.Errorf("token text %q: length %d or alphabet wrong", text, len(text))
			}
			if !bytes.Equal(tok.AppendText([]byte("x")), append([]byte("x"), text...)) {
				t.Errorf("AppendText disagrees with String")
			}
		}
	}
	// Same value, same token; the text is stable.
	if derive(d, "hunter2") != derive(d, "hunter2") || derive(d, "hunter2").String() != derive(d, "hunter2").String() {
		t.Errorf("hashing is not deterministic")
	}
	// Raw (for log_key) returns the value itself, and only on demand.
	if got := d.Raw(mapResolver{"v": "hunter2"}, nil); got != "hunter2" {
		t.Errorf("Raw = %q", got)
	}
	if got := d.Raw(mapResolver{"v": "", "w": "x"}, nil); got != "key-x" {
		t.Errorf("Raw falling back to the second candidate = %q, want key-x", got)
	}
	if got := d.Raw(mapResolver{"v": "", "w": ""}, nil); got != "" {
		t.Errorf("Raw of all-empty = %q", got)
	}
}

// hostileValues are keys an attacker may send: huge, binary, with syntax
// characters, invalid UTF-8, header-splitting characters.
func hostileValues() []string {
	return []string{
		strings.Repeat("A", 10*1024),
		strings.Repeat("A", 10*1024-1) + "B",
		strings.Repeat("A", 10*1024+1),
		"\x00",
		"\x00\x00",
		"a\x00b",
		"{",
		"}",
		"{}",
		"{v}",
		":",
		"a:b",
		"\xff\xfe\xfd",
		"\xc3\x28",
		"\r\n",
		"\r\nX-Injected: 1",
		"%",
		"[",
		"]",
		"[::1",
		"e0-",
		"41-01020304",
		" ",
		"\t",
		"😀",
	}
}

func TestHostileKeys(t *testing.T) {
	for _, cand := range []string{"{v}", "pre-{v}-post"} {
		d := mustDeriver(t, 32, 64, cand)
		seen := map[Token]string{}
		var scratch []byte
		for _, v := range hostileValues() {
			var tok Token
			tok, scratch = d.Derive(mapResolver{"v": v}, scratch)
			if tok.Kind() != KindHash {
				t.Errorf("%s: %q: kind %q, want hash", cand, trunc(v), tok.Kind())
			}
			if prev, dup := seen[tok]; dup {
				t.Errorf("%s: %q and %q share token %s", cand, trunc(prev), trunc(v), tok)
			}
			seen[tok] = v
			text := tok.String()
			if !isTextSafe(text) || len(text) > 2+3+32 {
				t.Errorf("%s: %q: unsafe or oversized text %q", cand, trunc(v), text)
			}
			if len(tok) != Size {
				t.Errorf("token size %d", len(tok))
			}
			// Deterministic, with a dirty reused scratch buffer.
			again, _ := d.Derive(mapResolver{"v": v}, []byte("leftover garbage that must not leak into the hash"))
			if again != tok {
				t.Errorf("%s: %q: token changed between derivations", cand, trunc(v))
			}
		}
		if len(seen) != len(hostileValues()) {
			t.Errorf("%s: %d distinct tokens for %d values", cand, len(seen), len(hostileValues()))
		}
	}
}

func trunc(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}

func TestValueTypes(t *testing.T) {
	d := mustDeriver(t, 32, 64, "{v}")
	str := derive(d, "42")
	for _, v := range []any{[]byte("42"), 42, stringer("42")} {
		tok, _ := d.Derive(mapResolver{"v": v}, nil)
		if tok != str {
			t.Errorf("%T value: token %s, want %s", v, tok, str)
		}
	}
	tok, _ := d.Derive(mapResolver{"v": []string{"a", "b"}}, nil)
	if tok != derive(d, "a,b") {
		t.Errorf("[]string value not joined")
	}
	ip, _ := d.Derive(mapResolver{"v": []byte("1.2.3.4")}, nil)
	if ip != derive(d, "1.2.3.4") {
		t.Errorf("[]byte address not parsed")
	}
}

type stringer string

func (s stringer) String() string { return string(s) }

func TestCompile(t *testing.T) {
	for _, bad := range []string{"", "{", "{abc", "abc{", "x-{a", "{}", "pre-{}-post", "{a b}", "{{a}}", "{a}{"} {
		if c, err := Compile(bad); err == nil {
			t.Errorf("Compile(%q) = %#v, want an error", bad, c)
		}
	}
	for in, phs := range map[string][]string{
		"{http.vars.client_ip}":                  {"http.vars.client_ip"},
		"tenant-{http.request.header.X-Tenant}":  {"http.request.header.X-Tenant"},
		"{a}:{b}":                                {"a", "b"},
		"static":                                 nil,
		"a}b":                                    nil,
		"{http.request.header.X-Api-Key}-suffix": {"http.request.header.X-Api-Key"},
	} {
		c, err := Compile(in)
		if err != nil {
			t.Errorf("Compile(%q): %v", in, err)
			continue
		}
		if c.String() != in {
			t.Errorf("String() = %q, want %q", c.String(), in)
		}
		got := c.Placeholders()
		if strings.Join(got, "|") != strings.Join(phs, "|") || len(got) != len(phs) {
			t.Errorf("Compile(%q).Placeholders() = %q, want %q", in, got, phs)
		}
	}
	// A literal-only candidate is never empty and hashes its text.
	d := mustDeriver(t, 32, 64, "static")
	tok, _ := d.Derive(mapResolver{}, nil)
	if tok.Kind() != KindHash || tok[0] != 1 {
		t.Errorf("literal candidate: %s", tok)
	}
	// Multi-part candidates frame each value with its length, so values
	// that join to the same text stay distinct.
	d2 := mustDeriver(t, 32, 64, "{a}{b}")
	t1, _ := d2.Derive(mapResolver{"a": "ab", "b": "c"}, nil)
	t2, _ := d2.Derive(mapResolver{"a": "a", "b": "bc"}, nil)
	t3, _ := d2.Derive(mapResolver{"a": "ab", "b": "c"}, nil)
	if t1 == t2 || t1 != t3 || t1.Kind() != KindHash {
		t.Errorf("{a}{b}: (ab,c)=%s (a,bc)=%s (ab,c) again=%s", t1, t2, t3)
	}
	// The raw value (for log_key) is the plain joined text.
	if got := d2.Raw(mapResolver{"a": "ab", "b": "c"}, nil); got != "abc" {
		t.Errorf("Raw = %q, want abc", got)
	}
}

func TestNewDeriverErrors(t *testing.T) {
	c := mustCompile(t, "{v}")
	one := []Candidate{c}
	for _, tc := range []struct {
		cands  []Candidate
		v4, v6 int
	}{
		{nil, 32, 64},
		{[]Candidate{}, 32, 64},
		{one, 0, 64},
		{one, -1, 64},
		{one, 33, 64},
		{one, 32, 0},
		{one, 32, 129},
		{one, 32, -64},
		{make([]Candidate, MaxCandidates+1), 32, 64},
		{make([]Candidate, 100), 32, 64},
	} {
		for i := range tc.cands {
			tc.cands[i] = c
		}
		if d, err := NewDeriver(tc.cands, tc.v4, tc.v6); err == nil || d != nil {
			t.Errorf("NewDeriver(%d candidates, %d, %d) = %v, %v; want an error", len(tc.cands), tc.v4, tc.v6, d, err)
		}
	}
	many := make([]Candidate, MaxCandidates)
	for i := range many {
		many[i] = c
	}
	for _, ok := range []struct {
		cands  []Candidate
		v4, v6 int
	}{{one, 1, 1}, {one, 32, 128}, {many, 32, 64}} {
		if _, err := NewDeriver(ok.cands, ok.v4, ok.v6); err != nil {
			t.Errorf("NewDeriver(%d candidates, %d, %d): %v", len(ok.cands), ok.v4, ok.v6, err)
		}
	}
	// The 16th candidate is reachable and keeps its own candidate byte.
	ph := make([]Candidate, MaxCandidates)
	for i := range ph {
		ph[i] = mustCompile(t, "{c"+string(rune('a'+i))+"}")
	}
	d, err := NewDeriver(ph, 32, 64)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := d.Derive(mapResolver{"cp": "last"}, nil)
	if tok[0] != MaxCandidates {
		t.Errorf("16th candidate's token has candidate byte %d", tok[0])
	}
}

func TestNeverEmpty(t *testing.T) {
	for in, want := range map[string]bool{
		"{http.vars.client_ip}":                        true,
		"{http.request.remote.host}":                   true,
		"{http.request.remote}":                        true,
		"static":                                       true,
		"ip-{http.vars.client_ip}":                     true,
		"{http.auth.user.id}":                          false,
		"{http.request.header.X-Api-Key}":              false,
		"{http.vars.client_ip}-{http.auth.user.id}":    false,
		"{http.request.remote.host}{http.request.uri}": false,
	} {
		if got := mustCompile(t, in).NeverEmpty(); got != want {
			t.Errorf("NeverEmpty(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestDeriveDoesNotAllocate(t *testing.T) {
	d := mustDeriver(t, 32, 64, "{v}")
	scratch := make([]byte, 0, 256)
	for _, tc := range []struct{ name, value string }{
		{"ipv4", "203.0.113.9"},
		{"ipv4-port", "203.0.113.9:51234"},
		{"ipv6", "2001:db8:1:2::99"},
		{"ipv6-bracket-port", "[2001:db8:1:2::99]:443"},
		{"hash", "sk_live_0123456789abcdef"},
	} {
		r := mapResolver{"v": tc.value}
		var tok Token
		allocs := testing.AllocsPerRun(1000, func() {
			tok, scratch = d.Derive(r, scratch)
		})
		if allocs != 0 {
			t.Errorf("%s: Derive allocates %v times per call, want 0", tc.name, allocs)
		}
		if tok.Kind() == KindEmpty {
			t.Errorf("%s: empty token", tc.name)
		}
	}
}

func BenchmarkDeriveIP(b *testing.B) {
	b.ReportAllocs()
	d := mustDeriver(b, 32, 64, "{http.vars.client_ip}")
	r := mapResolver{"http.vars.client_ip": "203.0.113.9:51234"}
	scratch := make([]byte, 0, 256)
	var tok Token
	for b.Loop() {
		tok, scratch = d.Derive(r, scratch)
	}
	_ = tok
}

func BenchmarkDeriveHash(b *testing.B) {
	b.ReportAllocs()
	d := mustDeriver(b, 32, 64, "{http.request.header.X-Api-Key}")
	r := mapResolver{"http.request.header.X-Api-Key": "sk_live_0123456789abcdef0123456789abcdef"}
	scratch := make([]byte, 0, 256)
	var tok Token
	for b.Loop() {
		tok, scratch = d.Derive(r, scratch)
	}
	_ = tok
}

// Only well-formed address forms are read as addresses: a junk port or a
// zone on an IPv4 address makes the value an opaque (hashed) key.
func TestParseAddrStrict(t *testing.T) {
	for _, v := range []string{"1.2.3.4:junk", "1.2.3.4:", "1.2.3.4%x", "[::1]junk", "[::1]:", "[::1]:1234567", "cafe", "deadbeef", "1.2.3"} {
		if a, ok := ParseAddr(v); ok {
			t.Errorf("ParseAddr(%q) = %v, want not an address", v, a)
		}
	}
	for v, want := range map[string]string{"1.2.3.4:80": "1.2.3.4", "[::1]:443": "::1", "fe80::1%eth0": "fe80::1", "[::ffff:10.0.0.1]": "10.0.0.1"} {
		if a, ok := ParseAddr(v); !ok || a.String() != want {
			t.Errorf("ParseAddr(%q) = %v %v, want %s", v, a, ok, want)
		}
	}
	d := mustDeriver(t, 32, 64, "{v}")
	tok, _ := d.Derive(mapResolver{"v": "1.2.3.4:junk"}, nil)
	if tok.Kind() != KindHash {
		t.Errorf("1.2.3.4:junk: kind %c, want hash", tok.Kind())
	}
}

// An address inside a multi-part candidate is masked before hashing, so the
// prefix rule holds there too.
func TestMultiPartMasksAddresses(t *testing.T) {
	d := mustDeriver(t, 24, 64, "{h}-{ip}")
	tok := func(ip string) Token {
		tk, _ := d.Derive(mapResolver{"h": "example.com", "ip": ip}, nil)
		return tk
	}
	if tok("2001:db8::1") != tok("[2001:db8::2]:443") || tok("2001:db8::1") == tok("2001:db8:0:1::1") {
		t.Errorf("IPv6 inside a multi-part key is not masked to /64")
	}
	if tok("192.0.2.1") != tok("::ffff:192.0.2.200") || tok("192.0.2.1") == tok("192.0.3.1") {
		t.Errorf("IPv4 inside a multi-part key is not masked to /24")
	}
	if tok("192.0.2.1").Kind() != KindHash {
		t.Errorf("a multi-part key must be hashed")
	}
}

// TestScope: a scoped token is deterministic, keeps the candidate, differs
// per scope and per original token, never equals an unscoped token, reveals
// neither input in its text form, and costs no allocation.
func TestScope(t *testing.T) {
	d := mustDeriver(t, 32, 64, "{v}")
	ip, key := derive(d, "192.0.2.1"), derive(d, "api-key-1")
	free, pro := []byte("events=60"), []byte("events=600")
	seen := map[Token]string{}
	for _, c := range []struct {
		name string
		tok  Token
	}{
		{"ip", ip}, {"key", key}, {"empty", EmptyToken()},
		{"ip/free", ip.Scope(free)}, {"ip/pro", ip.Scope(pro)},
		{"key/free", key.Scope(free)}, {"key/pro", key.Scope(pro)},
		{"empty/free", EmptyToken().Scope(free)}, {"ip/nil", ip.Scope(nil)},
	} {
		if prev, dup := seen[c.tok]; dup {
			t.Errorf("%s and %s give the same token %s", prev, c.name, c.tok)
		}
		seen[c.tok] = c.name
	}
	if ip.Scope(pro) != ip.Scope([]byte("events=600")) {
		t.Error("Scope is not deterministic")
	}
	s := key.Scope(pro)
	if s.Kind() != KindScoped || s.Candidate() != key.Candidate() {
		t.Errorf("scoped token kind %q candidate %d, want %q and %d", s.Kind(), s.Candidate(), KindScoped, key.Candidate())
	}
	if txt := s.String(); !isTextSafe(txt) || strings.Contains(txt, "c0000201") || !strings.HasPrefix(txt, "s1-") {
		t.Errorf("scoped token text %q: want s1-<hash>, text-safe, without the address", txt)
	}
	if n := testing.AllocsPerRun(100, func() { _ = ip.Scope(pro) }); n != 0 {
		t.Errorf("Scope allocates %v times", n)
	}
	defer func() {
		if recover() == nil {
			t.Error("a scope longer than MaxScope did not panic")
		}
	}()
	ip.Scope(make([]byte, MaxScope+1))
}

// parseIPv4, ParseAddr's short way, reads exactly the dotted quads that
// netip.ParseAddr reads, as the same address, and leaves every other value
// to the long way.
func TestParseIPv4AsNetip(t *testing.T) {
	values := []string{
		"0.0.0.0", "255.255.255.255", "192.0.2.1", "10.0.0.10", "1.2.3.4",
		"256.0.0.1", "1.2.3.256", "01.2.3.4", "1.02.3.4", "1.2.3.04", "00.0.0.0", "1.2.3.0",
		"1.2.3", "1.2.3.4.5", "1..2.3", ".1.2.3", "1.2.3.", "1.2.3.4 ", " 1.2.3.4",
		"1.2.3.4:80", "1.2.3.-4", "1.2.3.a", "1234.1.1.1", "999.999.999.999", "::ffff:1.2.3.4", "",
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		b := make([]byte, 7+rng.IntN(9))
		for i := range b {
			b[i] = "0123456789."[rng.IntN(11)]
		}
		values = append(values, string(b))
	}
	for _, v := range values {
		a, ok := parseIPv4(v)
		want, err := netip.ParseAddr(v)
		switch {
		case ok && (err != nil || netip.AddrFrom4(a) != want):
			t.Fatalf("parseIPv4(%q) = %v; netip: %v, %v", v, a, want, err)
		case !ok && err == nil && want.Is4():
			t.Fatalf("parseIPv4(%q) refused an address netip reads: %v", v, want)
		}
	}
}

// TestDeriverSame: derivers are the same when their candidates (in order)
// and prefix lengths are; anything else tells them apart.
func TestDeriverSame(t *testing.T) {
	a := mustDeriver(t, 32, 64, "{http.request.header.X-Api-Key}", "{client_ip}")
	for _, tc := range []struct {
		d    *Deriver
		same bool
	}{
		{a, true},
		{mustDeriver(t, 32, 64, "{http.request.header.X-Api-Key}", "{client_ip}"), true},
		{mustDeriver(t, 32, 64, "{client_ip}", "{http.request.header.X-Api-Key}"), false},
		{mustDeriver(t, 32, 64, "{http.request.header.X-Api-Key}"), false},
		{mustDeriver(t, 24, 64, "{http.request.header.X-Api-Key}", "{client_ip}"), false},
		{mustDeriver(t, 32, 48, "{http.request.header.X-Api-Key}", "{client_ip}"), false},
		{mustDeriver(t, 32, 64, "{http.request.header.X-Token}", "{client_ip}"), false},
		{nil, false},
	} {
		if got := a.Same(tc.d); got != tc.same {
			t.Errorf("Same(%+v) = %v, want %v", tc.d, got, tc.same)
		}
	}
}
