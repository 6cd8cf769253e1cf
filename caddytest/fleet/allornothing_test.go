package fleet_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/dunglas/httpsfv"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// All-or-nothing across zones, through HTTP, 3 Caddy processes and one
// standalone Redis:
//
//   - /aon: a burst zone (token bucket, 2 per hour) and a daily zone (100
//     per 24h) on the same key, `headers draft`. Once the burst zone
//     refuses, further refused requests leave the daily zone's count where
//     it was: in the RateLimit field (r of the daily member) and in Redis
//     (GET of both zones' keys, byte for byte, before and after).
//   - /count/1, /count/2, /count/3: one handler of three zones whose
//     matchers make 1, 2 or 3 of them apply; each request costs exactly one
//     script call (EVALSHA, or EVAL after a NOSCRIPT) in INFO commandstats,
//     whatever the number of zones and whether it is allowed or refused.
//
// The store pins `timeout 250ms`, as the exactness tests do (exact_test.go):
// a decision that times out follows the fail policy (open) and lets the
// request through unmetered with no rate limit headers, and on a two-core
// machine shared by three Caddy processes, Redis and the load, scheduling
// alone can push a healthy decision past the default. Such a request would
// show here as a missing RateLimit field or a wrong count, and fail.
func TestAllOrNothingFleet(t *testing.T) {
	r := redistest.Start(t)
	// deny_cache off: these tests count one script call per request and
	// read each refusal's numbers from Redis (the deny cache has its own
	// tests: breaker_test.go's TestAbusiveClient, redisstore).
	store := "store redis " + r.URL() + " {\n\t\ttimeout 250ms\n\t\tdeny_cache off\n\t}"
	routes := fmt.Sprintf(`handle /aon {
	rate_limit {
		zone aon_burst {
			key {http.request.header.X-User}
			events 2
			window 1h
		}
		zone aon_daily {
			key {http.request.header.X-User}
			events 100
			window 24h
		}
		headers draft
		%[1]s
	}
	respond "ok"
}
handle /count/* {
	rate_limit {
		zone cnt_a {
			key {http.request.header.X-User}
			events 4
			window 1h
		}
		zone cnt_b {
			key {http.request.header.X-User}
			events 100
			window 1h
			match {
				path /count/2 /count/3
			}
		}
		zone cnt_c {
			key {http.request.header.X-User}
			events 100
			window 24h
			algorithm sliding_log
			match {
				path /count/3
			}
		}
		headers draft
		%[1]s
	}
	respond "ok"
}
respond "not here" 404`, store)
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("aon-%d", i), "", routes)
	}
	c := newClient(30)
	defer c.CloseIdleConnections()

	t.Run("refusal_charges_nothing", func(t *testing.T) {
		user := "X-User: aon-" + nonce
		for i := range 2 {
			res := mustGet(t, c, procs[i%3].url("/aon"), user)
			if !expectCode(t, res, 200, fmt.Sprintf("request %d", i+1)) {
				t.FailNow()
			}
			d := draftOf(t, res)
			want := map[string]draftItem{
				"aon_burst": {q: 2, w: 3600, r: int64(1 - i)},
				"aon_daily": {q: 100, w: 86400, r: int64(99 - i)},
			}
			if !draftMatches(d, want) {
				t.Fatalf("request %d: draft fields %+v (%s), want %+v", i+1, d, draftText(res), want)
			}
		}
		burstKey := onlyKey(t, r, "sluice:v1:aon_burst:{*}")
		dailyKey := onlyKey(t, r, "sluice:v1:aon_daily:{*}")
		burstBefore, dailyBefore := getString(t, r, burstKey), getString(t, r, dailyKey)
		t.Logf("after 2 admitted: %s = %q, %s = %q", burstKey, burstBefore, dailyKey, dailyBefore)

		for i := range 6 {
			what := fmt.Sprintf("refused request %d (process %d)", i+1, i%3)
			res := mustGet(t, c, procs[i%3].url("/aon"), user)
			if !expectCode(t, res, 429, what) {
				continue
			}
			d := draftOf(t, res)
			if got := d["aon_daily"].r; got != 98 {
				t.Errorf("%s: daily zone r=%d (%s), want 98: a request refused by the burst zone lowered the daily zone", what, got, draftText(res))
			}
			if got := d["aon_burst"].r; got != 0 {
				t.Errorf("%s: burst zone r=%d (%s), want 0", what, got, draftText(res))
			}
			// One token per 1800 s; the bucket emptied a moment ago.
			if ra := retryAfter(res); ra < 1800-retrySlack || ra > 1800 {
				t.Errorf("%s: Retry-After %q, want about 1800 (the burst zone's)", what, res.header.Get("Retry-After"))
			}
		}
		if got := getString(t, r, dailyKey); got != dailyBefore {
			t.Errorf("daily zone's state in Redis changed by refused requests: %s was %q, now %q", dailyKey, dailyBefore, got)
		}
		if got := getString(t, r, burstKey); got != burstBefore {
			t.Errorf("burst zone's state in Redis changed by refused requests: %s was %q, now %q", burstKey, burstBefore, got)
		}
	})

	t.Run("concurrent_refusals_charge_nothing", func(t *testing.T) {
		// 30 concurrent requests for a fresh key over the 3 processes:
		// exactly 2 pass, and the daily zone is charged for those 2 only.
		user := "aon-conc-" + nonce
		out := burst(t, c, procs, "/aon", 30, user)
		codes := map[int]int{}
		for i, res := range out {
			if res.err != nil {
				t.Fatalf("request %d: %v", i, res.err)
			}
			codes[res.code]++
			if res.header.Get("RateLimit") == "" {
				t.Errorf("request %d: no RateLimit field (undecided: the store failed?): %s", i, res)
			}
		}
		if codes[200] != 2 || codes[429] != 28 {
			t.Fatalf("30 concurrent requests: %v, want exactly 2 allowed and 28 refused", codes)
		}
		res := mustGet(t, c, procs[0].url("/aon"), "X-User: "+user)
		expectCode(t, res, 429, "after the burst")
		if d := draftOf(t, res); d["aon_daily"].r != 98 || d["aon_burst"].r != 0 {
			t.Errorf("after 2 allowed and 29 refused: %s, want daily r=98 and burst r=0", draftText(res))
		}
	})

	t.Run("one_script_call_per_request", func(t *testing.T) {
		// Load the script (the first call may be an EVALSHA answered
		// NOSCRIPT and then an EVAL): the counts below start after it.
		res := mustGet(t, c, procs[0].url("/count/3"), "X-User: warm-"+nonce)
		expectCode(t, res, 200, "warm-up")
		const perCase = 9 // 4 allowed by cnt_a, then 5 refused by it
		for zones := 1; zones <= 3; zones++ {
			before := scriptCalls(t, r)
			user := fmt.Sprintf("X-User: cnt-%d-%s", zones, nonce)
			var got []int
			for i := range perCase {
				res := mustGet(t, c, procs[i%3].url(fmt.Sprintf("/count/%d", zones)), user)
				got = append(got, res.code)
				if d := draftOf(t, res); len(d) != zones {
					t.Errorf("%d zones, request %d: RateLimit %q names %d zones, want %d", zones, i+1, res.header.Get("RateLimit"), len(d), zones)
				}
			}
			after := scriptCalls(t, r)
			want := []int{200, 200, 200, 200, 429, 429, 429, 429, 429}
			if !slices.Equal(got, want) {
				t.Errorf("%d zones: statuses %v, want %v", zones, got, want)
			}
			calls := after.calls() - before.calls()
			t.Logf("%d zone(s): %d requests, %d script calls (fcall %+v -> %+v, evalsha %+v -> %+v, eval %+v -> %+v)",
				zones, perCase, calls, before.fcall, after.fcall, before.evalsha, after.evalsha, before.eval, after.eval)
			if calls != perCase {
				t.Errorf("%d zone(s) per request: %d requests made %d script calls (FCALL+EVALSHA+EVAL), want exactly %d (one per request)", zones, perCase, calls, perCase)
			}
			if f := after.fcall.Failed + after.evalsha.Failed + after.eval.Failed - before.fcall.Failed - before.evalsha.Failed - before.eval.Failed; f != 0 {
				t.Errorf("%d zone(s): %d script calls failed", zones, f)
			}
		}
	})
}

// scriptStats is INFO commandstats for the script commands.
type scriptStats struct{ fcall, evalsha, eval redistest.CommandStats }

func (s scriptStats) calls() int64 { return s.fcall.Calls + s.evalsha.Calls + s.eval.Calls }

func scriptCalls(t *testing.T, r *redistest.Server) scriptStats {
	t.Helper()
	return scriptStats{fcall: r.CommandStats(t, "fcall"), evalsha: r.CommandStats(t, "evalsha"), eval: r.CommandStats(t, "eval")}
}

// draftItem is one zone's RateLimit-Policy (q, w) and RateLimit (r, t)
// parameters (t -1 when absent).
type draftItem struct{ q, w, r, t int64 }

// draftOf parses RateLimit-Policy and RateLimit (structured field lists,
// one member per zone) by zone name. A member of RateLimit absent from
// RateLimit-Policy fails the test.
func draftOf(t *testing.T, res result) map[string]draftItem {
	t.Helper()
	out := map[string]draftItem{}
	policy, err := httpsfv.UnmarshalList(res.header.Values("RateLimit-Policy"))
	if err != nil {
		t.Fatalf("RateLimit-Policy %q: %v", res.header.Values("RateLimit-Policy"), err)
	}
	state, err := httpsfv.UnmarshalList(res.header.Values("RateLimit"))
	if err != nil {
		t.Fatalf("RateLimit %q: %v", res.header.Values("RateLimit"), err)
	}
	param := func(it httpsfv.Item, k string) int64 {
		v, ok := it.Params.Get(k)
		if !ok {
			t.Fatalf("draft field member %v has no %s (%s)", it.Value, k, draftText(res))
		}
		n, ok := v.(int64)
		if !ok {
			t.Fatalf("draft field member %v: %s=%v is not an integer", it.Value, k, v)
		}
		return n
	}
	item := func(m httpsfv.Member) (httpsfv.Item, string) {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("draft field member %v is not an item (%s)", m, draftText(res))
		}
		name, ok := it.Value.(string)
		if !ok {
			t.Fatalf("draft field member %v is not a string (%s)", it.Value, draftText(res))
		}
		return it, name
	}
	for _, m := range policy {
		it, name := item(m)
		out[name] = draftItem{q: param(it, "q"), w: param(it, "w")}
	}
	for _, m := range state {
		it, name := item(m)
		z, ok := out[name]
		if !ok {
			t.Fatalf("RateLimit names %q, absent from RateLimit-Policy (%s)", name, draftText(res))
		}
		z.r, z.t = param(it, "r"), -1
		if _, ok := it.Params.Get("t"); ok { // optional: not sent for sliding windows
			z.t = param(it, "t")
		}
		out[name] = z
	}
	return out
}

// draftMatches compares q, w and r of every zone (t moves with the clock).
func draftMatches(got, want map[string]draftItem) bool {
	if len(got) != len(want) {
		return false
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok || g.q != w.q || g.w != w.w || g.r != w.r {
			return false
		}
	}
	return true
}

func draftText(res result) string {
	return fmt.Sprintf("RateLimit-Policy %q, RateLimit %q", res.header.Values("RateLimit-Policy"), res.header.Values("RateLimit"))
}

// onlyKey returns the one key of s matching pattern.
func onlyKey(t *testing.T, s *redistest.Server, pattern string) string {
	t.Helper()
	keys := scanKeys(t, s, pattern)
	if len(keys) != 1 {
		t.Fatalf("keys %s in Redis: %q, want exactly one", pattern, keys)
	}
	return keys[0]
}

// getString returns GET key on s, "" (and no failure) for no key.
func getString(t *testing.T, s *redistest.Server, key string) string {
	t.Helper()
	v := s.Do(t, "GET", key)
	if v == nil {
		return ""
	}
	str, ok := v.(string)
	if !ok {
		t.Fatalf("GET %s: unexpected reply %v", key, v)
	}
	return str
}
