package fleet_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// loginUpstream is the stand-in login application of the fleet tests: 401
// unless X-Password is "right", counting the attempts it sees per account.
type loginUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen map[string]int
}

func newLoginUpstream(t *testing.T, delay time.Duration) *loginUpstream {
	u := &loginUpstream{seen: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen[r.Header.Get("X-User")]++
		u.mu.Unlock()
		time.Sleep(delay)
		if r.Header.Get("X-Password") != "right" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("welcome"))
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *loginUpstream) saw(user string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[user]
}

// peekKey reads one key of a zone through a process's admin API.
func peekKey(t *testing.T, p *caddyProc, zone, key string) map[string]any {
	t.Helper()
	resp, err := http.Get(p.adminURL("/rate_limit/zones/" + zone + "/keys/" + key))
	if err != nil {
		t.Fatalf("peek: %v", err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != 200 {
		t.Fatalf("peek: %d %v", resp.StatusCode, err)
	}
	return m
}

// The concurrency test across a fleet: 3 Caddy processes sharing
// one Redis, a login zone of events 5 counting 401 only, behind
// reverse_proxy. 50 concurrent wrong-password logins for one account,
// spread over the processes: the upstream sees exactly 5, the other 45 are
// refused. 1,000 right-password logins for another account (three at a
// time, one per process) all pass and leave its zone untouched (refunds
// are pipelined, not waited for: the check polls for the last ones).
func TestCountFleetConcurrentLogins(t *testing.T) {
	app := newLoginUpstream(t, 50*time.Millisecond)
	zone := "count_fleet"
	procs := countFleet(t, "count", zone, app)
	client := newClient(60)
	defer client.CloseIdleConnections()

	for round := range 3 {
		victim := fmt.Sprintf("victim-%s-%d", nonce, round)
		results := make([]result, 50)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i] = send(client, procs[i%3].url("/login"), "X-User: "+victim, "X-Password: wrong")
			}()
		}
		close(start)
		wg.Wait()
		tl := tally(results)
		if app.saw(victim) != 5 || tl["401"] != 5 || tl["429"] != 45 || len(tl) != 2 {
			t.Fatalf("round %d: 50 concurrent wrong passwords over 3 processes: the upstream saw %d; outcomes %v; want exactly 5 (401) and 45 (429)", round, app.saw(victim), tl)
		}
		t.Logf("round %d: the upstream saw exactly 5 of 50 concurrent wrong passwords; 45 refused", round)
	}

	owner := "owner-" + nonce
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[int]int{}
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 334 {
				if w*334+i >= 1000 {
					return
				}
				res := send(client, procs[w].url("/login"), "X-User: "+owner, "X-Password: right")
				mu.Lock()
				outcomes[res.code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if outcomes[200] != 1000 || len(outcomes) != 1 {
		t.Fatalf("1,000 right-password logins over 3 processes: outcomes %v, want 1000 × 200", outcomes)
	}
	if got := app.saw(owner); got != 1000 {
		t.Fatalf("the upstream saw %d right-password logins, want 1000", got)
	}
	if d, ok := waitFor(3*time.Second, func() bool {
		m := peekKey(t, procs[0], zone, owner)
		return m["remaining"] == float64(5) && m["reset_after_ms"] == float64(0)
	}); !ok {
		t.Fatalf("the owner's zone after 1,000 right-password logins: %v; want untouched", peekKey(t, procs[0], zone, owner))
	} else {
		t.Logf("the owner's zone is untouched %v after the last login", d.Round(time.Millisecond))
	}
}

// A penalty across a fleet: 3 processes, one Redis (deny caches on: the
// refusals in a penalty are answered locally by each). Once
// the zone refuses a key, every process refuses it for the penalty, with a
// Retry-After counting down to its end; then the bucket's own behaviour
// again. An admin reset through one process ends a penalty on all three.
func TestPenaltyFleet(t *testing.T) {
	r := redistest.Start(t)
	routes := fmt.Sprintf(`handle /short {
	rate_limit {
		zone pen_short {
			key {http.request.header.X-User}
			events 2
			window 1s
			penalty 1500ms
		}
		store redis %[1]s {
			timeout 250ms
		}
	}
	respond "ok"
}
handle /long {
	rate_limit {
		zone pen_long {
			key {http.request.header.X-User}
			events 3
			window 1h
			penalty 30m
		}
		store redis %[1]s {
			timeout 250ms
		}
	}
	respond "ok"
}`, r.URL())
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("penalty-%d", i), "", routes)
	}
	client := newClient(8)
	defer client.CloseIdleConnections()

	// Short: refused for 1.5 s from the refusal, then normal.
	user := "short-" + nonce
	for i := range 2 {
		if res := send(client, procs[i].url("/short"), "X-User: "+user); res.code != 200 {
			t.Fatalf("short #%d: %v", i, res)
		}
	}
	t0 := time.Now()
	res := send(client, procs[2].url("/short"), "X-User: "+user)
	if res.code != 429 || retryAfter(res) != 2 {
		t.Fatalf("the refusal starting the penalty: %v; want 429, Retry-After 2 (1.5 s rounded up)", res)
	}
	refusedDuring := 0
	for time.Since(t0) < 1200*time.Millisecond {
		for _, p := range procs {
			if res := send(client, p.url("/short"), "X-User: "+user); res.code != 429 {
				t.Fatalf("%v into the penalty, %s: %v; want 429", time.Since(t0).Round(time.Millisecond), p.name, res)
			}
			refusedDuring++
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Until(t0.Add(1700 * time.Millisecond)))
	for i, p := range procs[:2] {
		if res := send(client, p.url("/short"), "X-User: "+user); res.code != 200 {
			t.Fatalf("after the penalty, request %d on %s: %v; want 200 (the bucket has refilled)", i, p.name, res)
		}
	}
	t.Logf("short penalty: %d requests refused on every process during it, then the bucket's 2 admitted", refusedDuring)

	// Long: every process refuses, counting down; a reset on one ends it on
	// all of them.
	user = "long-" + nonce
	for i := range 3 {
		if res := send(client, procs[i].url("/long"), "X-User: "+user); res.code != 200 {
			t.Fatalf("long #%d: %v", i, res)
		}
	}
	// (The bucket alone would wait 20 min, one event per 20 min.)
	if res := send(client, procs[0].url("/long"), "X-User: "+user); res.code != 429 || retryAfter(res) != 1800 {
		t.Fatalf("the refusal starting the 30 min penalty: %v; want Retry-After 1800", res)
	}
	for round := range 2 {
		for _, p := range procs {
			res := send(client, p.url("/long"), "X-User: "+user)
			if ra := retryAfter(res); res.code != 429 || ra < 1795 || ra > 1800 {
				t.Fatalf("round %d, %s: %v; want 429 with Retry-After counting down from 1800", round, p.name, res)
			}
		}
	}
	// Each process answered its later refusals from its deny cache.
	for _, p := range procs {
		if hits := metricSum(t, p, "caddy_rate_limit_deny_cache_hits_total"); hits < 1 {
			t.Errorf("%s: %v deny cache hits; the refusals in a penalty should be answered locally", p.name, hits)
		}
	}
	req, _ := http.NewRequest(http.MethodDelete, procs[1].adminURL("/rate_limit/zones/pen_long/keys/"+user), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("reset through %s: %v %v", procs[1].name, resp, err)
	}
	resp.Body.Close()
	for _, p := range procs {
		d, ok := waitFor(3*time.Second, func() bool {
			return send(client, p.url("/long"), "X-User: "+user).code == 200
		})
		if !ok {
			t.Fatalf("%s still refuses the key 3 s after the reset", p.name)
		}
		t.Logf("%s admits the key %v after the reset", p.name, d.Round(time.Millisecond))
	}
}
