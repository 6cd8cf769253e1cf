package fleet_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/redisstore"
)

// TestRefillRetryAfter: events 2 per 2 s through two Caddy processes sharing
// Redis, alternating. After 2 requests the third is refused with
// Retry-After 1; once that second has passed (plus a margin) the next
// passes and the one after is refused again. The key follows the schema
// (SCAN) and carries a TTL no longer than the time to full refill plus the
// store's margin, rounded up as the store rounds it (redisstore.KeyTTL),
// refreshed by each write (PTTL).
func TestRefillRetryAfter(t *testing.T) {
	r := redistest.Start(t)
	const zone = "refill"
	routes := fmt.Sprintf(`rate_limit {
	zone %s {
		key {http.request.header.X-User}
		events 2
		window 2s
	}
	store redis %s
}
respond "ok"`, zone, r.URL())
	a := startCaddy(t, "refill-a", "", routes)
	b := startCaddy(t, "refill-b", "", routes)
	c := newClient(2)
	defer c.CloseIdleConnections()
	user := "X-User: refill-" + nonce

	r1 := mustGet(t, c, a.url("/"), user)
	expectCode(t, r1, 200, "first request (process a)")
	expectRemaining(t, r1, 2, 1, "first request")
	r2 := mustGet(t, c, b.url("/"), user)
	t2 := time.Now()
	expectCode(t, r2, 200, "second request (process b)")
	expectRemaining(t, r2, 2, 0, "second request")

	keys := scanKeys(t, r, "sluice:v1:*")
	if len(keys) != 1 || len(keys[0]) <= len("sluice:v1:"+zone+":{}") || keys[0][:len("sluice:v1:"+zone+":{")] != "sluice:v1:"+zone+":{" || keys[0][len(keys[0])-1] != '}' {
		t.Fatalf("keys in Redis %q, want exactly one sluice:v1:%s:{<token>}", keys, zone)
	}
	key := keys[0]
	// Two tokens spent: full again after 2 s; the TTL is that plus the
	// store's margin (1 s), rounded up as the store rounds it, minus what
	// has passed.
	maxTTL := redisstore.KeyTTL(2 * time.Second).Milliseconds()
	ttl1 := pttl(t, r, key)
	if ttl1 <= 2000 || ttl1 > maxTTL {
		t.Errorf("PTTL %s = %d ms after spending the whole bucket, want in (2000, %d]", key, ttl1, maxTTL)
	}

	r3 := mustGet(t, c, a.url("/"), user)
	if expectCode(t, r3, 429, "third request (process a)") {
		if ra := retryAfter(r3); ra != 1 {
			t.Errorf("third request: Retry-After %q, want 1 (one token per second)", r3.header.Get("Retry-After"))
		}
		expectRemaining(t, r3, 2, 0, "third request")
	}
	// A refusal charges nothing and writes nothing: the TTL only ran down.
	if ttl := pttl(t, r, key); ttl > ttl1 {
		t.Errorf("PTTL after a refusal %d ms > %d ms before it: a refusal must not write", ttl, ttl1)
	}

	// One token is back 1 s after the second request.
	time.Sleep(time.Until(t2.Add(time.Second + 150*time.Millisecond)))
	r4 := mustGet(t, c, b.url("/"), user)
	expectCode(t, r4, 200, "after Retry-After (process b)")
	expectRemaining(t, r4, 2, 0, "after Retry-After")
	// The write refreshed the TTL: full again in a little under 2 s, plus
	// the margin.
	if ttl := pttl(t, r, key); ttl <= 2000 || ttl > maxTTL {
		t.Errorf("PTTL %s = %d ms after a refill and a spend, want in (2000, %d] (refreshed by the write)", key, ttl, maxTTL)
	}
	r5 := mustGet(t, c, a.url("/"), user)
	if expectCode(t, r5, 429, "right after the refilled token was spent (process a)") {
		if ra := retryAfter(r5); ra != 1 {
			t.Errorf("refused again: Retry-After %q, want 1", r5.header.Get("Retry-After"))
		}
	}
	// X-RateLimit-Reset: the Unix second at which the bucket is full again,
	// about 2 s from now.
	if reset, err := strconv.ParseInt(r5.header.Get("X-Ratelimit-Reset"), 10, 64); err != nil {
		t.Errorf("X-RateLimit-Reset %q: %v", r5.header.Get("X-Ratelimit-Reset"), err)
	} else if now := time.Now().Unix(); reset < now+1 || reset > now+3 {
		t.Errorf("X-RateLimit-Reset %d, want within [%d, %d]", reset, now+1, now+3)
	}
}
