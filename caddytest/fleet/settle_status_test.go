package fleet_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// Statuses not charged across a fleet (docs/reference.md, settle's free):
// 3 Caddy processes sharing one Redis, a zone of 1,000 tokens an hour
// (estimate 100). During an upstream outage (500, 429 and 503, each
// telling usage), 3 bursts of 10 concurrent requests of one key spread
// over the processes all reach the upstream: each failed call gives its
// estimate back (before: the key was locked out after 10). Once the
// upstream recovers (300 tokens a call), the key's budget is whole: 4
// calls pass, the fifth is refused.
func TestSettleFleetStatusFree(t *testing.T) {
	var calls, healthy atomic.Int64
	outage := []int{http.StatusInternalServerError, http.StatusTooManyRequests, http.StatusServiceUnavailable}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if healthy.Load() == 0 {
			w.WriteHeader(outage[n%3])
		}
		fmt.Fprint(w, `{"usage":{"total_tokens":300}}`)
	}))
	t.Cleanup(up.Close)
	r := redistest.Start(t)
	routes := fmt.Sprintf(`rate_limit {
	zone settle_free_fleet {
		key {http.request.header.X-User}
		events 1000
		window 1h
		cost 100
		settle json usage.total_tokens
	}
	store redis %s {
		timeout 250ms
	}
}
reverse_proxy %s`, r.URL(), up.Listener.Addr().String())
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("settle-free-%d", i), "", routes)
	}
	client := newClient(10)
	defer client.CloseIdleConnections()
	user := "free-" + nonce
	failed := 0
	for round := range 3 {
		tl := tally(burst(t, client, procs, "/v1/messages", 10, user))
		failed += tl["500"] + tl["429"] + tl["503"]
		if tl["200"]+tl["200-undecided"] != 0 || tl["err"] != 0 {
			t.Fatalf("round %d: %v; want the upstream's failures only", round, tl)
		}
	}
	if n := calls.Load(); n != 30 || failed != 30 {
		t.Fatalf("the upstream served %d of 30 calls in the outage (%d failures seen); want 30: a failed call is given back", n, failed)
	}
	healthy.Store(1)
	passed := 0
	for i := range 6 {
		res := send(client, procs[i%3].url("/v1/messages"), "X-User: "+user)
		switch {
		case res.err != nil:
			t.Fatalf("call %d: %v", i, res.err)
		case res.code == http.StatusOK:
			passed++
		case res.code != http.StatusTooManyRequests || !res.decided():
			t.Fatalf("call %d: %v; want 200 or the limiter's 429", i, res)
		}
	}
	if passed != 4 {
		t.Fatalf("%d calls passed after the outage, want 4 (1,000 tokens whole, 300 each, estimated 100)", passed)
	}
}
