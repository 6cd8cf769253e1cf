package redisstore

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestHostileKeysOnRedis: API keys and hostile key values (10 KB, near
// duplicates, NUL and control bytes, braces that would break a Cluster hash
// tag, the key schema's own separators, a forged store key) taken through
// the store on a real Redis: each gets its own bucket (the first request
// passes, the second is refused), and SCAN finds exactly one key per value
// and zone, each `sluice:v1:<zone>:{<token>}` with a token of [0-9a-z-] only,
// bounded in length, holding no raw value.
func TestHostileKeysOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	l := limit(t, 1, time.Hour, 0)
	big := strings.Repeat("k", 10<<10)
	values := []string{
		"sk_live_51HxQjKLm8q2Zt9Wv4", "tok-7f3a9c", "alice", "0123456789abcdef",
		big, big[:len(big)-1] + "j", big + "k",
		"{", "}", "{}", "}{", "{a}", ":", "a:b", "a:b:",
		"zone:{h1-00}", "sluice:v1:b:{h1-0123456789abcdef0123456789abcdef}",
		"\x00", "\x00\x00", "a\x00b", "\r\n", "\xff\xfe", "caf\xe9", "café", "%00", "-", "h1-",
	}
	zones := []string{"a", "b"}
	want := map[string]string{}
	for _, v := range values {
		k := keyOf(t, v)
		if identity.Token(k).Kind() != identity.KindHash {
			t.Fatalf("%.20q: token kind %q, want a hash", v, identity.Token(k).Kind())
		}
		// Both zones of one request: one identity, one hash tag, one slot.
		reqs := []algorithms.Request{
			{Zone: zones[0], Key: k, Limit: l, Cost: 1},
			{Zone: zones[1], Key: k, Limit: l, Cost: 1},
		}
		for i, d := range take(t, s, reqs...) {
			if !d.Allowed {
				t.Errorf("%.20q zone %s: the first request was refused: it merged with an earlier value", v, zones[i])
			}
		}
		for i, d := range take(t, s, reqs...) {
			if d.Allowed {
				t.Errorf("%.20q zone %s: the second request passed: the same value is not the same bucket", v, zones[i])
			}
		}
		for _, z := range zones {
			key := "sluice:v1:" + z + ":{" + identity.Token(k).String() + "}"
			if prev, dup := want[key]; dup {
				t.Fatalf("%.20q and %.20q share the key %s", prev, v, key)
			}
			want[key] = v
		}
	}

	schema := regexp.MustCompile(`^sluice:v1:[ab]:\{[0-9a-z-]+\}$`)
	maxLen := len("sluice:v1:a:{}") + 2 + 3 + 2*16 // kind, candidate, '-', 16 bytes in hex
	got := scanAll(t, srv)
	for _, k := range got {
		if !schema.MatchString(k) {
			t.Errorf("key %q does not match %s", k, schema)
		}
		if len(k) > maxLen {
			t.Errorf("key %q: %d bytes, more than %d", k, len(k), maxLen)
		}
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected key %q", k)
		}
		for _, raw := range values {
			if len(raw) >= 4 && strings.Contains(k, raw) {
				t.Errorf("key %q holds the raw value %.20q", k, raw)
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("SCAN found %d keys, want %d (one per value and zone)", len(got), len(want))
	}
	for k, v := range want {
		if !slices.Contains(got, k) {
			t.Errorf("%.20q: key %s missing", v, k)
		}
	}
}
