package sluice

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/memstore"
	"github.com/sluicehq/caddy-sluice/zoneapp"
)

var loadOnce sync.Once

// caddyContext returns the context of a running (empty) Caddy config, so
// handlers provision exactly as they do in a server.
func caddyContext(t testing.TB) caddy.Context {
	t.Helper()
	loadOnce.Do(func() {
		if err := caddy.Load([]byte(`{"admin":{"disabled":true}}`), false); err != nil {
			t.Fatalf("loading an empty Caddy config: %v", err)
		}
	})
	return caddy.ActiveContext()
}

// fakeClock is a settable clock in Unix milliseconds.
type fakeClock struct {
	mu sync.Mutex
	ms int64
}

func (c *fakeClock) now() int64 { c.mu.Lock(); defer c.mu.Unlock(); return c.ms }
func (c *fakeClock) add(ms int64) {
	c.mu.Lock()
	c.ms += ms
	c.mu.Unlock()
}

// newHandler parses a rate_limit block and provisions it. With a clock, the
// handler's store is swapped for a private memory store on that clock.
func newHandler(t testing.TB, block string, clock *fakeClock) *Handler {
	t.Helper()
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(block)); err != nil {
		t.Fatalf("parse: %v", err)
	}
	if err := h.Provision(caddyContext(t)); err != nil {
		t.Fatalf("provision: %v", err)
	}
	if err := h.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	if clock != nil {
		st := memstore.New(memstore.Config{Now: clock.now, SweepInterval: -1})
		t.Cleanup(st.Close)
		useStores(h, st, nil)
	}
	return h
}

// useStores swaps h's store, and its fail-local store unless local is
// nil, after Provision, and composes its decide stage again.
func useStores(h *Handler, store, local Store) {
	h.store = store
	if local != nil {
		h.local = local
	}
	h.decider = h.decideStage()
	adminRegister(h) // the admin API reads the stores it was given
}

var okHandler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	w.WriteHeader(http.StatusOK)
	return nil
})

// serve sends one request with the given headers through h.
func serve(t testing.TB, h *Handler, method, path string, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, path, nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	caddyhttp.NewTestReplacer(r)
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r, okHandler); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	return w
}

func TestRefillAfterRetryAfterWithInjectedClock(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone refill {
			key {http.request.header.X-User}
			events 2
			window 10s
		}
	}`, clock)
	user := map[string]string{"X-User": "alice"}
	for i := 0; i < 2; i++ {
		if w := serve(t, h, "GET", "/", user); w.Code != 200 {
			t.Fatalf("request %d: status %d", i+1, w.Code)
		}
	}
	w := serve(t, h, "GET", "/", user)
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("third request: status %d, want 429", w.Code)
	}
	// One token refills every 5s.
	if got := w.Header().Get("Retry-After"); got != "5" {
		t.Fatalf("Retry-After = %q, want 5", got)
	}
	clock.add(4999)
	if w := serve(t, h, "GET", "/", user); w.Code != http.StatusTooManyRequests {
		t.Fatalf("1ms before Retry-After: status %d, want 429", w.Code)
	}
	clock.add(1)
	if w := serve(t, h, "GET", "/", user); w.Code != 200 {
		t.Fatalf("after Retry-After: status %d, want 200", w.Code)
	}
	// Another user was never charged.
	if w := serve(t, h, "GET", "/", map[string]string{"X-User": "bob"}); w.Code != 200 || w.Header().Get("X-Ratelimit-Remaining") != "1" {
		t.Fatalf("other user: status %d remaining %q", w.Code, w.Header().Get("X-Ratelimit-Remaining"))
	}
}

func TestHeadersShowMostConstrainedZone(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone roomy {
			key {http.request.header.X-User}
			events 100
			window 1m
		}
		zone tight {
			key {http.request.header.X-User}
			events 3
			window 1h
		}
	}`, clock)
	user := map[string]string{"X-User": "carol"}
	for i := 0; i < 3; i++ {
		w := serve(t, h, "GET", "/", user)
		if w.Code != 200 {
			t.Fatalf("request %d: %d", i+1, w.Code)
		}
		if got, want := w.Header().Get("X-Ratelimit-Limit"), "3"; got != want {
			t.Fatalf("request %d: limit %q, want %q", i+1, got, want)
		}
		if got, want := w.Header().Get("X-Ratelimit-Remaining"), strconv.Itoa(2-i); got != want {
			t.Fatalf("request %d: remaining %q, want %q", i+1, got, want)
		}
	}
	w := serve(t, h, "GET", "/", user)
	if w.Code != 429 {
		t.Fatalf("4th: %d", w.Code)
	}
	var body struct {
		Status     int    `json:"status"`
		Zone       string `json:"zone"`
		RetryAfter int    `json:"retry_after"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", w.Body.String(), err)
	}
	if body.Status != 429 || body.Zone != "tight" || strconv.Itoa(body.RetryAfter) != w.Header().Get("Retry-After") {
		t.Fatalf("body %+v, Retry-After %q", body, w.Header().Get("Retry-After"))
	}
	// 1200s = one token of 3 per hour.
	if got := w.Header().Get("Retry-After"); got != "1200" {
		t.Fatalf("Retry-After %q, want 1200", got)
	}
	// The refused request charged neither zone: roomy still has 97.
	clock.add(1200_000)
	w = serve(t, h, "GET", "/", user)
	if w.Code != 200 {
		t.Fatalf("after refill: %d", w.Code)
	}
}

func TestDisabledHandlerPassesThrough(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone off_switch {
			key static
			events 1
			window 1h
		}
		enabled false
	}`, nil)
	for i := 0; i < 5; i++ {
		w := serve(t, h, "GET", "/", nil)
		if w.Code != 200 || w.Header().Get("X-Ratelimit-Limit") != "" {
			t.Fatalf("request %d: status %d, headers %v", i+1, w.Code, w.Header())
		}
	}
}

func TestJitterStaysInRange(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone jittery {
			key static
			events 1
			window 100s
		}
		jitter 0.5
	}`, clock)
	serve(t, h, "GET", "/", nil)
	seen := map[string]bool{}
	for i := 0; i < 200; i++ {
		w := serve(t, h, "GET", "/", nil)
		ra, err := strconv.Atoi(w.Header().Get("Retry-After"))
		if w.Code != 429 || err != nil || ra < 100 || ra > 150 {
			t.Fatalf("status %d Retry-After %q: want 429 with 100..150", w.Code, w.Header().Get("Retry-After"))
		}
		seen[w.Header().Get("Retry-After")] = true
	}
	if len(seen) < 5 {
		t.Fatalf("jitter produced only %d distinct Retry-After values", len(seen))
	}
}

// TestProvisionErrorsNameZoneAndField covers JSON configurations, which do
// not pass through the Caddyfile parser's checks.
func TestProvisionErrorsNameZoneAndField(t *testing.T) {
	cases := []struct {
		json string
		want []string
	}{
		{`{"rate_limits":{"z":{"window":60000000000}}}`, []string{`zone "z"`, "events (max_events) is required"}},
		{`{"rate_limits":{"z":{"max_events":-1,"window":60000000000}}}`, []string{`zone "z"`, "events (max_events) must be positive"}},
		{`{"rate_limits":{"z":{"max_events":5}}}`, []string{`zone "z"`, "window is required"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":1000}}}`, []string{`zone "z"`, "window must be at least 1ms"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":1500000}}}`, []string{`zone "z"`, "whole number of milliseconds", "use 2ms"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":60000000000}},"sweep_interval":1000}`, []string{"sweep_interval must be at least 1s"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":60000000000}},"sweep_interval":60000000000,"store":{"module":"memory"}}`, []string{"sweep_interval", "store memory { sweep_interval"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":60000000000}},"jitter":-1}`, []string{"jitter", "at least 0"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":60000000000,"burst":-2}}}`, []string{`zone "z"`, "burst must be positive"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":60000000000,"algorithm":"leaky"}}}`, []string{`zone "z"`, "algorithm", "leaky"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":60000000000,"ipv4_prefix":40}}}`, []string{`zone "z"`, "ipv4_prefix"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":60000000000,"ipv6_prefix":-1}}}`, []string{`zone "z"`, "ipv6_prefix"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":60000000000,"key":"{unclosed"}}}`, []string{`zone "z"`, "key", "unclosed"}},
		{`{"rate_limits":{"a\tb":{"max_events":5,"window":60000000000}}}`, []string{`"a\tb"`, "control"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":60000000000}},"distributed":{}}`, []string{"distributed", "store redis"}},
		{`{"rate_limits":{"z":{"max_events":5,"window":60000000000}},"storage":{"module":"file_system"}}`, []string{"storage", "store redis"}},
	}
	for _, c := range cases {
		h := new(Handler)
		if err := json.Unmarshal([]byte(c.json), h); err != nil {
			t.Fatalf("%s: %v", c.json, err)
		}
		err := h.Provision(caddyContext(t))
		if err == nil {
			err = h.Validate()
		}
		_ = h.Cleanup()
		if err == nil {
			t.Errorf("%s: provisioned without error", c.json)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.json, err, w)
			}
		}
	}
}

// TestZoneRegistry: within one configuration, one zone name with two limits
// fails; with one limit it is shared; another configuration is separate.
func TestZoneRegistry(t *testing.T) {
	ctx := caddyContext(t)
	load := func(js string) (*Handler, error) {
		h := new(Handler)
		if err := json.Unmarshal([]byte(js), h); err != nil {
			t.Fatal(err)
		}
		err := h.Provision(ctx)
		if err != nil {
			_ = h.Cleanup()
		}
		return h, err
	}
	a, err := load(`{"rate_limits":{"reg":{"max_events":5,"window":60000000000}}}`)
	if err != nil {
		t.Fatal(err)
	}
	b, err := load(`{"rate_limits":{"reg":{"max_events":5,"window":60000000000}}}`)
	if err != nil {
		t.Fatalf("same zone, same limit: %v", err)
	}
	_, err = load(`{"rate_limits":{"reg":{"max_events":50,"window":60000000000}}}`)
	if err == nil || !strings.Contains(err.Error(), `zone "reg"`) || !strings.Contains(err.Error(), "events 50") || !strings.Contains(err.Error(), "events 5 ") {
		t.Fatalf("conflicting limit: err = %v", err)
	}
	_, err = load(`{"rate_limits":{"reg":{"max_events":5,"window":60000000000}},"store":{"module":"memory","max_keys":7}}`)
	if err == nil || !strings.Contains(err.Error(), "store") {
		t.Fatalf("conflicting store: err = %v", err)
	}
	// Another configuration (a reload), with an app of its own, may
	// redefine the zone.
	if err := new(App).Register([]zoneapp.Use{{Name: "reg", Limit: mustLimit(t, 50)}}, "x"); err != nil {
		t.Fatalf("another configuration: %v", err)
	}
	// Once both users are cleaned up, the name is free again.
	_ = a.Cleanup()
	_ = b.Cleanup()
	if _, err := load(`{"rate_limits":{"reg":{"max_events":50,"window":60000000000}}}`); err != nil {
		t.Fatalf("after cleanup: %v", err)
	}
}

func mustLimit(t *testing.T, events int64) (l algorithms.Limit) {
	t.Helper()
	z := Zone{MaxEvents: events, Window: caddy.Duration(60e9)}
	l, err := z.Limit()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func BenchmarkServeHTTPAllowed(b *testing.B) {
	h := newHandler(b, `rate_limit {
		zone bench {
			key {http.request.header.X-User}
			events 1000000000
			window 1s
		}
	}`, nil)
	benchServeAllowed(b, h)
}

// benchServeAllowed serves one request of X-User "bench" through h and
// okHandler b.N times, reporting allocations: the loop of the ServeHTTP
// benchmarks whose requests pass.
func benchServeAllowed(b *testing.B, h *Handler) {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-User", "bench")
	caddyhttp.NewTestReplacer(r)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		clear(w.Header())
		if err := h.ServeHTTP(w, r, okHandler); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkServeHTTPRefused(b *testing.B) {
	h := newHandler(b, `rate_limit {
		zone bench_refused {
			key {http.request.header.X-User}
			events 1
			window 1h
		}
	}`, nil)
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-User", "bench")
	caddyhttp.NewTestReplacer(r)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, okHandler); err != nil {
			b.Fatal(err)
		}
	}
}
