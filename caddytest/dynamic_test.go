package caddytest_test

import (
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// planCase is one plan of the concurrent dynamic-limit tests: the X-Plan
// header value ("" for none: the zone's default), how many requests are
// sent with it at once, and its limit.
type planCase struct {
	plan     string
	requests int
	limit    int
}

// dynamicPlans: one key on three plans at once. Each plan is its own
// bucket, so exactly each plan's limit passes; the window is an hour, so
// nothing refills within a round.
var dynamicPlans = []planCase{{"", 30, 5}, {"pro", 40, 20}, {"ent", 50, 40}}

// dynamicPlansSite maps X-Plan to the zone's events, with 5 as the default.
const dynamicPlansSite = `
	map {http.request.header.X-Plan} {plan_events} {
		pro 20
		ent 40
		default 5
	}
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events {plan_events} 5
			window 1h
		}
	}
	respond "ok"
`

// TestDynamicLimitsConcurrentMemory: through real HTTP and the memory
// store, one key sends 30 requests as a free client, 40 as pro and 50 as
// enterprise, all 120 released together: exactly 5, 20 and 40 pass, each
// with its plan's X-RateLimit-Limit, and the refusals are 429s of the
// zone. Repeated with fresh keys to catch a race.
func TestDynamicLimitsConcurrentMemory(t *testing.T) {
	tc := newTester(t)
	z := zoneName("dyn_plans")
	load(t, tc, config("", "http://localhost:@A@ {"+dynamicPlansSite+"}\n", "ZONE", z))
	client := loopbackClient(120)
	defer client.CloseIdleConnections()
	for round := range 8 {
		user := "dyn-" + nonce + "-" + strconv.Itoa(round)
		type answer struct {
			plan      int
			code      int
			limit     string
			remaining string
			err       error
		}
		var reqs []*http.Request
		var plans []int
		for p, pc := range dynamicPlans {
			for range pc.requests {
				req, err := http.NewRequest(http.MethodGet, siteA+"/", nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("X-User", user)
				if pc.plan != "" {
					req.Header.Set("X-Plan", pc.plan)
				}
				reqs = append(reqs, req)
				plans = append(plans, p)
			}
		}
		out := make([]answer, len(reqs))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, req := range reqs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				resp, err := doRetry(t, client, req)
				if err != nil {
					out[i] = answer{plan: plans[i], err: err}
					return
				}
				resp.Body.Close()
				out[i] = answer{plan: plans[i], code: resp.StatusCode, limit: resp.Header.Get("X-Ratelimit-Limit"), remaining: resp.Header.Get("X-Ratelimit-Remaining")}
			}()
		}
		close(start)
		wg.Wait()

		passed := make([]int, len(dynamicPlans))
		seen := make([]map[string]bool, len(dynamicPlans))
		for _, a := range out {
			pc := dynamicPlans[a.plan]
			switch {
			case a.err != nil:
				t.Errorf("round %d, plan %q: %v", round, pc.plan, a.err)
			case a.limit != strconv.Itoa(pc.limit):
				t.Errorf("round %d, plan %q: status %d X-RateLimit-Limit %q, want %d", round, pc.plan, a.code, a.limit, pc.limit)
			case a.code == http.StatusOK:
				passed[a.plan]++
				if seen[a.plan] == nil {
					seen[a.plan] = map[string]bool{}
				}
				if seen[a.plan][a.remaining] {
					t.Errorf("round %d, plan %q: remaining %s seen twice", round, pc.plan, a.remaining)
				}
				seen[a.plan][a.remaining] = true
			case a.code != http.StatusTooManyRequests:
				t.Errorf("round %d, plan %q: status %d", round, pc.plan, a.code)
			}
		}
		for p, pc := range dynamicPlans {
			if passed[p] != pc.limit {
				t.Errorf("round %d, plan %q: %d of %d concurrent requests passed, want exactly %d", round, pc.plan, passed[p], pc.requests, pc.limit)
			}
		}
	}
}

// TestDynamicLimitAdminReset: a client's bucket for a limit other than the
// default shows in the refusal log as a scoped token (s1-…), and the admin
// API resets that bucket by it; the default bucket is its own.
func TestDynamicLimitAdminReset(t *testing.T) {
	tc := newTester(t)
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	z := zoneName("dyn_admin")
	load(t, tc, config(logGlobal(logPath, "INFO"), "http://localhost:@A@ {"+dynamicPlansSite+"}\n", "ZONE", z))
	user, pro := "X-User: admin-"+nonce, "X-Plan: pro"
	for i := 1; i <= 20; i++ {
		expect(t, get(t, tc.Client, siteA+"/", user, pro), 200, "pro #"+strconv.Itoa(i))
	}
	expect(t, get(t, tc.Client, siteA+"/", user, pro), 429, "pro #21")
	r := expect(t, get(t, tc.Client, siteA+"/", user), 200, "the same client on the default plan")
	expectLimitHeaders(t, r, 5, 4, "the same client on the default plan")

	lines, _ := readLog(t, logPath)
	token := ""
	for _, l := range lines {
		if l.str("msg") == "rate limit exceeded" && l.str("zone") == z {
			token = l.str("key")
		}
	}
	if !strings.HasPrefix(token, "s1-") {
		t.Fatalf("refusal log token %q, want a scoped token s1-…", token)
	}
	if code, body := adminAPI(t, http.MethodDelete, "/rate_limit/zones/"+z+"/tokens/"+token); code != http.StatusOK {
		t.Fatalf("DELETE the pro bucket by its token: %d %v", code, body)
	}
	r = expect(t, get(t, tc.Client, siteA+"/", user, pro), 200, "pro after the reset")
	expectLimitHeaders(t, r, 20, 19, "pro after the reset")
	r = expect(t, get(t, tc.Client, siteA+"/", user), 200, "the default plan, untouched by the reset")
	expectLimitHeaders(t, r, 5, 3, "the default plan, untouched by the reset")
}
