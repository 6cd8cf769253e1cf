package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// msBetween reports whether d is within [lo, hi] milliseconds.
func msBetween(d time.Duration, lo, hi int64) bool {
	ms := d.Milliseconds()
	return lo <= ms && ms <= hi && d == time.Duration(ms)*time.Millisecond
}

func TestTakeAdmitsCapacityThenRefuses(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	l := limit(t, 5, time.Hour, 0) // one token per 720000ms
	req := algorithms.Request{Zone: "api", Key: freshKey(t), Limit: l, Cost: 1}

	start := time.Now()
	for i := int64(1); i <= 5; i++ {
		d := take(t, s, req)[0]
		// Redis's clock ran at most the wall time elapsed since the first
		// Take: the refill of that time is all that can differ.
		e := time.Since(start).Milliseconds() + 1
		if !d.Allowed || d.Limit != 5 || d.Remaining != 5-i || d.RetryAfter != 0 ||
			!msBetween(d.ResetAfter, i*720000-e, i*720000) {
			t.Fatalf("take %d: %+v; want allowed, limit 5, remaining %d, retry 0, reset ≈ %dms", i, d, 5-i, i*720000)
		}
	}
	for i := range 3 {
		d := take(t, s, req)[0]
		e := time.Since(start).Milliseconds() + 1
		if d.Allowed || d.Limit != 5 || d.Remaining != 0 ||
			!msBetween(d.RetryAfter, 720000-e, 720000) || !msBetween(d.ResetAfter, 3600000-e, 3600000) {
			t.Fatalf("refusal %d: %+v; want refused, remaining 0, retry ≈ 720000ms, reset ≈ 3600000ms", i, d)
		}
	}
	// A request costing more than the capacity never passes and touches
	// nothing; a cost of exactly what is left passes.
	big := req
	big.Key = freshKey(t)
	big.Cost = 6
	if d := take(t, s, big)[0]; d.Allowed || d.Remaining != 5 || d.RetryAfter != time.Hour {
		t.Fatalf("cost 6 of capacity 5: %+v; want refused, remaining 5, retry 1h", d)
	}
	big.Cost = 5
	if d := take(t, s, big)[0]; !d.Allowed || d.Remaining != 0 {
		t.Fatalf("cost 5 of capacity 5 on a full bucket: %+v; want allowed, remaining 0", d)
	}
}

func TestRetryAfterIsHonestOnRealRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	l := limit(t, 2, 200*time.Millisecond, 0) // a token every 100ms
	for round := range 3 {
		req := algorithms.Request{Zone: "short", Key: freshKey(t), Limit: l, Cost: 1}
		for i := range 2 {
			if d := take(t, s, req)[0]; !d.Allowed {
				t.Fatalf("round %d take %d refused: %+v", round, i, d)
			}
		}
		d := take(t, s, req)[0]
		if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > 100*time.Millisecond {
			t.Fatalf("round %d: third take %+v; want refused with 0 < retry-after <= 100ms", round, d)
		}
		if d.RetryAfter > 20*time.Millisecond {
			// Well before Retry-After, the same request is still refused.
			if d2 := take(t, s, req)[0]; d2.Allowed || d2.RetryAfter > d.RetryAfter {
				t.Fatalf("round %d: immediate retry %+v after retry-after %v", round, d2, d.RetryAfter)
			}
		}
		time.Sleep(d.RetryAfter)
		if d3 := take(t, s, req)[0]; !d3.Allowed {
			t.Fatalf("round %d: after waiting retry-after %v the same request is refused: %+v", round, d.RetryAfter, d3)
		}
	}
}

func TestTTLSetAndRefreshed(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	c := srv.Client()
	l := limit(t, 5, time.Hour, 0)
	req := algorithms.Request{Zone: "ttl", Key: freshKey(t), Limit: l, Cost: 1}
	key := s.Key(req.Zone, req.Key)

	d1 := take(t, s, req)[0]
	p1 := pttl(t, c, key)
	want1 := KeyTTL(d1.ResetAfter).Milliseconds()
	if p1 <= 0 || p1 > want1 || p1 < want1-200 || !msBetween(d1.ResetAfter, 719000, 720000) {
		t.Fatalf("after one take: PTTL %dms, reset-after %v; want PTTL ≈ KeyTTL(reset-after (720000ms)) = %dms", p1, d1.ResetAfter, want1)
	}
	d2 := take(t, s, req)[0]
	p2 := pttl(t, c, key)
	want2 := KeyTTL(d2.ResetAfter).Milliseconds()
	if p2 > want2 || p2 < want2-200 || p2 < p1+700000 {
		t.Fatalf("after two takes: PTTL %dms (before %dms), reset-after %v; want ≈ KeyTTL(reset-after) = %dms, refreshed", p2, p1, d2.ResetAfter, want2)
	}
	// A refusal writes nothing: the TTL is not refreshed.
	for range 3 {
		take(t, s, req)
	}
	if d := take(t, s, req)[0]; d.Allowed {
		t.Fatalf("sixth take allowed: %+v", d)
	}
	if p := pttl(t, c, key); p > want1+4*720000 {
		t.Fatalf("PTTL %dms after a refusal: more than after the last charge", p)
	}
	before := pttl(t, c, key)
	for range 5 {
		if d := take(t, s, req)[0]; d.Allowed {
			t.Fatalf("take on an empty bucket allowed: %+v", d)
		}
	}
	if after := pttl(t, c, key); after > before {
		t.Fatalf("refusals refreshed the TTL: %dms → %dms", before, after)
	}
}

func TestKeySchemaOnServer(t *testing.T) {
	srv := redistest.Start(t)
	def := newTestStore(t, srv.URL(), "", testTimeout, 0)
	app := newTestStore(t, srv.URL(), "app:", testTimeout, 0)
	l := limit(t, 10, time.Minute, 0)

	const email = "alice@example.com"
	sum := sha256.Sum256([]byte(email))
	hashed := "h1-" + hex.EncodeToString(sum[:16])
	alice := keyOf(t, email)
	ip4 := keyOf(t, "192.0.2.7:51234")   // port dropped
	ip6 := keyOf(t, "[2001:db8::1]:443") // masked to /64

	take(t, def, algorithms.Request{Zone: "api", Key: alice, Limit: l, Cost: 1},
		algorithms.Request{Zone: "login", Key: alice, Limit: l, Cost: 1})
	take(t, def, algorithms.Request{Zone: "api", Key: ip4, Limit: l, Cost: 1})
	take(t, def, algorithms.Request{Zone: "v6.zone_1", Key: ip6, Limit: l, Cost: 1})
	take(t, app, algorithms.Request{Zone: "api", Key: alice, Limit: l, Cost: 1})

	want := []string{
		"sluice:v1:api:{" + hashed + "}",
		"sluice:v1:login:{" + hashed + "}",
		"sluice:v1:api:{41-c0000207}",
		"sluice:v1:v6.zone_1:{6" + "1-20010db8000000000000000000000000}",
		"app:api:{" + hashed + "}",
	}
	got := scanAll(t, srv)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("keys on the server (SCAN):\n  %s\nwant exactly:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	shape := regexp.MustCompile(`^(sluice:v1:|app:)[A-Za-z0-9_.-]+:\{[0-9a-z-]+\}$`)
	for _, k := range got {
		if !shape.MatchString(k) {
			t.Errorf("key %q does not have the schema <prefix><zone>:{<token>}", k)
		}
		for _, raw := range []string{"alice", "example", "@"} {
			if strings.Contains(k, raw) {
				t.Errorf("key %q holds the raw identity (%q)", k, raw)
			}
		}
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Errorf("key %q: the hash tag is not the only braces", k)
		}
	}
	// Store.Key renders the identity token exactly as identity does.
	for _, raw := range []string{email, "10.1.2.3", "::1", "", "a}b{c", strings.Repeat("x", 5000)} {
		k := keyOf(t, raw)
		if got, want := def.Key("z", k), "sluice:v1:z:{"+identity.Token(k).String()+"}"; got != want {
			t.Errorf("Key(z, token of %.20q) = %q, want %q", raw, got, want)
		}
	}
}

func TestAllOrNothingThreeZones(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	c := srv.Client()
	id := freshKey(t)
	reqs := []algorithms.Request{
		{Zone: "a", Key: id, Limit: limit(t, 10, time.Hour, 0), Cost: 1},
		{Zone: "b", Key: id, Limit: limit(t, 10, time.Hour, 20), Cost: 2},
		{Zone: "c", Key: id, Limit: limit(t, 1, time.Hour, 0), Cost: 1},
	}
	keys := []string{s.Key("a", id), s.Key("b", id), s.Key("c", id)}
	snapshot := func() []string {
		var v []string
		for _, k := range keys {
			v = append(v, getRaw(t, c, k))
		}
		return v
	}

	out := take(t, s, reqs...) // loads the script too
	for i, d := range out {
		if !d.Allowed {
			t.Fatalf("first take, zone %s refused: %+v", reqs[i].Zone, d)
		}
	}
	before := snapshot()
	for i, v := range before {
		if v == "" {
			t.Fatalf("zone %s not charged by an allowed take", reqs[i].Zone)
		}
	}

	// c is empty now: the whole request is refused and nothing is charged.
	for round := range 5 {
		calls := scriptCalls(t, srv)
		out := take(t, s, reqs...)
		if n := scriptCalls(t, srv) - calls; n != 1 {
			t.Fatalf("round %d: %d script calls for one 3-zone Take, want 1", round, n)
		}
		if out[2].Allowed || out[2].RetryAfter <= 0 {
			t.Fatalf("round %d: zone c %+v, want refused", round, out[2])
		}
		// The zones that would allow report their uncharged view.
		if !out[0].Allowed || out[0].Remaining != 9 || !out[1].Allowed || out[1].Remaining != 18 {
			t.Fatalf("round %d: zones a, b = %+v, %+v; want allowed with remaining 9 and 18 (nothing charged)", round, out[0], out[1])
		}
		if after := snapshot(); !slices.Equal(after, before) {
			t.Fatalf("round %d: a refused request changed the stored state:\n before %q\n after  %q", round, before, after)
		}
	}

	// One script call per Take whatever the number of zones, allowed or not.
	for _, n := range []int{1, 2, 3} {
		id := freshKey(t)
		var rs []algorithms.Request
		for i := range n {
			rs = append(rs, algorithms.Request{Zone: string(rune('a' + i)), Key: id, Limit: limit(t, 3, time.Hour, 0), Cost: 1})
		}
		for i := range 4 { // 3 allowed, then refused
			calls := scriptCalls(t, srv)
			out := take(t, s, rs...)
			if got := scriptCalls(t, srv) - calls; got != 1 {
				t.Fatalf("%d zones, take %d: %d script calls, want 1", n, i, got)
			}
			if out[0].Allowed != (i < 3) {
				t.Fatalf("%d zones, take %d: %+v", n, i, out[0])
			}
		}
	}
}

// TestConcurrentTakesExact: 50 concurrent Takes on one key of capacity 20
// (no refill to speak of) admit exactly 20, every round.
func TestConcurrentTakesExact(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	l := limit(t, 20, time.Hour, 0)
	for round := range 20 {
		allowed, refused, errs := concurrentRound(s, l, freshKey(t), 50)
		if errs != 0 || allowed != 20 || refused != 30 {
			t.Fatalf("round %d: %d allowed, %d refused, %d errors; want exactly 20 allowed, 30 refused, 0 errors", round, allowed, refused, errs)
		}
	}

	// With the default timeout, a Take may give up after Redis charged
	// it, but never admits more than the capacity.
	fast := newTestStore(t, srv.URL(), "", DefaultTimeout, 0)
	totalErrs := 0
	var perRound []int
	for round := range 20 {
		allowed, refused, errs := concurrentRound(fast, l, freshKey(t), 50)
		totalErrs += errs
		perRound = append(perRound, errs)
		if allowed > 20 || (refused > 0 && allowed+errs < 20) || allowed+refused+errs != 50 {
			t.Fatalf("default timeout, round %d: %d allowed, %d refused, %d errors", round, allowed, refused, errs)
		}
	}
	t.Logf("default timeout %v: %d of 1000 concurrent Takes (20 rounds of 50) timed out or failed; per round %v", DefaultTimeout, totalErrs, perRound)
}

// concurrentRound fires n Takes of one key at once.
func concurrentRound(s *Store, l algorithms.Limit, key algorithms.Key, n int) (allowed, refused, errs int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out := make([]algorithms.Decision, 1)
			err := s.Take(context.Background(), []algorithms.Request{{Zone: "exact", Key: key, Limit: l, Cost: 1}}, out)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs++
			case out[0].Allowed:
				allowed++
			default:
				refused++
			}
		}()
	}
	close(start)
	wg.Wait()
	return
}
