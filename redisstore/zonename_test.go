package redisstore

import (
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestKeysOfAnyZoneName: a zone name is percent-encoded in its Redis key
// (every byte outside [A-Za-z0-9_.-]), so a name with ':', '{', '}', '%',
// '/', spaces or non-ASCII letters neither moves the Cluster hash tag off
// the identity token nor collides with another zone's key, and names made
// of [A-Za-z0-9_.-] only (the names accepted before) keep their keys
// byte for byte. Checked on a real server, by SCAN.
func TestKeysOfAnyZoneName(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	l := limit(t, 5, time.Hour, 0)
	id := freshKey(t)
	tok := identity.Token(id).String()

	want := map[string]string{ // zone → its key's zone part
		"api":          "api",
		"api.v2-EU_1":  "api.v2-EU_1",
		"A":            "A",
		"%41":          "%2541", // must not collide with "A"
		"api/v1":       "api%2Fv1",
		"login:v2":     "login%3Av2",
		"my zone":      "my%20zone",
		"a{b}":         "a%7Bb%7D",
		"x:{" + tok:    "x%3A%7B" + tok, // would have forged another key's shape
		"café":         "caf%C3%A9",
		`q"uo\te`:      "q%22uo%5Cte",
		"login%3Av2":   "login%253Av2", // the encoded form of another name is a name of its own
		"trailing:":    "trailing%3A",
		"sp ace/slash": "sp%20ace%2Fslash",
	}
	var reqs []algorithms.Request
	for zone := range want {
		reqs = append(reqs, algorithms.Request{Zone: zone, Key: id, Limit: l, Cost: 1})
	}
	for i, d := range take(t, s, reqs...) {
		if !d.Allowed || d.Remaining != 4 {
			t.Fatalf("zone %q: %+v, want allowed with 4 left (each zone a bucket of its own)", reqs[i].Zone, d)
		}
	}

	var wantKeys []string
	for zone, part := range want {
		k := "sluice:v1:" + part + ":{" + tok + "}"
		wantKeys = append(wantKeys, k)
		if got := s.Key(zone, id); got != k {
			t.Errorf("Key(%q) = %q, want %q", zone, got, k)
		}
	}
	got := scanAll(t, srv)
	slices.Sort(got)
	slices.Sort(wantKeys)
	if !slices.Equal(got, wantKeys) {
		t.Fatalf("keys on the server (SCAN):\n  %s\nwant exactly:\n  %s", strings.Join(got, "\n  "), strings.Join(wantKeys, "\n  "))
	}
	for _, k := range got {
		if tag := string(hashTag(k)); tag != tok {
			t.Errorf("key %q: hash tag %q, want the identity token %q", k, tag, tok)
		}
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 || strings.Count(k, ":") != 3 {
			t.Errorf("key %q: the prefix's and the hash tag's are not the only separators", k)
		}
		// The key reads back to its zone.
		part := strings.TrimSuffix(strings.TrimPrefix(k, "sluice:v1:"), ":{"+tok+"}")
		zone, err := url.PathUnescape(part)
		if err != nil || want[zone] != part {
			t.Errorf("key %q: zone part %q decodes to %q (%v), not to the zone that wrote it", k, part, zone, err)
		}
	}

	// The admin API's read and reset address the same keys.
	out, found := make([]algorithms.Decision, 1), make([]bool, 1)
	if err := s.PeekKeys(testCtx(t), "my zone", []algorithms.Key{id}, l, out, found); err != nil || !found[0] || out[0].Remaining != 4 {
		t.Fatalf("PeekKeys(my zone): %+v %v %v", out[0], found[0], err)
	}
	if n, err := s.ResetKeys(testCtx(t), "a{b}", []algorithms.Key{id}); err != nil || n != 1 {
		t.Fatalf("ResetKeys(a{b}): %d %v", n, err)
	}
	if getRaw(t, srv.Client(), "sluice:v1:a%7Bb%7D:{"+tok+"}") != "" {
		t.Fatal("ResetKeys left the key")
	}
}
