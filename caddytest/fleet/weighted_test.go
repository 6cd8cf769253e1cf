package fleet_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// weightedAlgs: every algorithm, with the capacity 10 (no burst).
var weightedAlgs = []string{"token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log"}

// TestWeightedFleet: weighted requests through HTTP, 3 Caddy processes and
// one standalone Redis, for every algorithm:
//
//   - /w/<alg>: capacity 10 (events 10 per hour) and `cost 3`; 5 concurrent
//     requests for one key over the 3 processes: exactly 3 pass (remaining
//     7, 4 and 1, once each), 2 are refused with 1 remaining.
//   - /p/<alg>: capacity 10 and `cost {http.request.header.X-Cost}`; a
//     cost-11 request (more than the zone can ever admit) is refused with
//     429, not an error, and consumes nothing: no key is written for a
//     fresh key, the stored state is unchanged (GET) for a used one, and the
//     request that spends exactly what is left passes after it.
//
// The store pins `timeout 250ms`, as the exactness tests do (exact_test.go):
// a decision that times out follows the fail policy (open) and lets the
// request through unmetered, and on a two-core machine shared by three
// Caddy processes, Redis and the load, scheduling alone can push a healthy
// decision past the default. Such a request would pass here without rate
// limit headers, and fail the test.
func TestWeightedFleet(t *testing.T) {
	r := redistest.Start(t)
	store := "store redis " + r.URL() + " {\n\t\ttimeout 250ms\n\t}"
	var routes strings.Builder
	for _, alg := range weightedAlgs {
		for _, z := range []struct{ path, zone, cost string }{
			{"/w/" + alg, "w_" + alg, "3"},
			{"/p/" + alg, "p_" + alg, "{http.request.header.X-Cost}"},
		} {
			fmt.Fprintf(&routes, `handle %s {
	rate_limit {
		zone %s {
			key {http.request.header.X-User}
			events 10
			window 1h
			algorithm %s
			cost %s
		}
		%s
	}
	respond "ok"
}
`, z.path, z.zone, alg, z.cost, store)
		}
	}
	routes.WriteString(`respond "not here" 404`)
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("weighted-%d", i), "", routes.String())
	}
	c := newClient(5)
	defer c.CloseIdleConnections()

	for _, alg := range weightedAlgs {
		t.Run(alg, func(t *testing.T) {
			if alg == "fixed_window" || alg == "sliding_window" {
				// Windows aligned to the Unix epoch: what follows (well
				// under a second) must not straddle a whole UTC hour, where
				// a new window would admit more.
				avoidBoundary(t, time.Hour, 5*time.Second)
			}

			// Cost 3 against a capacity of 10, 5 concurrent requests.
			out := burst(t, c, procs, "/w/"+alg, 5, "w-"+alg+"-"+nonce)
			var passed []int
			refused := 0
			for i, res := range out {
				switch {
				case res.err != nil:
					t.Errorf("cost 3, request %d: %v", i, res.err)
				case !res.decided():
					t.Errorf("cost 3, request %d: no rate limit headers (undecided: the store failed?): %s", i, res)
				case res.code == 200:
					n, _ := strconv.Atoi(res.header.Get("X-Ratelimit-Remaining"))
					passed = append(passed, n)
				case res.code == 429:
					refused++
					expectRemaining(t, res, 10, 1, fmt.Sprintf("cost 3, refused request %d", i))
				default:
					t.Errorf("cost 3, request %d: %s", i, res)
				}
			}
			slices.Sort(passed)
			if len(passed) != 3 || refused != 2 || !slices.Equal(passed, []int{1, 4, 7}) {
				t.Errorf("cost 3 against capacity 10, 5 concurrent requests: %d passed (remaining %v), %d refused; want exactly 3 passed (remaining 1, 4, 7) and 2 refused",
					len(passed), passed, refused)
			}

			// A placeholder cost over the capacity, on a fresh key: a
			// refusal that writes nothing; then the full capacity passes.
			pattern := "sluice:v1:p_" + alg + ":{*}"
			fresh := "X-User: p-fresh-" + alg + "-" + nonce
			res := mustGet(t, c, procs[0].url("/p/"+alg), fresh, "X-Cost: 11")
			if expectCode(t, res, 429, "cost 11 on a fresh key") {
				expectRemaining(t, res, 10, 10, "cost 11 on a fresh key")
			}
			if keys := scanKeys(t, r, pattern); len(keys) != 0 {
				t.Errorf("cost 11 refused on a fresh key wrote %q", keys)
			}
			res = mustGet(t, c, procs[1].url("/p/"+alg), fresh, "X-Cost: 10")
			if expectCode(t, res, 200, "cost 10 after the refused cost 11") {
				expectRemaining(t, res, 10, 0, "cost 10 after the refused cost 11")
			}
			res = mustGet(t, c, procs[2].url("/p/"+alg), fresh, "X-Cost: 1")
			expectCode(t, res, 429, "cost 1 after spending the capacity")

			// The same on a key with something spent: the stored state is
			// unchanged by the refusal.
			used := "X-User: p-used-" + alg + "-" + nonce
			res = mustGet(t, c, procs[0].url("/p/"+alg), used, "X-Cost: 4")
			if expectCode(t, res, 200, "cost 4") {
				expectRemaining(t, res, 10, 6, "cost 4")
			}
			keys := scanKeys(t, r, pattern)
			if len(keys) != 2 {
				t.Fatalf("keys %s: %q, want 2 (the fresh key and this one)", pattern, keys)
			}
			states := map[string]string{}
			for _, k := range keys {
				states[k] = getString(t, r, k)
			}
			res = mustGet(t, c, procs[1].url("/p/"+alg), used, "X-Cost: 11")
			if expectCode(t, res, 429, "cost 11 with 6 left") {
				expectRemaining(t, res, 10, 6, "cost 11 with 6 left")
			}
			for _, k := range keys {
				if got := getString(t, r, k); got != states[k] {
					t.Errorf("cost 11 refused changed %s: was %q, now %q", k, states[k], got)
				}
			}
			res = mustGet(t, c, procs[2].url("/p/"+alg), used, "X-Cost: 6")
			if expectCode(t, res, 200, "cost 6 with 6 left, after the refused cost 11") {
				expectRemaining(t, res, 10, 0, "cost 6 with 6 left, after the refused cost 11")
			}
		})
	}
}
