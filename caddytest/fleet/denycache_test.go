package fleet_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/redisstore"
)

// denyRoutes: /r, fixed_window 3 per day (a cached refusal would last
// until midnight UTC); /c/on and /c/off, 5 per minute with the cost from
// X-Cost, through a store with the deny cache (on) and one without (off);
// /x/on, 5 per 10 s with the cost from X-Cost, with the deny cache.
const denyRoutes = `handle /r {
	rate_limit {
		zone dc_reset {
			key {http.request.header.X-User}
			events 3
			window 24h
			algorithm fixed_window
		}
		store redis %[1]s {
			timeout 250ms
		}
	}
	respond "ok"
}
handle /c/on {
	rate_limit {
		zone dc_cost_on {
			key {http.request.header.X-User}
			events 5
			window 1m
			cost {http.request.header.X-Cost}
		}
		store redis %[1]s {
			timeout 250ms
		}
	}
	respond "ok"
}
handle /c/off {
	rate_limit {
		zone dc_cost_off {
			key {http.request.header.X-User}
			events 5
			window 1m
			cost {http.request.header.X-Cost}
		}
		store redis %[1]s {
			timeout 250ms
			deny_cache off
		}
	}
	respond "ok"
}
handle /x/on {
	rate_limit {
		zone dc_rand_on {
			key {http.request.header.X-User}
			events 5
			window 10s
			cost {http.request.header.X-Cost}
		}
		store redis %[1]s {
			timeout 250ms
		}
	}
	respond "ok"
}
respond "not here" 404`

// TestDenyCacheFleet: the deny cache of three Caddy processes sharing one
// Redis (issue 13, items 2 to 4):
//
//   - reset: each process refuses a client from its own cache; an admin
//     reset (DELETE /rate_limit/zones/<zone>/keys/<key>) through one
//     process unblocks the client on all three within about a second;
//   - flushall: the same after a FLUSHALL of the Redis;
//   - cost: with `cost {http.request.header.X-Cost}`, the issue's
//     sequences 5, 1, 5 and 4, 2, 1, 3 end with the answer Redis gives
//     without the cache (Retry-After 60, then 36, Remaining 0), with the
//     cache and without;
//   - random: random costs through one process, with the cache: every
//     answer served from the cache is what Redis answers the same request
//     right after, without charging it (its stored state and time, read
//     together, through the script's Go twin): status, Remaining and
//     Retry-After (the cache on vs off, in lockstep, would differ by the
//     milliseconds between the two keys' requests: redisstore's
//     TestDenyCacheMatchesRedis is the same oracle, to the millisecond).
func TestDenyCacheFleet(t *testing.T) {
	r := redistest.Start(t)
	routes := fmt.Sprintf(denyRoutes, r.URL())
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("deny-%d", i), "", routes)
	}
	c := newClient(4)
	defer c.CloseIdleConnections()
	scripts := func() int64 { return scriptCalls(t, r).calls() }

	// exhaust spends user's 3 of /r and checks that every process then
	// refuses it from its deny cache (no script call).
	exhaust := func(t *testing.T, user string) {
		t.Helper()
		for i := range 3 {
			expectCode(t, mustGet(t, c, procs[i].url("/r"), user), 200, fmt.Sprintf("request %d of 3", i+1))
		}
		for i, p := range procs {
			took, ok := waitFor(3*time.Second, func() bool {
				n := scripts()
				res := mustGet(t, c, p.url("/r"), user)
				return res.code == 429 && scripts() == n
			})
			if !ok {
				t.Fatalf("process %d: the exhausted client is not refused from the deny cache after %v", i, took)
			}
		}
	}
	// unblocked waits until every process admits user again, and checks
	// that each did within about a second of since.
	unblocked := func(t *testing.T, user, after string, since time.Time) {
		t.Helper()
		for i, p := range procs {
			var last result
			_, ok := waitFor(3*time.Second, func() bool {
				last = mustGet(t, c, p.url("/r"), user)
				return last.code == 200
			})
			took := time.Since(since) - last.dur // when the last request was sent
			if !ok {
				t.Errorf("process %d: still %s %v after %s", i, last, took.Round(time.Millisecond), after)
				continue
			}
			t.Logf("process %d: allowed %v after %s", i, took.Round(time.Millisecond), after)
			if took > 1500*time.Millisecond {
				t.Errorf("process %d: allowed only %v after %s, want about a second at most", i, took, after)
			}
		}
	}

	t.Run("reset", func(t *testing.T) {
		user := "reset-" + nonce
		exhaust(t, "X-User: "+user)
		req, err := http.NewRequest(http.MethodDelete, procs[0].adminURL("/rate_limit/zones/dc_reset/keys/"+url.PathEscape(user)), nil)
		if err != nil {
			t.Fatal(err)
		}
		reset := time.Now()
		res := sendReq(c, req)
		if res.err != nil || res.code != 200 || !strings.Contains(res.body, `"deleted":1`) {
			t.Fatalf("DELETE through process 0: %s", res)
		}
		unblocked(t, "X-User: "+user, "the reset through process 0", reset)
	})

	t.Run("flushall", func(t *testing.T) {
		user := "X-User: flush-" + nonce
		exhaust(t, user)
		flushed := time.Now()
		r.Do(t, "FLUSHALL")
		unblocked(t, user, "FLUSHALL", flushed)
	})

	t.Run("cost", func(t *testing.T) {
		for _, tc := range []struct {
			costs []int
			retry int
		}{{[]int{5, 1, 5}, 60}, {[]int{4, 2, 1, 3}, 36}} {
			for _, side := range []string{"on", "off"} {
				user := fmt.Sprintf("X-User: cost-%s-%v-%s", side, tc.costs, nonce)
				var last result
				for _, cost := range tc.costs { // one process: one deny cache
					last = mustGet(t, c, procs[0].url("/c/"+side), user, "X-Cost: "+strconv.Itoa(cost))
				}
				if expectCode(t, last, 429, fmt.Sprintf("%s: the last of %v", side, tc.costs)) {
					expectRemaining(t, last, 5, 0, fmt.Sprintf("%s: the last of %v", side, tc.costs))
					if got := retryAfter(last); got != tc.retry {
						t.Errorf("%s: the last of %v: Retry-After %d, want %d (%s)", side, tc.costs, got, tc.retry, last)
					}
				}
			}
		}
	})

	t.Run("random", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(5, 77))
		user := "X-User: rand-" + nonce
		lim, err := algorithms.NewLimit(algorithms.TokenBucket, 5, 10*time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		key := ""
		local, direct := 0, 0
		for i := range 80 {
			cost := 1 + rng.Int64N(6)
			began := time.Now()
			n := scripts()
			res := mustGet(t, c, procs[0].url("/x/on"), user, "X-Cost: "+strconv.FormatInt(cost, 10))
			cached := scripts() == n
			if key == "" {
				key = onlyKey(t, r, "sluice:v1:dc_rand_on:{*}")
			}
			if !cached {
				time.Sleep(time.Duration(rng.IntN(250)) * time.Millisecond)
				continue
			}
			local++
			// What Redis answers this request, without charging it: its
			// stored state and time, read together, through the
			// script's Go twin; at Redis's time, or (a token refilled in
			// between) at an instant since the request began.
			raw, now := stateAndTime(t, r, key)
			st, ok := redisstore.DecodeState(raw)
			took := time.Since(began).Milliseconds()
			match := func(at int64) bool {
				d, _, _ := algorithms.Step(st, !ok, lim, at, cost)
				return !d.Allowed && res.code == 429 &&
					res.header.Get("X-Ratelimit-Remaining") == strconv.FormatInt(d.Remaining, 10) &&
					int64(retryAfter(res)) == max(1, (d.RetryAfter.Milliseconds()+999)/1000)
			}
			if match(now) {
				direct++
			} else {
				found := false
				for at := now - took - 5; at <= now+5 && !found; at++ {
					found = match(at)
				}
				if !found {
					d, _, _ := algorithms.Step(st, !ok, lim, now, cost)
					t.Fatalf("request %d (cost %d): the deny cache answered %s; Redis answers %+v", i, cost, res, d)
				}
			}
			time.Sleep(time.Duration(rng.IntN(250)) * time.Millisecond)
		}
		t.Logf("80 requests, %d answered from the deny cache: %d as Redis answers right after, %d at a boundary crossed in between",
			local, direct, local-direct)
		if local < 20 {
			t.Errorf("only %d answers from the deny cache: barely exercised", local)
		}
	})
}

// stateAndTime reads a key's stored value ("" for none) and Redis's time
// (Unix ms, as the script computes it), in one transaction.
func stateAndTime(t *testing.T, r *redistest.Server, key string) (string, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var get *redis.StringCmd
	var tm *redis.TimeCmd
	if _, err := r.Client().TxPipelined(ctx, func(p redis.Pipeliner) error {
		get, tm = p.Get(ctx, key), p.Time(ctx)
		return nil
	}); err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	raw, _ := get.Result()
	return raw, tm.Val().UnixMilli()
}
