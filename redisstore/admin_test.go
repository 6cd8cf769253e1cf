package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// The admin API's peek reads a key without the decision script: it decodes
// the value the Lua twin stored (DecodeState) and views it with
// the Go twin (algorithms.Peek). This checks that view against the Lua
// twin's own, on values the Lua twin actually wrote to a real Redis: after
// each random step (the test entry point, time in ARGV), at a later
// instant, the stored value is copied to scratch keys on which the script
// runs with cost 0 (Remaining, ResetAfter) and with cost 1 (Allowed,
// RetryAfter). Some peeks use another limit than the writes did (a
// changed events, window or algorithm), as after a config reload.
func TestPeekDecodesLuaState(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := testCtx(t)
	type lim = algorithms.Limit
	L := func(alg algorithms.Algorithm, events int64, window time.Duration, burst int64) lim {
		return limitOf(t, alg, events, window, burst)
	}
	TB, G, SW, FW, SL := algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow, algorithms.FixedWindow, algorithms.SlidingLog
	sets := [][]lim{
		{L(TB, 7, time.Second, 0), L(TB, 10, time.Minute, 25), L(TB, 3, 7*time.Millisecond, 5), L(TB, 13, 7*time.Second, 20)},
		{L(G, 7, time.Second, 0), L(G, 10, time.Minute, 25), L(G, 3, 7*time.Millisecond, 5), L(G, 983, time.Second, 0)},
		{L(SW, 7, time.Second, 0), L(SW, 10, time.Minute, 0), L(SW, 3, 7*time.Millisecond, 0), L(SW, 13, 7*time.Second, 0)},
		{L(FW, 7, time.Second, 0), L(FW, 10, time.Minute, 0), L(FW, 3, 7*time.Millisecond, 0), L(FW, 5, 13*time.Second, 0)},
		{L(SL, 7, time.Second, 0), L(SL, 10, time.Minute, 0), L(SL, 3, 7*time.Millisecond, 0), L(SL, 13, 7*time.Second, 0)},
		{L(TB, 7, time.Second, 0), L(G, 7, time.Second, 0), L(SW, 7, time.Second, 0), L(FW, 7, time.Second, 0), L(SL, 7, time.Second, 0)},
	}
	run := func(key string, l lim, now, cost int64) []int64 {
		t.Helper()
		r := algorithms.Request{Limit: l, Cost: cost}
		res, err := runTwin(ctx, c, []string{key}, luaArgs([]any{now}, false, r)...)
		if err != nil || len(res) != 4 {
			t.Fatalf("script: %v %v", res, err)
		}
		return res
	}
	const steps = 200
	checked := 0
	for si, set := range sets {
		for li, l := range set {
			t.Run(fmt.Sprintf("%d/%s", si, limitString(l)), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(twinSeed, uint64(9000+100*si+li)))
				key := fmt.Sprintf("peek:%d:%d", si, li)
				srv.Do(t, "DEL", key)
				now := int64(1_700_000_000_000)
				for step := 0; step < steps; step++ {
					now += advance(rng, l)
					run(key, l, now, cost(rng, l))

					raw, err := c.Get(ctx, key).Result()
					if err == redis.Nil {
						raw = ""
					} else if err != nil {
						t.Fatal(err)
					}
					// Peek a little later, usually under the same limit.
					at := now + advance(rng, l)/2
					pl := l
					if rng.IntN(5) == 0 {
						pl = set[rng.IntN(len(set))]
					}
					st, ok := DecodeState(raw)
					if raw != "" && !ok {
						t.Fatalf("step %d: DecodeState(%q) failed on a value the script wrote", step, raw)
					}
					got := algorithms.Peek(st, !ok, pl, at)

					var zero, one []int64
					for i, cost := range []int64{0, 1} {
						scratch := key + ":scratch"
						if raw == "" {
							srv.Do(t, "DEL", scratch)
						} else {
							srv.Do(t, "SET", scratch, raw)
						}
						res := run(scratch, pl, at, cost)
						if i == 0 {
							zero = res
						} else {
							one = res
						}
					}
					want := algorithms.Decision{
						Allowed:    one[0] == 1,
						Limit:      pl.Capacity(),
						Remaining:  zero[1],
						RetryAfter: time.Duration(one[2]) * time.Millisecond,
						ResetAfter: time.Duration(zero[3]) * time.Millisecond,
					}
					if got != want {
						t.Fatalf("step %d: stored %q (written under %s), peeked at +%dms under %s:\n Go peek %+v\n Lua     %+v",
							step, raw, limitString(l), at-now, limitString(pl), got, want)
					}
					checked++
				}
			})
		}
	}
	t.Logf("%d peeks of Lua-written state matched the Lua twin", checked)
}

// The store's peek charges nothing and writes nothing (no script runs, the
// stored value and its TTL are untouched): after two peeks, the next
// request sees what it would have seen without them. A reset deletes the
// key: the next request sees a full allowance.
func TestStorePeekAndReset(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", testTimeout, 0)
	ctx := testCtx(t)
	for _, alg := range []algorithms.Algorithm{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindow,
		algorithms.FixedWindow, algorithms.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			l := limitOf(t, alg, 5, time.Hour, 0)
			k, absent := freshKey(t), freshKey(t)
			zone := "admin_" + alg.String()
			name := s.Key(zone, k)
			for i := 0; i < 3; i++ {
				take(t, s, algorithms.Request{Zone: zone, Key: k, Limit: l, Cost: 1})
			}
			raw, ttl := getRaw(t, s.Client(), name), pttl(t, s.Client(), name)
			scripts := scriptCalls(t, srv)

			keys := []algorithms.Key{k, absent}
			out := make([]algorithms.Decision, 2)
			found := make([]bool, 2)
			for i := 0; i < 2; i++ {
				if err := s.PeekKeys(ctx, zone, keys, l, out, found); err != nil {
					t.Fatalf("PeekKeys: %v", err)
				}
				if !found[0] || out[0].Remaining != 2 || !out[0].Allowed || out[0].Limit != 5 || out[0].ResetAfter <= 0 {
					t.Fatalf("peek %d: %+v found %v, want 2 of 5 remaining", i, out[0], found[0])
				}
				if found[1] || out[1].Remaining != 5 || out[1].ResetAfter != 0 {
					t.Fatalf("peek %d of an absent key: %+v found %v, want fresh", i, out[1], found[1])
				}
			}
			if got := scriptCalls(t, srv); got != scripts {
				t.Fatalf("the peeks ran %d scripts", got-scripts)
			}
			if got := getRaw(t, s.Client(), name); got != raw {
				t.Fatalf("the peeks changed the stored value: %q, was %q", got, raw)
			}
			if got := pttl(t, s.Client(), name); got > ttl {
				t.Fatalf("the peeks refreshed the TTL: %dms, was %dms", got, ttl)
			}
			if getRaw(t, s.Client(), s.Key(zone, absent)) != "" {
				t.Fatal("the peek of an absent key created it")
			}

			d := take(t, s, algorithms.Request{Zone: zone, Key: k, Limit: l, Cost: 1})[0]
			if !d.Allowed || d.Remaining != 1 {
				t.Fatalf("the request after the peeks: %+v, want allowed with 1 remaining", d)
			}
			take(t, s, algorithms.Request{Zone: zone, Key: k, Limit: l, Cost: 1})
			refused := take(t, s, algorithms.Request{Zone: zone, Key: k, Limit: l, Cost: 1})[0]
			if refused.Allowed {
				t.Fatalf("the 6th request of 5 was allowed: %+v", refused)
			}
			if err := s.PeekKeys(ctx, zone, keys[:1], l, out[:1], found[:1]); err != nil {
				t.Fatal(err)
			}
			// The refusal and the peek read Redis's clock a moment apart.
			if !found[0] || out[0].Allowed || out[0].Remaining != 0 || out[0].RetryAfter <= 0 ||
				out[0].RetryAfter > refused.RetryAfter || refused.RetryAfter-out[0].RetryAfter > time.Second {
				t.Fatalf("peek of the exhausted key: %+v, want refused with about the refusal's Retry-After (%v)", out[0], refused.RetryAfter)
			}

			n, err := s.ResetKeys(ctx, zone, keys)
			if err != nil || n != 1 {
				t.Fatalf("ResetKeys = %d, %v; want 1 (only one of the keys existed)", n, err)
			}
			if getRaw(t, s.Client(), name) != "" {
				t.Fatal("the key survived the reset")
			}
			if d := take(t, s, algorithms.Request{Zone: zone, Key: k, Limit: l, Cost: 1})[0]; !d.Allowed || d.Remaining != 4 {
				t.Fatalf("after the reset: %+v, want allowed with 4 remaining", d)
			}
		})
	}
}

// In a Cluster, one client's candidate keys live in different slots (the
// token, candidate index included, is the hash tag): the peek asks each
// key's own master, and the reset deletes across slots.
func TestClusterPeekAndReset(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s := newClusterStore(t, c.Addrs(), testTimeout)
	ctx := testCtx(t)
	l := limit(t, 4, time.Hour, 0)
	var keys []algorithms.Key
	for i := range c.Nodes {
		keys = append(keys, keyOnNode(t, s, c, i))
	}
	for i, k := range keys {
		for range i + 1 {
			take(t, s, algorithms.Request{Zone: "z", Key: k, Limit: l, Cost: 1})
		}
	}
	out := make([]algorithms.Decision, len(keys))
	found := make([]bool, len(keys))
	for range 2 {
		if err := s.PeekKeys(ctx, "z", keys, l, out, found); err != nil {
			t.Fatalf("PeekKeys: %v", err)
		}
		for i := range keys {
			if !found[i] || out[i].Remaining != int64(4-(i+1)) {
				t.Fatalf("key on node %d: %+v found %v, want %d remaining", i, out[i], found[i], 4-(i+1))
			}
		}
	}
	n, err := s.ResetKeys(ctx, "z", keys)
	if err != nil || n != len(keys) {
		t.Fatalf("ResetKeys = %d, %v; want %d", n, err, len(keys))
	}
	if err := s.PeekKeys(ctx, "z", keys, l, out, found); err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if found[i] || out[i].Remaining != 4 {
			t.Fatalf("key on node %d after the reset: %+v found %v, want fresh", i, out[i], found[i])
		}
	}
}

// An unreachable Redis is an error, within the admin timeout.
func TestPeekUnreachable(t *testing.T) {
	port := redistest.FreePort(t)
	s := newTestStore(t, "redis://127.0.0.1:"+strconv.Itoa(port), "", 50*time.Millisecond, 0)
	start := time.Now()
	out := make([]algorithms.Decision, 1)
	if err := s.PeekKeys(context.Background(), "z", []algorithms.Key{freshKey(t)}, limit(t, 1, time.Second, 0), out, make([]bool, 1)); err == nil {
		t.Fatal("PeekKeys against nothing succeeded")
	}
	if _, err := s.ResetKeys(context.Background(), "z", []algorithms.Key{freshKey(t)}); err == nil {
		t.Fatal("ResetKeys against nothing succeeded")
	}
	if el := time.Since(start); el > 2*minAdminTimeout+failMargin {
		t.Fatalf("took %v", el)
	}
}
