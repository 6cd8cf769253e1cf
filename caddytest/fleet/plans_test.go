package fleet_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestDynamicLimitsFleet: limits chosen per request, through HTTP, 3 Caddy
// processes and one standalone Redis. A map turns X-Plan into the zone's
// events (none: 5, pro: 20, ent: 40; the window is an hour). In each round
// one key sends 30 requests as a free client, 40 as pro and 50 as
// enterprise, all 120 released together and spread over the 3 processes:
// exactly 5, 20 and 40 pass (each plan is a bucket of its own), each with
// its plan's X-RateLimit-Limit, every request decided (none failed open),
// and Redis holds exactly 3 keys for the key: the plain token for the
// default plan and one scoped token per other plan.
//
// The store pins `timeout 250ms`, as the exactness tests do (exact_test.go).
func TestDynamicLimitsFleet(t *testing.T) {
	r := redistest.Start(t)
	const zone = "dyn_plans"
	routes := fmt.Sprintf(`map {http.request.header.X-Plan} {plan_events} {
	pro 20
	ent 40
	default 5
}
rate_limit {
	zone %s {
		key {http.request.header.X-User}
		events {plan_events} 5
		window 1h
	}
	store redis %s {
		timeout 250ms
	}
}
respond "ok"`, zone, r.URL())
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("plans-%d", i), "", routes)
	}
	plans := []struct {
		plan            string
		requests, limit int
	}{{"", 30, 5}, {"pro", 40, 20}, {"ent", 50, 40}}
	c := newClient(120)
	defer c.CloseIdleConnections()

	for round := range 5 {
		user := "plans-" + nonce + "-" + strconv.Itoa(round)
		var reqs []*http.Request
		var planOf []int
		for p, pc := range plans {
			for i := range pc.requests {
				hdrs := []string{"X-User: " + user}
				if pc.plan != "" {
					hdrs = append(hdrs, "X-Plan: "+pc.plan)
				}
				req, err := newGet(procs[(len(reqs)+i)%len(procs)].url("/"), hdrs...)
				if err != nil {
					t.Fatal(err)
				}
				reqs = append(reqs, req)
				planOf = append(planOf, p)
			}
		}
		out := make([]result, len(reqs))
		var ready, wg sync.WaitGroup
		start := make(chan struct{})
		for i, req := range reqs {
			wg.Add(1)
			ready.Add(1)
			go func() {
				defer wg.Done()
				ready.Done()
				<-start
				out[i] = sendReq(c, req)
			}()
		}
		ready.Wait()
		close(start)
		wg.Wait()

		passed := make([]int, len(plans))
		for i, res := range out {
			pc := plans[planOf[i]]
			what := fmt.Sprintf("round %d, plan %q, request %d", round, pc.plan, i)
			switch {
			case res.err != nil:
				t.Errorf("%s: %v", what, res.err)
			case !res.decided():
				t.Errorf("%s: no rate limit headers (undecided: the store failed?): %s", what, res)
			case res.header.Get("X-Ratelimit-Limit") != strconv.Itoa(pc.limit):
				t.Errorf("%s: %s, want X-RateLimit-Limit %d", what, res, pc.limit)
			case res.code == http.StatusOK:
				passed[planOf[i]]++
			case res.code != http.StatusTooManyRequests:
				t.Errorf("%s: %s", what, res)
			}
		}
		for p, pc := range plans {
			if passed[p] != pc.limit {
				t.Errorf("round %d, plan %q: %d of %d concurrent requests over 3 processes passed, want exactly %d", round, pc.plan, passed[p], pc.requests, pc.limit)
			}
		}
	}

	// One key per plan and user: 5 rounds × (1 plain + 2 scoped).
	keys := scanKeys(t, r, "sluice:v1:"+zone+":{*}")
	plain, scoped := 0, 0
	for _, k := range keys {
		switch {
		case strings.Contains(k, ":{h1-"):
			plain++
		case strings.Contains(k, ":{s1-"):
			scoped++
		default:
			t.Errorf("unexpected key %q", k)
		}
	}
	if plain != 5 || scoped != 10 {
		t.Errorf("Redis holds %d plain and %d scoped keys (%q), want 5 and 10", plain, scoped, keys)
	}
}
