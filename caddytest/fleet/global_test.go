package fleet_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestGlobalOptionStore: the global option `rate_limit { store redis <url> }`
// gives a directive without a store of its own the Redis store: two Caddy
// processes configured so share one count (a memory store would give each
// its own), and the key appears in Redis with the sluice:v1: prefix.
func TestGlobalOptionStore(t *testing.T) {
	r := redistest.Start(t)
	global := "rate_limit {\n\tstore redis " + r.URL() + "\n}"
	routes := `rate_limit {
	zone g_zone {
		key {http.request.header.X-User}
		events 2
		window 1h
	}
}
respond "ok"`
	a := startCaddy(t, "global-a", global, routes)
	b := startCaddy(t, "global-b", global, routes)
	c := newClient(2)
	defer c.CloseIdleConnections()
	user := "X-User: global-" + nonce

	if keys := scanKeys(t, r, "*"); len(keys) != 0 {
		t.Fatalf("keys in Redis before any request: %q", keys)
	}
	res := mustGet(t, c, a.url("/"), user)
	if expectCode(t, res, 200, "first (process a)") {
		expectRemaining(t, res, 2, 1, "first (process a)")
	}
	res = mustGet(t, c, b.url("/"), user)
	if expectCode(t, res, 200, "second (process b)") {
		expectRemaining(t, res, 2, 0, "second (process b): the count is shared")
	}
	res = mustGet(t, c, a.url("/"), user)
	expectCode(t, res, 429, "third (process a)")
	expectCode(t, mustGet(t, c, b.url("/"), user), 429, "fourth (process b)")

	keys := scanKeys(t, r, "*")
	if len(keys) != 1 || !strings.HasPrefix(keys[0], "sluice:v1:g_zone:{") || !strings.HasSuffix(keys[0], "}") {
		t.Fatalf("keys in Redis %q, want exactly one sluice:v1:g_zone:{<token>}", keys)
	}
	if ttl := pttl(t, r, keys[0]); ttl <= 0 {
		t.Errorf("PTTL %s = %d, want a TTL", keys[0], ttl)
	}
	t.Logf("key written through the global option's store: %s", keys[0])
}
