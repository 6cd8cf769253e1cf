package redisstore

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// denyStore is a store with the default breaker and deny cache, armed (its
// first poll of Redis done: see watch.go).
func denyStore(t testing.TB, srv *redistest.Server, size int) *Store {
	t.Helper()
	o := defaultOptions()
	o.DenySize, o.Target = size, "test "+t.Name()
	s := storeAt(t, srv.URL(), testTimeout, o)
	waitArmed(t, s)
	return s
}

// waitArmed waits until s's deny cache (if any) is armed.
func waitArmed(t testing.TB, s *Store) {
	t.Helper()
	for start := time.Now(); s.deny != nil && !s.deny.Armed(); time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("the deny cache is not armed 5 s after the store started: its poll of Redis fails")
		}
	}
}

// TestDenyCacheAnswersLocally: once Redis refuses a request, the same
// request (or one of a higher cost) is refused without a script call,
// with Redis's Retry-After; the request's other zones are reported allowed
// and nothing is charged; a cost the key can pay goes to Redis.
func TestDenyCacheAnswersLocally(t *testing.T) {
	srv := redistest.Start(t)
	s := denyStore(t, srv, 1000)
	l := limit(t, 5, time.Hour, 0)
	a := algorithms.Request{Zone: "dA", Key: freshKey(t), Limit: l, Cost: 2}
	b := algorithms.Request{Zone: "dB", Key: freshKey(t), Limit: l, Cost: 1}
	take(t, s, a)
	take(t, s, a)
	first := take(t, s, a)[0] // debt 4 of 5: cost 2 refused
	if first.Allowed {
		t.Fatalf("third cost-2 take: %+v, want refused", first)
	}
	take(t, s, a, b) // refused by Redis: the cache now knows both zones
	bState := getRaw(t, srv.Client(), s.Key(b.Zone, b.Key))
	calls := scriptCalls(t, srv)
	for i := range 200 {
		out := take(t, s, a, b)
		if out[0].Allowed || out[0].RetryAfter <= 0 || out[0].RetryAfter > first.RetryAfter {
			t.Fatalf("local refusal %d: %+v (Redis said %v)", i, out[0], first.RetryAfter)
		}
		if !out[1].Allowed || out[1].Limit != 5 {
			t.Fatalf("local refusal %d: the other zone %+v, want allowed (vetoed)", i, out[1])
		}
	}
	if n := scriptCalls(t, srv) - calls; n != 0 {
		t.Fatalf("%d script calls for 200 refused requests, want 0", n)
	}
	if got := getRaw(t, srv.Client(), s.Key(b.Zone, b.Key)); got != bState {
		t.Fatalf("the vetoed zone was charged: %q → %q", bState, got)
	}
	t.Logf("200 refusals of a refused key: 0 script calls (deny cache holds %d)", s.DenyCache().Len())
	// A smaller cost may pass: Redis decides.
	small := a
	small.Cost = 1
	if d := take(t, s, small)[0]; !d.Allowed || scriptCalls(t, srv)-calls != 1 {
		t.Fatalf("cost 1 after a cost-2 refusal: %+v, want allowed by Redis", d)
	}
}

// TestDenyCacheExpires: a denial ends when Redis's Retry-After does (less
// the margin), and Redis decides again.
func TestDenyCacheExpires(t *testing.T) {
	srv := redistest.Start(t)
	s := denyStore(t, srv, 1000)
	l := limit(t, 2, 400*time.Millisecond, 0) // one token per 200ms
	r := algorithms.Request{Zone: "exp", Key: freshKey(t), Limit: l, Cost: 1}
	take(t, s, r)
	take(t, s, r)
	start := time.Now()
	d := take(t, s, r)[0]
	if d.Allowed {
		t.Fatalf("third take: %+v", d)
	}
	calls := scriptCalls(t, srv)
	var allowedAt time.Duration
	for time.Since(start) < 2*time.Second {
		out := take(t, s, r)[0]
		if out.Allowed {
			allowedAt = time.Since(start)
			break
		}
		time.Sleep(time.Millisecond)
	}
	redisCalls := scriptCalls(t, srv) - calls
	t.Logf("refused with Retry-After %v; allowed again %v later after %d script calls", d.RetryAfter, allowedAt, redisCalls)
	if allowedAt == 0 || allowedAt > d.RetryAfter+100*time.Millisecond {
		t.Fatalf("allowed again after %v, want about %v", allowedAt, d.RetryAfter)
	}
	if allowedAt < d.RetryAfter-Margin(d.RetryAfter)-5*time.Millisecond {
		t.Fatalf("allowed after %v, before Redis's Retry-After %v", allowedAt, d.RetryAfter)
	}
	if redisCalls > 10 {
		t.Fatalf("%d script calls while the key was refused, want a handful (around the release)", redisCalls)
	}
}

// Margin is how much sooner than its Retry-After R the deny cache may
// release a refused request (package denycache: its conservative estimate
// of Redis's time runs 0.1% fast, rounded up to the millisecond).
func Margin(r time.Duration) time.Duration { return time.Millisecond + r/1000 }

// TestDenyCacheInvalidation: a changed limit and an admin reset (on this
// instance) end a denial at once.
func TestDenyCacheInvalidation(t *testing.T) {
	srv := redistest.Start(t)
	s := denyStore(t, srv, 1000)
	la := limit(t, 3, time.Hour, 0)
	r := algorithms.Request{Zone: "inv", Key: freshKey(t), Limit: la, Cost: 1}
	exhaust := func() {
		for i := 0; i < 10 && take(t, s, r)[0].Allowed; i++ {
		}
		calls := scriptCalls(t, srv)
		if d := take(t, s, r)[0]; d.Allowed || scriptCalls(t, srv) != calls {
			t.Fatalf("exhausted key: %+v, %d script calls; want a local refusal", d, scriptCalls(t, srv)-calls)
		}
	}
	exhaust()
	// The limit raised (a reload): Redis decides, and admits.
	raised := r
	raised.Limit = limit(t, 10, time.Hour, 0)
	calls := scriptCalls(t, srv)
	if d := take(t, s, raised)[0]; !d.Allowed || scriptCalls(t, srv)-calls != 1 {
		t.Fatalf("after raising the limit: %+v (%d script calls), want allowed by Redis", d, scriptCalls(t, srv)-calls)
	}
	// An admin reset.
	exhaust()
	if _, err := s.ResetKeys(context.Background(), r.Zone, []algorithms.Key{r.Key}); err != nil {
		t.Fatal(err)
	}
	if d := take(t, s, r)[0]; !d.Allowed || d.Remaining != 2 {
		t.Fatalf("after an admin reset: %+v, want allowed, remaining 2", d)
	}
}

// TestDenyCacheBounded: refusing far more keys than the cache holds keeps
// it at its size.
func TestDenyCacheBounded(t *testing.T) {
	srv := redistest.Start(t)
	s := denyStore(t, srv, 64)
	l := limit(t, 1, time.Hour, 0)
	for i := range 400 {
		r := algorithms.Request{Zone: "bnd", Key: freshKey(t), Limit: l, Cost: 1}
		take(t, s, r)
		if take(t, s, r)[0].Allowed {
			t.Fatalf("key %d: second take allowed", i)
		}
		if n := s.DenyCache().Len(); n > s.DenyCache().Cap() {
			t.Fatalf("after %d refused keys the cache holds %d, cap %d", i+1, n, s.DenyCache().Cap())
		}
	}
	t.Logf("400 refused keys: the cache holds %d (cap %d)", s.DenyCache().Len(), s.DenyCache().Cap())
}

// TestDenyCacheSoundEveryAlgorithm is the soundness property against a real
// Redis: random traffic (a few keys, random costs and pauses, short
// windows); after every local refusal the same request is sent at once to
// Redis through a store without a cache. Redis ran it at some instant
// before the check returned; if Redis admitted it and that instant was
// still before the moment the cache would have released the key, the cache
// refused what Redis allowed. (The check's own charges are just another
// instance spending.)
func TestDenyCacheSoundEveryAlgorithm(t *testing.T) {
	algs := []algorithms.Algorithm{algorithms.TokenBucket, algorithms.GCRA, algorithms.FixedWindow, algorithms.SlidingWindow, algorithms.SlidingLog}
	srv := redistest.Start(t)
	for _, alg := range algs {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			cached := denyStore(t, srv, 1000)
			check := newTestStore(t, srv.URL(), "", testTimeout, 0)
			l := limitOf(t, alg, 6, 300*time.Millisecond, 0)
			keys := []algorithms.Key{freshKey(t), freshKey(t), freshKey(t)}
			rng := rand.New(rand.NewPCG(uint64(alg)+1, 7))
			var hits, checked, local, redisAllowed, redisRefused int
			// Until 60 local refusals were checked (or 3000 requests, or
			// 20 s on a loaded machine: each request reads INFO twice).
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; i < 3000 && hits < 60 && time.Now().Before(deadline); i++ {
				r := algorithms.Request{Zone: "snd", Key: keys[rng.IntN(len(keys))], Limit: l, Cost: 1 + rng.Int64N(3)}
				calls := scriptCalls(t, srv)
				before := time.Now()
				out := make([]algorithms.Decision, 1)
				if err := cached.Take(context.Background(), []algorithms.Request{r}, out); err != nil {
					t.Fatal(err)
				}
				if out[0].Allowed {
					redisAllowed++
				} else if scriptCalls(t, srv) == calls {
					// Answered locally: the cache releases the key no
					// sooner than before + RetryAfter − 1ms − margin.
					hits++
					release := before.Add(out[0].RetryAfter - Margin(out[0].RetryAfter) - time.Millisecond)
					chk := make([]algorithms.Decision, 1)
					if err := check.Take(context.Background(), []algorithms.Request{r}, chk); err != nil {
						t.Fatal(err)
					}
					checked++
					if chk[0].Allowed && time.Now().Before(release) {
						t.Fatalf("request %d (cost %d): refused locally (Retry-After %v) but Redis admitted it %v before the cache's release",
							i, r.Cost, out[0].RetryAfter, time.Until(release))
					}
					if !chk[0].Allowed {
						local++
					}
				} else {
					redisRefused++
				}
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			}
			t.Logf("%s: %d allowed, %d refused by Redis, %d refused locally (%d confirmed refused by Redis right after)",
				alg, redisAllowed, redisRefused, hits, local)
			if hits < 20 {
				t.Fatalf("only %d local refusals: the property was barely exercised", hits)
			}
		})
	}
}

// BenchmarkTakeGuards measures what the breaker and the deny cache add to a
// healthy Take (one zone, allowed): the guards disabled, the breaker alone,
// both with an empty cache, both with a cache holding another key's
// denial (every Take then looks up), and a deny-cache hit (no Redis call).
func BenchmarkTakeGuards(b *testing.B) {
	srv := redistest.Start(b)
	l := limit(b, 1<<30, time.Hour, 0)
	for _, tc := range []struct {
		name     string
		failures int
		deny     int
		other    bool
		hit      bool
	}{
		{"none", 0, 0, false, false},
		{"breaker", 5, 0, false, false},
		{"breaker+deny_empty", 5, 1000, false, false},
		{"breaker+deny_active_miss", 5, 1000, true, false},
		{"deny_hit", 5, 1000, false, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := connConfig{URL: srv.URL(), Timeout: testTimeout, Prefix: DefaultKeyPrefix}
			c, _, _ := cfg.newClient()
			o := defaultOptions()
			o.Failures, o.DenySize, o.Target = tc.failures, tc.deny, "bench"
			s := newStoreWith(c, false, DefaultKeyPrefix, testTimeout, o)
			defer s.Destruct()
			waitArmed(b, s)
			req := []algorithms.Request{{Zone: "bench", Key: freshKey(b), Limit: l, Cost: 1}}
			// A refusal by Redis: a key of a limit of 1 per hour, taken twice.
			refuse := func(r algorithms.Request) {
				r.Limit = limit(b, 1, time.Hour, 0)
				take(b, s, r)
				if take(b, s, r)[0].Allowed || s.deny.Len() == 0 {
					b.Fatal("the second take of 1 per hour was allowed, or not cached")
				}
			}
			if tc.other {
				refuse(algorithms.Request{Zone: "bench", Key: freshKey(b), Cost: 1})
			}
			if tc.hit {
				req[0].Limit = limit(b, 1, time.Hour, 0)
				refuse(req[0])
			}
			out := make([]algorithms.Decision, 1)
			b.ReportAllocs()
			for b.Loop() {
				if err := s.Take(context.Background(), req, out); err != nil || out[0].Allowed == tc.hit {
					b.Fatal(err, out[0])
				}
			}
		})
	}
}
