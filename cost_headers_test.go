package sluice

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/dunglas/httpsfv"
)

// TestWeightedCost: with capacity 10 and cost 3, exactly 3 requests pass;
// a request costing more than the capacity is refused without consuming.
func TestWeightedCost(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone weighted {
			key {http.request.header.X-User}
			events 10
			window 1h
			cost 3
		}
	}`, clock)
	user := map[string]string{"X-User": "w"}
	passed := 0
	for i := 0; i < 6; i++ {
		if serve(t, h, "GET", "/", user).Code == 200 {
			passed++
		}
	}
	if passed != 3 {
		t.Fatalf("%d requests of cost 3 passed a capacity of 10, want exactly 3", passed)
	}
	if w := serve(t, h, "GET", "/", user); w.Header().Get("X-Ratelimit-Remaining") != "1" {
		t.Fatalf("remaining %q, want 1", w.Header().Get("X-Ratelimit-Remaining"))
	}
}

// TestPlaceholderCost: the cost comes from a request placeholder; a value
// over the capacity is refused and consumes nothing; a value that is not a
// positive integer counts as 1.
func TestPlaceholderCost(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone dyncost {
			key {http.request.header.X-User}
			events 10
			window 1h
			cost {http.request.header.X-Cost}
		}
	}`, clock)
	send := func(cost string) *http.Response {
		hdr := map[string]string{"X-User": "d"}
		if cost != "" {
			hdr["X-Cost"] = cost
		}
		return serve(t, h, "GET", "/", hdr).Result()
	}
	remaining := func(r *http.Response) string { return r.Header.Get("X-Ratelimit-Remaining") }

	if r := send("11"); r.StatusCode != 429 || remaining(r) != "10" {
		t.Fatalf("cost 11 over capacity 10: status %d remaining %s, want 429 with 10 left", r.StatusCode, remaining(r))
	}
	if r := send("5"); r.StatusCode != 200 || remaining(r) != "5" {
		t.Fatalf("cost 5: status %d remaining %s, want 200 with 5 left", r.StatusCode, remaining(r))
	}
	for i, bad := range []string{"", "abc", "0", "1.5", "99999999999999999999"} {
		if r := send(bad); r.StatusCode != 200 || remaining(r) != strconv.Itoa(4-i) {
			t.Fatalf("cost %q: status %d remaining %s, want 200 with %d left (counted as 1)", bad, r.StatusCode, remaining(r), 4-i)
		}
	}
	if r := send("1"); r.StatusCode != 429 {
		t.Fatalf("after spending all: status %d, want 429", r.StatusCode)
	}
}

// TestStaticCostOverCapacityIsAConfigError names the zone and the field.
func TestStaticCostOverCapacityIsAConfigError(t *testing.T) {
	for js, want := range map[string]string{
		`{"rate_limits":{"c":{"max_events":10,"window":3600000000000,"cost":"11"}}}`:               "cost 11 exceeds the zone's capacity 10",
		`{"rate_limits":{"c":{"max_events":10,"window":3600000000000,"burst":4,"cost":5}}}`:        "cost 5 exceeds the zone's capacity 4",
		`{"rate_limits":{"c":{"max_events":10,"window":3600000000000,"cost":"0"}}}`:                "cost must be a positive integer",
		`{"rate_limits":{"c":{"max_events":10,"window":3600000000000,"cost":"many"}}}`:             "cost must be a positive integer",
		`{"rate_limits":{"c":{"max_events":10,"window":3600000000000,"cost":"{http.vars.c"}}}`:     "cost",
		`{"rate_limits":{"c":{"max_events":10,"window":3600000000000,"cost":3}},"headers":"loud"}`: "headers",
	} {
		h := new(Handler)
		if err := json.Unmarshal([]byte(js), h); err != nil {
			t.Fatal(err)
		}
		err := h.Provision(caddyContext(t))
		if err == nil {
			err = h.Validate()
		}
		_ = h.Cleanup()
		if err == nil || !strings.Contains(err.Error(), want) || (want != "headers" && !strings.Contains(err.Error(), `zone "c"`)) {
			t.Errorf("%s: error %v, want one naming zone \"c\" and %q", js, err, want)
		}
	}
}

// draft parses the RateLimit-Policy and RateLimit fields.
type draftZone struct {
	q, w, r, t int64
}

func parseDraft(t *testing.T, hdr http.Header) map[string]draftZone {
	t.Helper()
	out := map[string]draftZone{}
	policy, err := httpsfv.UnmarshalList(hdr.Values("RateLimit-Policy"))
	if err != nil {
		t.Fatalf("RateLimit-Policy %q: %v", hdr.Values("RateLimit-Policy"), err)
	}
	state, err := httpsfv.UnmarshalList(hdr.Values("RateLimit"))
	if err != nil {
		t.Fatalf("RateLimit %q: %v", hdr.Values("RateLimit"), err)
	}
	param := func(it httpsfv.Item, k string) int64 {
		v, ok := it.Params.Get(k)
		if !ok {
			t.Fatalf("item %v has no %s", it.Value, k)
		}
		return v.(int64)
	}
	for _, m := range policy {
		it := m.(httpsfv.Item)
		z := out[it.Value.(string)]
		z.q, z.w = param(it, "q"), param(it, "w")
		out[it.Value.(string)] = z
	}
	for _, m := range state {
		it := m.(httpsfv.Item)
		name := it.Value.(string)
		z, ok := out[name]
		if !ok {
			t.Fatalf("RateLimit names %q, absent from RateLimit-Policy", name)
		}
		z.r, z.t = param(it, "r"), param(it, "t")
		out[name] = z
	}
	return out
}

// TestDraftHeadersAllOrNothing: headers draft describes every zone; a
// request refused by the burst zone does not lower the daily zone's count.
func TestDraftHeadersAllOrNothing(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone burst_d {
			key {http.request.header.X-User}
			events 2
			window 1s
		}
		zone daily_d {
			key {http.request.header.X-User}
			events 100
			window 24h
		}
		headers draft
	}`, clock)
	user := map[string]string{"X-User": "u"}
	for i := 0; i < 2; i++ {
		w := serve(t, h, "GET", "/", user)
		if w.Code != 200 {
			t.Fatalf("request %d: %d", i+1, w.Code)
		}
		if w.Header().Get("X-Ratelimit-Limit") != "" {
			t.Fatalf("headers draft sent legacy headers: %v", w.Header())
		}
		got := parseDraft(t, w.Header())
		want := map[string]draftZone{
			"burst_d": {q: 2, w: 1, r: int64(1 - i), t: 1},
			// t is the effective window (draft -11): the next token, 864 s.
			"daily_d": {q: 100, w: 86400, r: int64(99 - i), t: 864},
		}
		if len(got) != 2 || got["burst_d"] != want["burst_d"] || got["daily_d"] != want["daily_d"] {
			t.Fatalf("request %d: draft fields %+v, want %+v", i+1, got, want)
		}
	}
	for i := 0; i < 3; i++ {
		w := serve(t, h, "GET", "/", user)
		if w.Code != 429 {
			t.Fatalf("burst exceeded: %d", w.Code)
		}
		if got := parseDraft(t, w.Header()); got["daily_d"].r != 98 || got["burst_d"].r != 0 {
			t.Fatalf("refused request %d: %+v; the daily zone must stay at 98", i+1, got)
		}
	}
}

// TestHeadersBoth sends the legacy and the draft fields together.
func TestHeadersBoth(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone both_h {
			key {http.request.header.X-User}
			events 5
			window 500ms
		}
		headers both
	}`, nil)
	w := serve(t, h, "GET", "/", map[string]string{"X-User": "b"})
	if w.Header().Get("X-Ratelimit-Remaining") != "4" {
		t.Fatalf("legacy remaining %q", w.Header().Get("X-Ratelimit-Remaining"))
	}
	// A window under a second is advertised as w=1.
	if got := parseDraft(t, w.Header())["both_h"]; got.q != 5 || got.w != 1 || got.r != 4 {
		t.Fatalf("draft %+v", got)
	}
}
