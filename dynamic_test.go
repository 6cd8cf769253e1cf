package sluice

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/telemetry"
)

// TestDynamicLimitPerPlan: the limit comes from a request header (standing
// in for a map or forward_auth); each plan gets exactly its own allowance,
// a client moved from free to pro gets a full pro bucket at once, and
// moving back finds its free bucket as it left it.
func TestDynamicLimitPerPlan(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone plans_dyn {
			key {http.request.header.X-User}
			events {http.request.header.X-Plan-Events} 3
			window 1h
		}
	}`, clock)
	send := func(user, events string) (int, string) {
		hdr := map[string]string{"X-User": user}
		if events != "" {
			hdr["X-Plan-Events"] = events
		}
		w := serve(t, h, "GET", "/", hdr)
		return w.Code, w.Header().Get("X-Ratelimit-Remaining")
	}
	spend := func(user, events string, want int) {
		t.Helper()
		for i := 1; i <= want; i++ {
			if code, rem := send(user, events); code != 200 || rem != strconv.Itoa(want-i) {
				t.Fatalf("%s with events %q, request %d: status %d remaining %s, want 200 with %d left", user, events, i, code, rem, want-i)
			}
		}
		if code, _ := send(user, events); code != 429 {
			t.Fatalf("%s with events %q, request %d: status %d, want 429", user, events, want+1, code)
		}
	}
	spend("alice", "3", 3)   // the default limit
	spend("bob", "10", 10)   // another plan
	spend("carol", "", 3)    // no value: the default
	spend("alice", "10", 10) // alice upgraded: a full bucket of 10 at once
	// The headers show each request's own limit.
	for events, limit := range map[string]string{"10": "10", "3": "3", "": "3", "7": "7", "junk": "3"} {
		w := serve(t, h, "GET", "/", map[string]string{"X-User": "dave-" + events, "X-Plan-Events": events})
		if got := w.Header().Get("X-Ratelimit-Limit"); got != limit {
			t.Errorf("events %q: X-RateLimit-Limit %q, want %s", events, got, limit)
		}
	}
	// Back to the default plan: alice's free bucket is still spent.
	if code, _ := send("alice", "3"); code != 429 {
		t.Fatalf("alice back on the default plan: status %d, want 429 (her bucket is as she left it)", code)
	}
	// One free token refills in 20 minutes; the pro bucket refills on its own.
	clock.add(20 * 60_000)
	if code, rem := send("alice", ""); code != 200 || rem != "0" {
		t.Fatalf("alice after 20 minutes on the default plan: status %d remaining %s, want 200 with 0", code, rem)
	}
	if code, rem := send("alice", "10"); code != 200 || rem != "2" {
		t.Fatalf("alice after 20 minutes on pro: status %d remaining %s, want 200 with 2 (10 per hour refilled 3, minus this one)", code, rem)
	}
}

// TestDynamicLimitFallbacks: an empty or unusable value, or a combination
// that is not a valid limit, falls back to the zone's default, logged at
// most once a minute per zone and counted per field.
func TestDynamicLimitFallbacks(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone dyn_fb {
			key {http.request.header.X-User}
			events {http.request.header.X-Events} 5
			window {http.request.header.X-Window} 1h
			burst {http.request.header.X-Burst} 5
			cost {http.request.header.X-Cost} 2
		}
	}`, clock)
	core, logs := observer.New(zap.InfoLevel)
	h.logger = zap.New(core)
	fallbacks := func(field string) float64 {
		return testutil.ToFloat64(telemetry.Metrics.Fallbacks.WithLabelValues("dyn_fb", field))
	}
	type req struct {
		events, window, burst, cost string
		code                        int
		remaining                   string
	}
	user := 0
	try := func(r req) {
		t.Helper()
		user++
		hdr := map[string]string{"X-User": "u" + strconv.Itoa(user), "X-Events": r.events, "X-Window": r.window, "X-Burst": r.burst, "X-Cost": r.cost}
		w := serve(t, h, "GET", "/", hdr)
		if w.Code != r.code || w.Header().Get("X-Ratelimit-Remaining") != r.remaining {
			t.Fatalf("%+v: status %d remaining %q", r, w.Code, w.Header().Get("X-Ratelimit-Remaining"))
		}
	}
	// Every field usable: capacity 7, cost 3.
	try(req{"10", "1m", "7", "3", 200, "4"})
	for f, n := range map[string]float64{"events": 0, "window": 0, "burst": 0, "cost": 0, "limit": 0} {
		if got := fallbacks(f); got != n {
			t.Fatalf("after a usable request: fallbacks{field=%s} = %v, want %v", f, got, n)
		}
	}
	// Unusable burst and cost: burst 5 (the default) and cost 2.
	try(req{"10", "1m", "many", "-1", 200, "3"})
	// Empty events and window, unusable burst: all defaults (the zone's
	// default limit), cost 2.
	try(req{"", "", "x", "2", 200, "3"})
	// A window too short to be a limit ("0ms") and one without a unit.
	try(req{"10", "0ms", "7", "1", 200, "6"})
	try(req{"10", "60", "7", "1", 200, "6"})
	// Each value usable alone, but not together: the whole default limit.
	// token_bucket capacity × window + events must stay below 2^53.
	try(req{"9007199254740000", "100d", "9007199254740000", "1", 200, "4"})
	want := map[string]float64{"events": 1, "window": 3, "burst": 2, "cost": 1, "limit": 1}
	for f, n := range want {
		if got := fallbacks(f); got != n {
			t.Errorf("fallbacks{field=%s} = %v, want %v", f, got, n)
		}
	}
	// Logged once: the first unusable value; the rest within the minute are
	// suppressed and counted in the next line.
	lines := logs.FilterMessageSnippet("chosen per request").All()
	if len(lines) != 1 {
		t.Fatalf("%d log lines about unusable values within a minute, want 1: %v", len(lines), lines)
	}
	if f := lines[0].ContextMap(); f["zone"] != "dyn_fb" || f["field"] != "burst" || f["value"] != "many" || f["default"] != int64(5) {
		t.Errorf("log line fields %v, want zone dyn_fb, field burst, value many, default 5", f)
	}
	h.badValue().Restart()                  // as if a minute had passed
	try(req{"0", "1m", "7", "1", 200, "6"}) // events 5 (the default), burst 7
	lines = logs.FilterMessageSnippet("chosen per request").All()
	if len(lines) != 2 || lines[1].ContextMap()["suppressed_since_last"] != int64(7) || lines[1].ContextMap()["field"] != "events" {
		t.Errorf("second log line %v, want field events with 7 suppressed since the first", lines[len(lines)-1].ContextMap())
	}
}

// TestDynamicLimitHeaders: the draft RateLimit-Policy and the legacy
// headers carry the limit each request resolved to, past the cache of
// per-limit header values too.
func TestDynamicLimitHeaders(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone dyn_hdr {
			key {http.request.header.X-User}
			events {http.request.header.X-Events} 5
			window {http.request.header.X-Window} 1m
		}
		headers both
	}`, clock)
	for i := 1; i <= maxShown+10; i++ {
		n := strconv.Itoa(i)
		w := serve(t, h, "GET", "/", map[string]string{"X-User": "u", "X-Events": n, "X-Window": "1h"})
		if w.Code != 200 || w.Header().Get("X-Ratelimit-Limit") != n || w.Header().Get("X-Ratelimit-Remaining") != strconv.Itoa(i-1) {
			t.Fatalf("events %d: status %d headers %v", i, w.Code, w.Header())
		}
		if got, want := w.Header().Get("Ratelimit-Policy"), `"dyn_hdr";q=`+n+";w=3600"; got != want {
			t.Fatalf("events %d: RateLimit-Policy %q, want %q", i, got, want)
		}
	}
	if m := h.zones[0].dyn.shown.Load(); m == nil || len(*m) != maxShown {
		t.Errorf("cached header values: %v, want %d", m, maxShown)
	}
}

// TestDynamicLimitAllocations: a zone whose limit comes from a variable
// allocates exactly what the same zone with a static limit does, whether
// the value is the default or another plan's.
func TestDynamicLimitAllocations(t *testing.T) {
	if raceBuild() {
		t.Skip("sync.Pool drops items under -race; make alloc-test runs this without it")
	}
	allocs := func(block, plan string) float64 {
		h := newHandler(t, block, nil)
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-User", "alloc")
		// The vars first: the replacer reads them from the request it is
		// made for.
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{"plan_events": plan}))
		caddyhttp.NewTestReplacer(r)
		w := httptest.NewRecorder()
		return testing.AllocsPerRun(200, func() {
			clear(w.Header())
			if err := h.ServeHTTP(w, r, okHandler); err != nil {
				t.Fatal(err)
			}
		})
	}
	static := allocs(`rate_limit {
		zone alloc_static {
			key {http.request.header.X-User}
			events 1000000000
			window 1h
		}
	}`, "")
	for _, plan := range []string{"1000000000", "2000000000"} {
		dyn := allocs(`rate_limit {
			zone alloc_dyn_`+plan+` {
				key {http.request.header.X-User}
				events {http.vars.plan_events} 1000000000
				window 1h
			}
		}`, plan)
		t.Logf("plan %s: %v allocations per request (static zone: %v)", plan, dyn, static)
		if dyn != static {
			t.Errorf("plan %s: %v allocations per request, the static zone %v", plan, dyn, static)
		}
	}
}

// badValue returns the only zone's rate-limited log of unusable values.
func (h *Handler) badValue() *telemetry.SampledLog { return h.zones[0].badValue }

// TestDynamicLimitNoAllocation: resolving a per-request limit, parsing it,
// checking it and scoping the key allocate nothing.
func TestDynamicLimitNoAllocation(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone dyn_alloc {
			key {http.request.header.X-User}
			events {plan_events} 60
			window {plan_window} 1m
			burst {plan_burst} 60
			cost {plan_cost} 1
		}
	}`, nil)
	z := h.zones[0]
	repl := caddy.NewReplacer()
	repl.Set("plan_events", "600")
	repl.Set("plan_window", "1h30m")
	repl.Set("plan_burst", "100")
	repl.Set("plan_cost", "3")
	buf := make([]byte, 0, 256)
	var tok identity.Token
	var l algorithms.Limit
	var cost int64
	allocs := testing.AllocsPerRun(200, func() {
		l, tok, buf = z.limitOf(repl, identity.EmptyToken(), buf, h.logger)
		cost, buf = z.costOf(repl, buf, h.logger)
	})
	if allocs != 0 {
		t.Errorf("limitOf + costOf allocate %v times per request", allocs)
	}
	want := algorithms.Limit{Events: 600, Window: 90 * 60_000, Burst: 100}
	if l != want || cost != 3 || tok.Kind() != identity.KindScoped {
		t.Errorf("resolved %+v cost %d token %s, want %+v cost 3 and a scoped token", l, cost, tok, want)
	}
}

// TestDynamicLimitKeys: the default limit keeps the plain token; any other
// limit scopes it, the same limit always to the same token.
func TestDynamicLimitKeys(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone dyn_keys {
			key {http.request.header.X-User}
			events {plan_events} 60
			window 1m
		}
	}`, nil)
	z := h.zones[0]
	tokenFor := func(events string) identity.Token {
		repl := caddy.NewReplacer()
		repl.Set("http.request.header.X-User", "alice")
		if events != "" {
			repl.Set("plan_events", events)
		}
		tok, _ := z.deriver.Derive(repl, nil)
		_, tok, _ = z.limitOf(repl, tok, nil, zap.NewNop())
		return tok
	}
	plain, free, bad, pro, pro2 := tokenFor(""), tokenFor("60"), tokenFor("lots"), tokenFor("600"), tokenFor("600")
	if plain.Kind() != identity.KindHash || free != plain || bad != plain {
		t.Errorf("default limit: tokens %s, %s, %s; want one plain hash token", plain, free, bad)
	}
	if pro.Kind() != identity.KindScoped || pro == plain || pro != pro2 {
		t.Errorf("pro: tokens %s, %s; want one scoped token, not %s", pro, pro2, plain)
	}
	if tokenFor("601") == pro {
		t.Error("two limits share a token")
	}
}

// TestDynamicLimitConfigErrors: errors at adapt or at load, and at
// provision of a JSON config, name the zone and the field.
func TestDynamicLimitConfigErrors(t *testing.T) {
	zone := func(body string) string {
		return ":8080 {\n\trate_limit {\n\t\tzone z1 {\n" + body + "\n\t\t}\n\t}\n\trespond ok\n}\n"
	}
	for name, c := range map[string]struct {
		body string
		want []string
	}{
		"events without default":  {"events {plan_events}\nwindow 1m", []string{`zone "z1"`, "events {plan_events} needs a default", "events {plan_events} 60"}},
		"window without default":  {"events 5\nwindow {plan_window}", []string{`zone "z1"`, "window {plan_window} needs a default"}},
		"burst without default":   {"events 5\nwindow 1m\nburst {b}", []string{`zone "z1"`, "burst {b} needs a default"}},
		"placeholder default":     {"events {a} {b}\nwindow 1m", []string{`zone "z1"`, "events takes a value, or a placeholder and a default"}},
		"two values":              {"events 5 6\nwindow 1m", []string{`zone "z1"`, "events takes a value"}},
		"bad events default":      {"events {a} many\nwindow 1m", []string{`zone "z1"`, "events must be an integer"}},
		"zero events default":     {"events {a} 0\nwindow 1m", []string{`zone "z1"`, "events must be at least 1"}},
		"bad window default":      {"events 5\nwindow {w} soon", []string{`zone "z1"`, "window: invalid duration"}},
		"burst with sliding log":  {"events 5\nwindow 1m\nalgorithm sliding_log\nburst {b} 5", []string{`zone "z1"`, "burst is not allowed"}},
		"bad cost default":        {"events 5\nwindow 1m\ncost {c} 0", []string{`zone "z1"`, "cost's default must be at least 1"}},
		"cost default too large":  {"events 5\nwindow 1m\ncost {c} 6", []string{`zone "z1"`, "cost_default 6 exceeds the zone's capacity 5"}},
		"cost default on integer": {"events 5\nwindow 1m\ncost 2 1", []string{`zone "z1"`, "cost takes an integer, or a placeholder"}},
		"malformed placeholder":   {"events {a 5\nwindow 1m", []string{`zone "z1"`, "max_events_from must be a placeholder"}},
	} {
		t.Run(name, func(t *testing.T) {
			err := validateCaddyfile(t, zone(c.body))
			if err == nil {
				t.Fatalf("loaded without error:\n%s", c.body)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	for js, want := range map[string][]string{
		`{"rate_limits":{"z":{"max_events_from":"{e}","window":60000000000}}}`:                                                {`zone "z"`, "events (max_events) is required"},
		`{"rate_limits":{"z":{"max_events":5,"max_events_from":"plain","window":60000000000}}}`:                               {`zone "z"`, "max_events_from must be a placeholder"},
		`{"rate_limits":{"z":{"max_events":5,"window":60000000000,"burst_from":"{b}"}}}`:                                      {`zone "z"`, "burst_from needs a default"},
		`{"rate_limits":{"z":{"max_events":5,"window":60000000000,"burst":5,"burst_from":"{b}","algorithm":"fixed_window"}}}`: {`zone "z"`, "burst"},
		`{"rate_limits":{"z":{"max_events":5,"window":60000000000,"cost":"2","cost_default":1}}}`:                             {`zone "z"`, "cost_default applies only to a placeholder cost"},
	} {
		h := new(Handler)
		if err := json.Unmarshal([]byte(js), h); err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		err := h.Provision(caddyContext(t))
		_ = h.Cleanup()
		if err == nil {
			t.Errorf("%s: provisioned without error", js)
			continue
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", js, err, w)
			}
		}
	}
}

// TestDynamicLimitOneZoneOneSpec: one zone name with the same defaults but
// different per-request placeholders is two limits, refused.
func TestDynamicLimitOneZoneOneSpec(t *testing.T) {
	cf := ":8080 {\n\trate_limit {\n\t\tzone shared {\n\t\t\tevents {a} 5\n\t\t\twindow 1m\n\t\t}\n\t}\n\trespond ok\n}\n:8081 {\n\trate_limit {\n\t\tzone shared {\n\t\t\tevents {b} 5\n\t\t\twindow 1m\n\t\t}\n\t}\n\trespond ok\n}\n"
	err := validateCaddyfile(t, cf)
	if err == nil || !strings.Contains(err.Error(), "max_events_from {a}") || !strings.Contains(err.Error(), "max_events_from {b}") {
		t.Fatalf("load: %v, want a conflict naming both placeholders", err)
	}
	ctx := caddyContext(t)
	var hs []*Handler
	defer func() {
		for _, h := range hs {
			_ = h.Cleanup()
		}
	}()
	for i, js := range []string{
		`{"rate_limits":{"dyn_shared":{"max_events":5,"max_events_from":"{a}","window":60000000000}}}`,
		`{"rate_limits":{"dyn_shared":{"max_events":5,"window":60000000000}}}`,
	} {
		h := new(Handler)
		_ = json.Unmarshal([]byte(js), h)
		err := h.Provision(ctx)
		hs = append(hs, h)
		if i == 0 && err != nil {
			t.Fatal(err)
		}
		if i == 1 && (err == nil || !strings.Contains(err.Error(), "max_events_from {a}")) {
			t.Fatalf("static use of a dynamic zone: %v, want a conflict", err)
		}
	}
}

func TestParseWindow(t *testing.T) {
	for in, want := range map[string]int64{
		"1ms": 1, "500ms": 500, "30s": 30_000, "1m": 60_000, "1h": 3_600_000, "1d": 86_400_000,
		"1h30m": 5_400_000, "1m1ms": 60_001, "0001s": 1000,
		"": -1, "0s": -1, "60": -1, "1.5h": -1, "1us": -1, "m": -1, "1 m": -1, "-1m": -1, "1w": -1,
		"99999999999999999999999d": -1, "36600d": -1,
	} {
		got, ok := parseWindow([]byte(in))
		if !ok {
			got = -1
		}
		if got != want {
			t.Errorf("parseWindow(%q) = %d, want %d", in, got, want)
		}
	}
	for in, want := range map[string]int64{"1": 1, "600": 600, "007": 7, "4611686018427387904": 1 << 62,
		"": -1, "0": -1, "-1": -1, "+1": -1, "1.0": -1, "4611686018427387905": -1, "99999999999999999999": -1, " 1": -1} {
		got, ok := parseCount([]byte(in))
		if !ok {
			got = -1
		}
		if got != want {
			t.Errorf("parseCount(%q) = %d, want %d", in, got, want)
		}
	}
}

// BenchmarkServeHTTPDynamicLimit is BenchmarkServeHTTPAllowed with the
// events chosen per request (a header): what a dynamic zone adds.
func BenchmarkServeHTTPDynamicLimit(b *testing.B) {
	h := newHandler(b, `rate_limit {
		zone bench_dynamic {
			key {http.request.header.X-User}
			events {http.request.header.X-Plan-Events} 1000000
			window 1s
		}
	}`, nil)
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-User", "bench")
	r.Header.Set("X-Plan-Events", "1000000000")
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
