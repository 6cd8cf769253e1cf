package sluice

import (
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestZonesShareKeyDerivation: zones with the same key (the same
// candidates and prefix lengths) share one deriver, so a request's key is
// derived once for them; zones keyed otherwise keep their own. Each zone
// still counts the request's own client: the shared token is the
// request's, never a previous request's.
func TestZonesShareKeyDerivation(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone a_minute {
			key {http.request.header.X-Api-Key}
			events 2
			window 1m
		}
		zone b_hour {
			key {http.request.header.X-Api-Key}
			events 3
			window 1h
		}
		zone c_ip {
			key {client_ip}
			events 100
			window 1m
		}
		zone d_fallback {
			key {http.request.header.X-Api-Key} {client_ip}
			events 100
			window 1m
		}
		zone e_hour {
			key {http.request.header.X-Api-Key}
			events 5
			window 1h
		}
	}`, clock)
	der := map[string]any{}
	for _, z := range h.zones {
		der[z.name] = z.deriver
	}
	if der["a_minute"] != der["b_hour"] || der["a_minute"] != der["e_hour"] {
		t.Fatal("zones keyed on the same header do not share their deriver")
	}
	if der["a_minute"] == der["c_ip"] || der["a_minute"] == der["d_fallback"] || der["c_ip"] == der["d_fallback"] {
		t.Fatal("zones keyed otherwise share a deriver")
	}
	for i := range 2 {
		if w := serve(t, h, "GET", "/", map[string]string{"X-Api-Key": "k1"}); w.Code != 200 {
			t.Fatalf("k1, request %d: %d", i+1, w.Code)
		}
	}
	if w := serve(t, h, "GET", "/", map[string]string{"X-Api-Key": "k1"}); w.Code != 429 {
		t.Fatalf("k1's third request in a minute: %d, want 429", w.Code)
	}
	// Another client has its own keys in every zone keyed on the header.
	for i := range 2 {
		w := serve(t, h, "GET", "/", map[string]string{"X-Api-Key": "k2"})
		if w.Code != 200 || w.Header().Get("X-Ratelimit-Remaining") != []string{"1", "0"}[i] {
			t.Fatalf("k2, request %d: %d, remaining %q", i+1, w.Code, w.Header().Get("X-Ratelimit-Remaining"))
		}
	}
	// A minute on, b_hour refuses k1's next-but-one: 3 an hour.
	clock.add(60_000)
	if w := serve(t, h, "GET", "/", map[string]string{"X-Api-Key": "k1"}); w.Code != 200 {
		t.Fatalf("k1 a minute on: %d", w.Code)
	}
	if w := serve(t, h, "GET", "/", map[string]string{"X-Api-Key": "k1"}); w.Code != 429 || w.Header().Get("X-Ratelimit-Limit") != "3" {
		t.Fatalf("k1's fourth request in the hour: %d, limit %q; want 429 from b_hour", w.Code, w.Header().Get("X-Ratelimit-Limit"))
	}
	// An ambiguous key is refused by the zones that share the deriver.
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Add("X-Api-Key", "k3")
	r.Header.Add("X-Api-Key", "k4")
	caddyhttp.NewTestReplacer(r)
	if err := h.ServeHTTP(httptest.NewRecorder(), r, okHandler); err == nil {
		t.Fatal("a request with two X-Api-Key values passed")
	}
}

// BenchmarkServeHTTPThreeZonesOneKey: three zones keyed on the same header,
// sharing their deriver (one derivation per request), beside three whose
// keys differ only in the header name's case (the same work three times).
func BenchmarkServeHTTPThreeZonesOneKey(b *testing.B) {
	for _, c := range []struct{ name, k1, k2, k3 string }{
		{"shared", "X-User", "X-User", "X-User"},
		{"apart", "X-User", "x-user", "X-USER"},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := newHandler(b, `rate_limit {
				zone a {
					key {http.request.header.`+c.k1+`}
					events 1000000000
					window 1s
				}
				zone b {
					key {http.request.header.`+c.k2+`}
					events 1000000000
					window 1m
				}
				zone c {
					key {http.request.header.`+c.k3+`}
					events 1000000000
					window 1h
				}
			}`, nil)
			benchServeAllowed(b, h)
		})
	}
}
