package fleet_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// The debt bound across a fleet (docs/reference.md, settle): 3 Caddy
// processes sharing one Redis, a zone of 1,000 tokens an hour settled by
// the usage of an event stream (estimate 100, actual 300 each), and 60
// concurrent streamed requests of one key spread over the 3 processes, 10
// rounds with a fresh key each. The estimates admit at most 10 at once
// (1,000 / 100); the others wait for the charges in flight and are then
// refused by the debt. Tokens admitted (300 per request served) stay within
// the budget plus the bound: 10 requests in flight × an overshoot of 200.
func TestSettleFleetDebtBound(t *testing.T) {
	const (
		budget, estimate, actual = 1000, 100, 300
		inFlight                 = budget / estimate
		bound                    = inFlight * (actual - estimate)
	)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := range 4 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"t%d\"}}],\"usage\":null}\n\n", i)
			f.Flush()
			time.Sleep(50 * time.Millisecond)
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", actual)
	}))
	t.Cleanup(up.Close)
	r := redistest.Start(t)
	routes := fmt.Sprintf(`rate_limit {
	zone settle_fleet {
		key {http.request.header.X-User}
		events %d
		window 1h
		cost %d
		settle json usage.total_tokens
	}
	store redis %s {
		timeout 250ms
	}
}
reverse_proxy %s {
	flush_interval -1
}`, budget, estimate, r.URL(), up.Listener.Addr().String())
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("settle-%d", i), "", routes)
	}
	client := newClient(60)
	defer client.CloseIdleConnections()
	most, rounds := 0, make([]int, 0, 10)
	for round := range 10 {
		tl := tally(burst(t, client, procs, "/v1/chat/completions", 60, fmt.Sprintf("settle-%s-%d", nonce, round)))
		served := tl["200"]
		if served+tl["429"] != 60 {
			t.Fatalf("round %d: %v; want only 200s and 429s", round, tl)
		}
		tokens := served * actual
		if tokens > budget+bound || served == 0 {
			t.Fatalf("round %d: %d requests served, %d tokens; want at most %d (the budget %d plus %d in flight × %d)", round, served, tokens, budget+bound, budget, inFlight, actual-estimate)
		}
		most, rounds = max(most, tokens), append(rounds, tokens)
	}
	t.Logf("tokens admitted per round: %v; the most %d of a bound of %d", rounds, most, budget+bound)
}
