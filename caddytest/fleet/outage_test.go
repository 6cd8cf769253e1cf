package fleet_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// outageRoutes has one zone per fail policy, selected by path, all in the
// same Redis store with its default timeout.
const outageRoutes = `rate_limit {
	zone out_open {
		key {http.request.header.X-User}
		events 5
		window 1h
		match {
			path /open*
		}
		fail open
	}
	zone out_closed {
		key {http.request.header.X-User}
		events 5
		window 1h
		match {
			path /closed*
		}
		fail closed
	}
	zone out_local {
		key {http.request.header.X-User}
		events 3
		window 1h
		match {
			path /local*
		}
		fail local
	}
	store redis %s
}
respond "ok"`

// decisionBudget is how long a request may take when the store cannot
// answer: the default decision timeout (100 ms), the default grace for a
// reply to a decision already sent (100 ms: a stalled Redis has the first
// calls sent), plus a margin for a loaded two-core machine running three
// Caddy processes under the race detector (a request stuck on the store
// would take the outage's seconds).
const decisionBudget = 100*time.Millisecond + 100*time.Millisecond + 400*time.Millisecond

// TestRedisOutage: with Redis stopped, a fail-open zone answers 200 within
// the decision budget, a fail-closed zone 503 with Retry-After and the
// refusal's JSON shape, and a fail-local zone still refuses past its limit
// (exactly 3 pass through one process). Redis restarted on the same port
// (with its data, from its append-only file): within a bounded time the
// decisions are Redis's again without restarting Caddy (a key exhausted
// before the outage is still exhausted; counts continue), and FUNCTION FLUSH
// in the middle of traffic costs the clients nothing (the library is loaded
// again and the call retried; counts stay exact). A fail-open zone never
// answers 5xx, and no request fails, throughout.
func TestRedisOutage(t *testing.T) {
	// appendonly: the restarted server comes back with the counts it had,
	// so "decided by Redis again" is observable as "still exhausted".
	r := redistest.Start(t, "appendonly yes", "appendfsync always")
	// deny_cache off: the key exhausted before the outage must meet fail
	// open, not this instance's memory of Redis's refusal (which lasts until
	// the first failed call; see breaker_test.go for the deny cache).
	p := startCaddy(t, "outage", "", fmt.Sprintf(outageRoutes, r.URL()+" {\n\t\tdeny_cache off\n\t}"))
	c := newClient(8)
	defer c.CloseIdleConnections()
	key := func(k string) string { return "X-User: " + k + "-" + nonce }

	// Before the outage: exhaust "pre" in the fail-open zone, spend one in
	// the fail-closed zone.
	for i := 0; i < 5; i++ {
		res := mustGet(t, c, p.url("/open"), key("pre"))
		expectCode(t, res, 200, fmt.Sprintf("pre #%d", i+1))
		expectRemaining(t, res, 5, 4-i, fmt.Sprintf("pre #%d", i+1))
	}
	expectCode(t, mustGet(t, c, p.url("/open"), key("pre")), 429, "pre #6 (exhausted)")
	res := mustGet(t, c, p.url("/closed"), key("c1"))
	expectCode(t, res, 200, "closed zone before the outage")
	expectRemaining(t, res, 5, 4, "closed zone before the outage")

	// Background traffic on the fail-open zone, a fresh key per request,
	// for the whole test: never an error, never a 5xx.
	bgClient := newClient(2)
	defer bgClient.CloseIdleConnections()
	bg := startTraffic(bgClient, 20*time.Millisecond, p.url("/open/bg"), func(i int) []string {
		return []string{key("bg-" + strconv.Itoa(i))}
	})
	bgStopped := false
	defer func() {
		if !bgStopped {
			bg.stop()
		}
	}()
	time.Sleep(100 * time.Millisecond)

	r.Stop()
	t.Logf("redis stopped")

	t.Run("fail_open", func(t *testing.T) {
		var durs []time.Duration
		for i := 0; i < 20; i++ {
			k := key("open-" + strconv.Itoa(i))
			if i%4 == 0 {
				k = key("pre") // exhausted before the outage: open lets it through
			}
			res := mustGet(t, c, p.url("/open"), k)
			durs = append(durs, res.dur)
			if !expectCode(t, res, 200, fmt.Sprintf("fail open #%d", i)) {
				continue
			}
			if res.decided() {
				t.Errorf("fail open #%d: rate limit headers on a request the store could not decide: %s", i, res)
			}
			if res.dur > decisionBudget {
				t.Errorf("fail open #%d: took %v, want at most %v (timeout + margin)", i, res.dur, decisionBudget)
			}
		}
		t.Logf("fail open with Redis stopped: p50 %v, max %v", percentile(durs, 50), percentile(durs, 100))
	})

	t.Run("fail_closed", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			res := mustGet(t, c, p.url("/closed"), key("closed-"+strconv.Itoa(i)))
			if !expectCode(t, res, http.StatusServiceUnavailable, fmt.Sprintf("fail closed #%d", i)) {
				continue
			}
			if res.dur > decisionBudget {
				t.Errorf("fail closed #%d: took %v, want at most %v", i, res.dur, decisionBudget)
			}
			if ra := retryAfter(res); ra < 1 {
				t.Errorf("fail closed #%d: Retry-After %q, want a positive integer", i, res.header.Get("Retry-After"))
			}
			if ct := res.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("fail closed #%d: Content-Type %q, want application/json", i, ct)
			}
			if cc := res.header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("fail closed #%d: Cache-Control %q, want no-store", i, cc)
			}
			var body struct {
				Status     *int    `json:"status"`
				Error      *string `json:"error"`
				Zone       *string `json:"zone"`
				RetryAfter *int    `json:"retry_after"`
			}
			if err := json.Unmarshal([]byte(res.body), &body); err != nil {
				t.Errorf("fail closed #%d: body %q is not JSON: %v", i, res.body, err)
				continue
			}
			if body.Status == nil || *body.Status != 503 || body.Error == nil || *body.Error != "rate limiter unavailable" ||
				body.Zone == nil || *body.Zone != "out_closed" || body.RetryAfter == nil || strconv.Itoa(*body.RetryAfter) != res.header.Get("Retry-After") {
				t.Errorf("fail closed #%d: body %s, want {\"status\":503,\"error\":\"rate limiter unavailable\",\"zone\":\"out_closed\",\"retry_after\":<Retry-After>}", i, res.body)
			}
		}
	})

	t.Run("fail_local", func(t *testing.T) {
		var codes []int
		for i := 0; i < 6; i++ {
			res := mustGet(t, c, p.url("/local"), key("L"))
			codes = append(codes, res.code)
			if i < 3 {
				if expectCode(t, res, 200, fmt.Sprintf("fail local #%d", i+1)) {
					expectRemaining(t, res, 3, 2-i, fmt.Sprintf("fail local #%d (this instance's memory)", i+1))
				}
				continue
			}
			if expectCode(t, res, 429, fmt.Sprintf("fail local #%d (past the limit)", i+1)) {
				if ra := retryAfter(res); ra < 1 {
					t.Errorf("fail local #%d: Retry-After %q, want a positive integer", i+1, res.header.Get("Retry-After"))
				}
			}
		}
		t.Logf("fail local with Redis stopped, 6 requests: %v", codes)
	})

	// Redis comes back on the same port, with its data; Caddy is not
	// restarted.
	r.Restart(t)
	restarted := time.Now()
	var last result
	var probes []string
	took, ok := waitFor(5*time.Second, func() bool {
		last = send(c, p.url("/open"), key("pre"))
		probes = append(probes, fmt.Sprintf("%v: %s", time.Since(restarted).Round(time.Millisecond), last))
		return last.err == nil && last.code == 429
	})
	if !ok {
		for _, pr := range probes {
			t.Logf("probe %s", pr)
		}
		t.Fatalf("after the restart: a key exhausted before the outage is not refused again within 5 s (last: %s); decisions did not resume", last)
	}
	// go-redis's pool stops dialing after pool_size failed dials and probes
	// once a second until one succeeds, so resuming takes up to about 1 s.
	t.Logf("decisions by Redis resumed %v after the restart (%d probes; the first %d let through by fail open)",
		took.Round(time.Millisecond), len(probes), len(probes)-1)
	expectRemaining(t, last, 5, 0, "exhausted key after the restart")

	t.Run("resumed", func(t *testing.T) {
		for i := 0; i < 2; i++ {
			res := mustGet(t, c, p.url("/open"), key("post"))
			if expectCode(t, res, 200, fmt.Sprintf("new key after the restart #%d", i+1)) {
				expectRemaining(t, res, 5, 4-i, fmt.Sprintf("new key after the restart #%d", i+1))
			}
		}
		// The fail-closed zone continues the count it had in Redis.
		res := mustGet(t, c, p.url("/closed"), key("c1"))
		if expectCode(t, res, 200, "closed zone after the restart") {
			expectRemaining(t, res, 5, 3, "closed zone after the restart (one spent before the outage)")
		}
		// The fail-local zone is Redis's again: Redis never saw what this
		// instance counted meanwhile.
		res = mustGet(t, c, p.url("/local"), key("L"))
		if expectCode(t, res, 200, "local zone after the restart") {
			expectRemaining(t, res, 3, 2, "local zone after the restart (decided by Redis)")
		}
		for _, z := range []string{"out_open", "out_closed", "out_local"} {
			if n := len(scanKeys(t, r, "sluice:v1:"+z+":{*}")); n == 0 {
				t.Errorf("after the restart: no key of zone %s in Redis", z)
			}
		}
	})

	t.Run("function_flush", func(t *testing.T) {
		mark := len(bgResults(bg))
		loadsBefore := r.CommandStats(t, "function|load").Calls
		for i := 0; i < 2; i++ {
			res := mustGet(t, c, p.url("/open"), key("F"))
			if expectCode(t, res, 200, fmt.Sprintf("F #%d before FUNCTION FLUSH", i+1)) {
				expectRemaining(t, res, 5, 4-i, fmt.Sprintf("F #%d before FUNCTION FLUSH", i+1))
			}
		}
		r.Do(t, "FUNCTION", "FLUSH")
		for i := 2; i < 8; i++ {
			res := mustGet(t, c, p.url("/open"), key("F"))
			if i < 5 {
				if expectCode(t, res, 200, fmt.Sprintf("F #%d after FUNCTION FLUSH", i+1)) {
					expectRemaining(t, res, 5, 4-i, fmt.Sprintf("F #%d after FUNCTION FLUSH", i+1))
				}
			} else if expectCode(t, res, 429, fmt.Sprintf("F #%d after FUNCTION FLUSH (exhausted)", i+1)) {
				expectRemaining(t, res, 5, 0, fmt.Sprintf("F #%d after FUNCTION FLUSH", i+1))
			}
		}
		// Flush again and burst: 10 concurrent requests for a fresh key
		// against events 5, all met by "function not found" first; three times. The
		// pool is warmed by a burst first (on a key of its own), so that
		// what is measured is the reload path, not the cost of dialing
		// eight new connections within the default timeout (that
		// cost is what TestExactFleet*/default_timeout measures).
		for round := 0; round < 3; round++ {
			burst(t, c, []*caddyProc{p}, "/open", 10, fmt.Sprintf("W%d-%s", round, nonce))
			r.Do(t, "FUNCTION", "FLUSH")
			out := burst(t, c, []*caddyProc{p}, "/open", 10, fmt.Sprintf("G%d-%s", round, nonce))
			var allowed, refused int
			for i, res := range out {
				switch {
				case res.err != nil:
					t.Errorf("burst %d after FUNCTION FLUSH #%d: %v", round, i, res.err)
				case res.code == 200 && res.decided():
					allowed++
				case res.code == 429:
					refused++
				default:
					t.Errorf("burst %d after FUNCTION FLUSH #%d: %s (want 200 decided by Redis, or 429)", round, i, res)
				}
			}
			if allowed != 5 || refused != 5 {
				t.Errorf("burst %d of 10 after FUNCTION FLUSH against events 5: %d allowed, %d refused, want exactly 5 and 5", round, allowed, refused)
			}
		}
		if got := r.CommandStats(t, "function|load").Calls - loadsBefore; got < 4 {
			t.Errorf("FUNCTION LOAD calls during the FUNCTION FLUSH phase: %d, want at least 4 (a reload after each flush)", got)
		}
		// The background traffic through both flushes: every request
		// decided by Redis.
		for i, res := range bgResults(bg)[mark:] {
			if res.err != nil || res.code != 200 || !res.decided() {
				t.Errorf("background request %d during FUNCTION FLUSH: %s, want 200 decided by Redis", mark+i, res)
			}
		}
	})

	results := bg.stop()
	bgStopped = true
	counts := tally(results)
	t.Logf("background traffic on the fail-open zone, %d requests over the whole test (outage, restart after %v, FUNCTION FLUSH): %v",
		len(results), time.Since(restarted).Round(time.Millisecond), counts)
	for i, res := range results {
		if res.err != nil || res.code >= 500 || (res.code != 200 && res.code != 429) {
			t.Errorf("background request %d on the fail-open zone: %s", i, res)
		}
	}
	if counts["200-undecided"] == 0 {
		t.Errorf("background traffic: no request was let through undecided, so it never ran during the outage (%v)", counts)
	}
}

// bgResults returns a copy of what the traffic has recorded so far.
func bgResults(tr *traffic) []result {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]result(nil), tr.results...)
}
