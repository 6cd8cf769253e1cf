package identity

import (
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

// FuzzDerive checks, for any two values of a single-placeholder candidate and
// of a multi-part one: Derive never panics; the same value always gives the
// same token; the text form is safe; and two values share a token exactly
// when they are the same value, the same masked address, or both empty.
func FuzzDerive(f *testing.F) {
	for _, v := range hostileValues() {
		f.Add(v, "")
		f.Add(v, v+"x")
	}
	for _, pair := range [][2]string{
		{"1.2.3.4", "1.2.3.4:5678"},
		{"::ffff:1.2.3.4", "[::ffff:1.2.3.4]:80"},
		{"2001:db8::1", "2001:db8::2"},
		{"[2001:db8::1]:443", "2001:db8::1%eth0"},
		{"2001:db8:0:1::1", "2001:db8:0:2::1"},
		{"alice", "alice"},
		{"alice", "bob"},
		{"1.2.3.4", "1.2.3.4 "},
		{"", ""},
	} {
		f.Add(pair[0], pair[1])
	}
	single := mustDeriver(f, 24, 64, "{v}")
	multi := mustDeriver(f, 24, 64, "{u}", "k:{v}:{v}")
	f.Fuzz(func(t *testing.T, a, b string) {
		var scratch []byte
		ta, scratch := single.Derive(mapResolver{"v": a}, scratch)
		ta2, scratch := single.Derive(mapResolver{"v": a}, scratch)
		tb, _ := single.Derive(mapResolver{"v": b}, scratch)
		if ta != ta2 {
			t.Fatalf("%q: token not stable: %s then %s", a, ta, ta2)
		}
		for _, tok := range []Token{ta, tb} {
			if s := tok.String(); !isTextSafe(s) {
				t.Fatalf("unsafe token text %q", s)
			}
		}
		if want := sameIdentity(a, b); (ta == tb) != want {
			t.Fatalf("%q vs %q: tokens %s and %s; want equal=%v", a, b, ta, tb, want)
		}
		if ta.Kind() == KindHash && ta[0] != 1 {
			t.Fatalf("candidate byte %d", ta[0])
		}

		// Multi-part: the framed values are hashed; an address value is
		// masked first, so the model is the same as for a single value.
		ma, _ := multi.Derive(mapResolver{"v": a}, nil)
		mb, _ := multi.Derive(mapResolver{"v": b}, nil)
		if a == "" {
			if ma.Kind() != KindEmpty {
				t.Fatalf("empty value: kind %q", ma.Kind())
			}
		} else if ma.Kind() != KindHash || ma[0] != 2 {
			t.Fatalf("%q: multi-part kind %q candidate %d", a, ma.Kind(), ma[0])
		}
		if (ma == mb) != sameIdentity(a, b) {
			t.Fatalf("multi-part %q vs %q: tokens %s and %s", a, b, ma, mb)
		}
	})
}

// sameIdentity is the model: what should share a token under /24 and /64.
func sameIdentity(a, b string) bool {
	if a == "" || b == "" {
		return a == b
	}
	pa, oka := ParseAddr(a)
	pb, okb := ParseAddr(b)
	if oka != okb {
		return false
	}
	if !oka {
		return a == b
	}
	return mask(pa) == mask(pb)
}

func mask(a netip.Addr) netip.Prefix {
	if a.Is4() {
		p, _ := a.Prefix(24)
		return p
	}
	p, _ := a.Prefix(64)
	return p
}

// FuzzRequestFields checks the readers of request fields on any input:
// they never panic; a cookie or query value sent once reads back as sent
// (a query value escaped as url.QueryEscape escapes it); the same field
// repeated identically reads the same; two copies are ambiguous exactly
// when their values differ.
func FuzzRequestFields(f *testing.F) {
	for _, s := range []string{"", "alice", "a b", "a+b", "%", "%4", "%41", "%zz", "a;b", "a&b", "a=b", `"q"`, "\"", "é", "\x00\xff"} {
		f.Add(s, s+"x")
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		// Arbitrary raw text never panics.
		for _, raw := range []string{a, b, a + ";" + b, a + "&" + b} {
			queryValue(raw, "user")
			cookieValue(http.Header{"Cookie": {raw, b}}, "session")
			headerValue(http.Header{raw: {a}, "X-User": {b}}, "X-User")
		}

		qa, qb := "user="+url.QueryEscape(a), "user="+url.QueryEscape(b)
		if v, amb := queryValue(qa, "user"); amb || v != a {
			t.Fatalf("query %q: %q ambiguous=%v, want %q", qa, v, amb, a)
		}
		if v, amb := queryValue(qa+"&"+qa, "user"); amb || v != a {
			t.Fatalf("query %q twice: %q ambiguous=%v, want %q", qa, v, amb, a)
		}
		if _, amb := queryValue(qa+"&"+qb, "user"); amb != (a != b) {
			t.Fatalf("query %q then %q: ambiguous=%v", qa, qb, amb)
		}

		// A cookie value as a client may send it: no ';', no surrounding
		// white space.
		if strings.ContainsAny(a, ";") || trimOWS(a) != a {
			return
		}
		want := a
		if len(a) > 1 && a[0] == '"' && a[len(a)-1] == '"' {
			want = a[1 : len(a)-1]
		}
		if u, err := url.QueryUnescape(want); err == nil {
			want = u // decoded as PHP reads it (a malformed escape stays)
		} else if !strings.Contains(want, "%") {
			want = strings.ReplaceAll(want, "+", " ")
		} else {
			want = queryUnescape(want) // malformed escapes: compared with itself below
		}
		h := http.Header{"Cookie": {"x=1; session=" + a}}
		if v, amb := cookieValue(h, "session"); amb || v != want {
			t.Fatalf("cookie session=%q: %q ambiguous=%v, want %q", a, v, amb, want)
		}
		h = http.Header{"Cookie": {"session=" + a, "SESSION=" + a}}
		if v, amb := cookieValue(h, "session"); amb || v != want {
			t.Fatalf("cookie session=%q twice: %q ambiguous=%v, want %q", a, v, amb, want)
		}
	})
}
