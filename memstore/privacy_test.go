package memstore

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
)

// privacyResolver resolves placeholders from a map.
type privacyResolver map[string]any

func (m privacyResolver) Get(k string) (any, bool) { v, ok := m[k]; return v, ok }

// privacyValues are credential-like and hostile key values: some short
// enough to fit in a key's 16 payload bytes (so "not contained" is a real
// check), huge ones, near-duplicates, separators, hash-tag braces, NUL and
// control bytes, invalid UTF-8.
func privacyValues() []string {
	big := strings.Repeat("k", 10<<10)
	return []string{
		"sk_live_51HxQjKLm8q2Zt9Wv4", "tok-7f3a9c", "alice", "0123456789abcdef",
		big, big[:len(big)-1] + "j", big + "k",
		"{", "}", "{}", "}{", ":", "a:b", "zone:{h1-00}", "\x00", "\x00\x00", "a\x00b", "\r\n",
		"\xff\xfe", "caf\xe9", "café", "%00", "-",
	}
}

// TestStoreHoldsNoRawKeys: keys derived by package identity from API keys
// and hostile values reach the store as fixed-size hashes: one distinct key
// per value (none merges with another), none containing the value; an IPv6
// key holds only its /64 prefix, never the interface identifier.
func TestStoreHoldsNoRawKeys(t *testing.T) {
	s, _ := newTestStore(t, 10_000)
	var cands []identity.Candidate
	for _, c := range []string{"{http.request.header.X-Api-Key}", "tenant-{http.request.host}:{http.request.header.X-User}", "{http.vars.client_ip}"} {
		cc, err := identity.Compile(c)
		if err != nil {
			t.Fatal(err)
		}
		cands = append(cands, cc)
	}
	d, err := identity.NewDeriver(cands, 32, 64)
	if err != nil {
		t.Fatal(err)
	}
	l, err := algorithms.NewLimit(algorithms.TokenBucket, 1, time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}

	type input struct {
		what string
		r    privacyResolver
		raw  []string // the raw values that must not be stored
	}
	var inputs []input
	for _, v := range privacyValues() {
		inputs = append(inputs, input{"api key " + trunc(v), privacyResolver{"http.request.header.X-Api-Key": v}, []string{v}})
		inputs = append(inputs, input{"tenant user " + trunc(v), privacyResolver{"http.request.host": "example.com", "http.request.header.X-User": v}, []string{v, "example.com"}})
	}
	const v6 = "2001:db8:1:2:3:4:5:6"
	inputs = append(inputs, input{"IPv6 client", privacyResolver{"http.vars.client_ip": v6}, nil})

	want := map[algorithms.Key]string{}
	for _, in := range inputs {
		tok, _ := d.Derive(in.r, nil)
		k := algorithms.Key(tok)
		if prev, dup := want[k]; dup {
			t.Fatalf("%s and %s derive the same key", prev, in.what)
		}
		want[k] = in.what
		r := algorithms.Request{Zone: "private", Key: k, Limit: l, Cost: 1}
		if d := take1(t, s, r); !d.Allowed {
			t.Errorf("%s: the first request was refused: it merged with an earlier value", in.what)
		}
		if d := take1(t, s, r); d.Allowed {
			t.Errorf("%s: the second request passed: the same value is not the same bucket", in.what)
		}
	}

	got := 0
	s.Keys(func(zone string, key algorithms.Key) {
		got++
		what, ok := want[key]
		if !ok {
			t.Errorf("unexpected stored key %s", identity.Token(key))
			return
		}
		tok := identity.Token(key)
		if what == "IPv6 client" {
			a := netip.MustParseAddr(v6).As16()
			if tok.Kind() != identity.KindIPv6 || !bytes.Equal(key[2:10], a[:8]) || binary.BigEndian.Uint64(key[10:]) != 0 {
				t.Errorf("IPv6 client stored as %s, want its /64 prefix only", tok)
			}
			return
		}
		if tok.Kind() != identity.KindHash {
			t.Errorf("%s: stored as kind %q, want a hash", what, tok.Kind())
		}
		for _, in := range inputs {
			for _, raw := range in.raw {
				if len(raw) >= 4 && (bytes.Contains(key[:], []byte(raw)) || strings.Contains(tok.String(), raw)) {
					t.Errorf("%s: stored key %s holds the raw value %q", what, tok, trunc(raw))
				}
			}
		}
	})
	if got != len(want) {
		t.Errorf("the store holds %d keys, want %d (one per value)", got, len(want))
	}
	if s.Len() != len(want) {
		t.Errorf("Len() = %d, want %d", s.Len(), len(want))
	}
}

func trunc(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}
