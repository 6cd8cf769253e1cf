package fleet_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// denyRoutes: /r, fixed_window 3 per day (a cached refusal would last
// until midnight UTC); /c/on and /c/off, 5 per minute, and /x/on and
// /x/off, 5 per 10 s, with the cost from X-Cost, through a store with the
// deny cache (on) and one without (off).
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
handle /x/off {
	rate_limit {
		zone dc_rand_off {
			key {http.request.header.X-User}
			events 5
			window 10s
			cost {http.request.header.X-Cost}
		}
		store redis %[1]s {
			timeout 250ms
			deny_cache off
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
//   - random: random costs sent to a zone with the cache and to one
//     without, in lockstep, through one process: the same statuses,
//     X-RateLimit-Remaining and Retry-After (within a second: the two keys'
//     requests are a millisecond or so apart, and Retry-After is rounded
//     up to the second; the exact comparison, to the millisecond, is
//     redisstore's TestDenyCacheMatchesRedis). One process: a cached answer is Redis's exactly when
//     nobody else spent on the key since the refusal it remembers;
//     requests through other processes are such spending, and make it err
//     on the lenient side (package denycache).
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
		on, off := "X-User: rand-on-"+nonce, "X-User: rand-off-"+nonce
		local := 0
		for i := range 60 {
			cost := "X-Cost: " + strconv.Itoa(1+rng.IntN(6))
			p := procs[0]
			want := mustGet(t, c, p.url("/x/off"), off, cost)
			n := scripts()
			got := mustGet(t, c, p.url("/x/on"), on, cost)
			if scripts() == n {
				local++
			}
			what := fmt.Sprintf("request %d (%s)", i, cost)
			if got.code != want.code || got.header.Get("X-Ratelimit-Remaining") != want.header.Get("X-Ratelimit-Remaining") {
				t.Fatalf("%s: with the deny cache %s, without %s", what, got, want)
			}
			if ra, wa := retryAfter(got), retryAfter(want); ra > wa+1 || ra < wa-1 {
				t.Fatalf("%s: with the deny cache Retry-After %d, without %d (%s / %s)", what, ra, wa, got, want)
			}
			time.Sleep(time.Duration(rng.IntN(250)) * time.Millisecond)
		}
		t.Logf("60 requests, %d answered from a deny cache", local)
		if local < 10 {
			t.Errorf("only %d answers from a deny cache: barely exercised", local)
		}
	})
}
