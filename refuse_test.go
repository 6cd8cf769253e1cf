package sluice

import (
	"cmp"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/reply"
)

// defaultBodyTemplate is the default refusal body as a body template
// (reply's TestDefaultBodyIsTheTemplate holds reply.AppendDefaultBody to it).
const defaultBodyTemplate = `{"status":{http.rate_limit.status},"error":"{http.rate_limit.error}","zone":"{http.rate_limit.zone}","retry_after":{http.rate_limit.retry_after}}`

// referenceRefuse is the refusal as it was written before it was made
// cheap: the rate limit headers set one by one, eight placeholders set as
// static values and the body rendered from a template by the replacer. The
// refusal must answer byte for byte what it answers.
func referenceRefuse(h *Handler, w http.ResponseWriter, r *http.Request, v *verdict, unavailable bool, now time.Time) error {
	if !unavailable {
		if h.legacy {
			hdr := w.Header()
			hdr.Set("X-RateLimit-Limit", v.shown.limit)
			hdr.Set("X-RateLimit-Remaining", strconv.FormatInt(v.Remaining, 10))
			hdr.Set("X-RateLimit-Reset", strconv.FormatInt(reply.ResetUnix(now, v.ResetAfter), 10))
		}
		if v.policy != "" {
			hdr := w.Header()
			hdr[reply.HeaderPolicy] = []string{v.policy}
			hdr[reply.HeaderState] = []string{v.state}
		}
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	cfg := h.Response
	if cfg == nil {
		cfg = &Response{}
	}
	status, msg := cmp.Or(cfg.StatusCode, http.StatusTooManyRequests), reply.MsgExceeded
	if unavailable {
		status, msg = http.StatusServiceUnavailable, reply.MsgUnavailable
	}
	retry := h.resp.RetryAfter(v.RetryAfter)
	reset := reply.ResetUnix(now, v.ResetAfter)

	hdr := w.Header()
	hdr.Set("Retry-After", strconv.FormatInt(retry, 10))
	hdr.Set("Cache-Control", "no-store")

	repl.Set("http.rate_limit.zone", v.zone.name)
	repl.Set("http.rate_limit.exceeded.name", v.zone.name)
	repl.Set("http.rate_limit.retry_after", retry)
	repl.Set("http.rate_limit.limit", v.Limit)
	repl.Set("http.rate_limit.remaining", v.Remaining)
	repl.Set("http.rate_limit.reset", reset)
	repl.Set("http.rate_limit.status", status)
	repl.Set("http.rate_limit.error", msg)

	if cfg.HandleErrors {
		return caddyhttp.Error(status, reply.Refused{Msg: msg, Zone: v.zone.name})
	}
	for name, vals := range cfg.Headers {
		hdr.Del(name)
		for _, val := range vals {
			hdr.Add(name, repl.ReplaceKnown(val, ""))
		}
	}
	tmpl, ct := cfg.Body, "application/json"
	switch t := strings.TrimSpace(tmpl); {
	case tmpl == "":
		tmpl = defaultBodyTemplate
	case strings.HasPrefix(t, "<"):
		ct = "text/html; charset=utf-8"
	case !strings.HasPrefix(t, "{") && !strings.HasPrefix(t, "["):
		ct = "text/plain; charset=utf-8"
	}
	body := repl.ReplaceKnown(tmpl, "")
	hdr.Set("Content-Type", cmp.Or(cfg.ContentType, ct))
	if r.Method == http.MethodHead || len(body) > reply.AutoContentLength {
		// Else the server writes it (net/http: a whole small body).
		hdr.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = io.WriteString(w, body)
	}
	return nil
}

// decideOnly runs r's admission through its verdict, and returns it.
func decideOnly(h *Handler, r *http.Request) (verdict, outcome, error) {
	a := h.admit(r)
	defer a.exit()
	err := a.plan()
	if err == nil {
		err = a.decide()
	}
	if err != nil {
		return verdict{}, unmetered, err
	}
	a.verdict()
	return a.v, a.out, nil
}

// refusalRequest is a request with its own replacer, as Caddy makes one.
func refusalRequest(method string) (*http.Request, *caddy.Replacer) {
	r := httptest.NewRequest(method, "/", nil)
	r.Header.Set("X-User", "mallory")
	return r, caddyhttp.NewTestReplacer(r)
}

// TestRefusalMatchesReference: for every shape of refusal (default body,
// each headers mode, several zones, custom status, content type, body and
// headers, headers overriding the refusal's own, HEAD, handle_errors, fail
// closed), the refusal answers exactly
// what referenceRefuse answers: status, every header value, body, the error
// for handle_errors, and every placeholder.
func TestRefusalMatchesReference(t *testing.T) {
	zones := func(prefix string, extra ...string) string {
		return `
		zone ` + prefix + `_day {
			key {http.request.header.X-User}
			events 1000
			window 24h
		}
		zone ` + prefix + ` {
			key {http.request.header.X-User}
			events 1
			window 1h
		}
` + strings.Join(extra, "\n")
	}
	cases := []struct {
		name, block string
		method      string
		failClosed  bool
	}{
		{name: "default", block: zones("ref_default")},
		{name: "head", block: zones("ref_head"), method: http.MethodHead},
		{name: "headers_both", block: zones("ref_both", "headers both")},
		{name: "headers_draft", block: zones("ref_draft", "headers draft")},
		{name: "headers_off", block: zones("ref_off", "headers off")},
		{name: "fail_closed", block: zones("ref_closed", "headers both"), failClosed: true},
		{name: "status", block: zones("ref_status", "response {\n status 503\n}")},
		{name: "custom", block: zones("ref_custom", "response {",
			`content_type application/problem+json`,
			"body `{\"type\":\"about:blank\",\"zone\":\"{http.rate_limit.zone}\",\"retry\":{http.rate_limit.retry_after},\"limit\":{http.rate_limit.limit},\"reset\":{http.rate_limit.reset},\"status\":{http.rate_limit.status},\"error\":\"{http.rate_limit.error}\",\"name\":\"{http.rate_limit.exceeded.name}\",\"left\":{http.rate_limit.remaining},\"unknown\":\"{nope}\"}`",
			`header X-Quota-Zone "z={http.rate_limit.zone} r={http.rate_limit.retry_after}"`,
			`header X-Two a`,
			`header X-Two b`,
			"}")},
		{name: "custom_static", block: zones("ref_static", "response {", `body "slow down"`, "}")},
		{name: "custom_overrides", block: zones("ref_override", "response {",
			`body "retry after {http.rate_limit.retry_after} seconds, limit {http.rate_limit.limit}"`,
			`header Cache-Control no-cache`,
			`header Retry-After 7`,
			`header X-Ratelimit-Limit lots`,
			`header Content-Type text/x-ignored`,
			"}")},
		{name: "custom_head", block: zones("ref_custom_head", "response {", `body "wait {http.rate_limit.retry_after}s"`, "}"), method: http.MethodHead},
		{name: "handle_errors", block: zones("ref_errors", "headers both", "response handle_errors")},
		{name: "handle_errors_closed", block: zones("ref_errors_closed", "response handle_errors"), failClosed: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := &fakeClock{ms: 1_800_000_000_000}
			h := newHandler(t, "rate_limit {"+c.block+"\n}", clock)
			h.logger = zap.NewNop()
			method := c.method
			if method == "" {
				method = http.MethodGet
			}
			if w := serve(t, h, "GET", "/", map[string]string{"X-User": "mallory"}); w.Code != 200 {
				t.Fatalf("first request: status %d", w.Code)
			}
			clock.add(1234) // Retry-After and the reset are not whole seconds

			r, _ := refusalRequest(method)
			v, out, err := decideOnly(h, r)
			if err != nil || out != refuse {
				t.Fatalf("decide: outcome %d, err %v; want a refusal", out, err)
			}
			if c.failClosed {
				z := v.zone
				v = verdict{zone: z, shown: v.shown, key: v.key, Decision: algorithms.Decision{Limit: z.limit.Capacity(), RetryAfter: failClosedRetry}}
			}
			now := time.Unix(1_800_000_000, 400_000_000)

			rGot, replGot := refusalRequest(method)
			got := httptest.NewRecorder()
			errGot := h.refuse(got, rGot, &v, c.failClosed, now)

			rWant, replWant := refusalRequest(method)
			want := httptest.NewRecorder()
			errWant := referenceRefuse(h, want, rWant, &v, c.failClosed, now)

			if got.Code != want.Code {
				t.Errorf("status %d, want %d", got.Code, want.Code)
			}
			if !equalHeaders(got.Header(), want.Header()) {
				t.Errorf("headers\n%v\nwant\n%v", got.Header(), want.Header())
			}
			if got.Body.String() != want.Body.String() {
				t.Errorf("body\n%q\nwant\n%q", got.Body.String(), want.Body.String())
			}
			if (errGot == nil) != (errWant == nil) {
				t.Fatalf("error %v, want %v", errGot, errWant)
			}
			if errWant != nil {
				var hg, hw caddyhttp.HandlerError
				if !errors.As(errGot, &hg) || !errors.As(errWant, &hw) || hg.StatusCode != hw.StatusCode || hg.Err != hw.Err {
					t.Errorf("error %#v, want %#v", errGot, errWant)
				}
			}
			for _, ph := range reply.PlaceholderNames() {
				if ph == "http.rate_limit.exceeded" || ph == reply.PlaceholderDelay {
					continue // newer than the reference; not a refusal's
				}
				g, okG := replGot.GetString(ph)
				w, okW := replWant.GetString(ph)
				if !okG || !okW || g != w || g == "" {
					t.Errorf("{%s} = %q (known %v), want %q", ph, g, okG, w)
				}
			}
			// The shapes a client sees are what the README says.
			if !c.failClosed && got.Header().Get("Cache-Control") != "no-store" && c.name != "custom_overrides" {
				t.Errorf("Cache-Control %q", got.Header().Get("Cache-Control"))
			}
			if c.name == "default" {
				wantBody := `{"status":429,"error":"rate limit exceeded","zone":"ref_default","retry_after":` + got.Header().Get("Retry-After") + `}`
				if cl := got.Header().Get("Content-Length"); got.Body.String() != wantBody || cl != "" && cl != strconv.Itoa(len(wantBody)) {
					t.Errorf("body %q (Content-Length %s), want %q", got.Body.String(), got.Header().Get("Content-Length"), wantBody)
				}
			}
		})
	}
}

// equalHeaders compares two headers, the order of each field's values
// included.
func equalHeaders(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, av := range a {
		if bv, ok := b[k]; !ok || !slices.Equal(av, bv) {
			return false
		}
	}
	return true
}

// TestRefusalPlaceholdersReachLaterReaders: the placeholders of a refusal
// are there for whatever reads the request's replacer afterwards (the
// access log, log_append, a deferred header): all eight, with the
// refusal's values, and formatted as numbers where they are numbers.
func TestRefusalPlaceholdersReachLaterReaders(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone later_readers {
			key {http.request.header.X-User}
			events 2
			window 1h
		}
	}`, clock)
	h.logger = zap.NewNop()
	for i := 0; i < 2; i++ {
		serve(t, h, "GET", "/", map[string]string{"X-User": "mallory"})
	}
	r, repl := refusalRequest("GET")
	w := httptest.NewRecorder()
	before := time.Now().Unix()
	if err := h.ServeHTTP(w, r, okHandler); err != nil || w.Code != 429 {
		t.Fatalf("status %d, err %v; want 429", w.Code, err)
	}
	after := time.Now().Unix()
	got := repl.ReplaceAll("{http.rate_limit.zone}|{http.rate_limit.exceeded.name}|{http.rate_limit.retry_after}|{http.rate_limit.limit}|{http.rate_limit.remaining}|{http.rate_limit.status}|{http.rate_limit.error}|{http.rate_limit.nope}", "-")
	if want := "later_readers|later_readers|1800|2|0|429|rate limit exceeded|-"; got != want {
		t.Errorf("placeholders %q, want %q", got, want)
	}
	reset, _ := repl.GetString("http.rate_limit.reset")
	n, err := strconv.ParseInt(reset, 10, 64)
	if err != nil || n < before+3600 || n > after+3600+1 {
		t.Errorf("{http.rate_limit.reset} = %q, want Unix seconds in [%d, %d]", reset, before+3600, after+3601)
	}
	if reset != w.Header().Get("X-Ratelimit-Reset") {
		t.Errorf("{http.rate_limit.reset} = %q, X-RateLimit-Reset %q", reset, w.Header().Get("X-Ratelimit-Reset"))
	}
	// The types are those Replacer.Set had: numbers stay numbers.
	for ph, want := range map[string]any{
		"http.rate_limit.retry_after": int64(1800),
		"http.rate_limit.limit":       int64(2),
		"http.rate_limit.remaining":   int64(0),
		"http.rate_limit.status":      429,
		"http.rate_limit.zone":        "later_readers",
	} {
		if v, ok := repl.Get(ph); !ok || v != want {
			t.Errorf("{%s} = %#v, want %#v", ph, v, want)
		}
	}
}

// TestSecondRefusalInErrorRoute: a rate_limit in the handle_errors routes
// that refuses a request another rate_limit already refused (with
// `response handle_errors`) gives the error route the second refusal's
// placeholders, as Replacer.Set did.
func TestSecondRefusalInErrorRoute(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	first := newHandler(t, `rate_limit {
		zone errroute_first {
			key {http.request.header.X-User}
			events 1
			window 1h
		}
		response handle_errors
	}`, clock)
	second := newHandler(t, `rate_limit {
		zone errroute_second {
			key {http.request.header.X-User}
			events 1
			window 1m
		}
	}`, clock)
	first.logger, second.logger = zap.NewNop(), zap.NewNop()
	serve(t, second, "GET", "/", map[string]string{"X-User": "mallory"})
	serve(t, first, "GET", "/", map[string]string{"X-User": "mallory"})

	r, repl := refusalRequest("GET")
	w := httptest.NewRecorder()
	err := first.ServeHTTP(w, r, okHandler)
	var he caddyhttp.HandlerError
	if !errors.As(err, &he) || he.StatusCode != 429 {
		t.Fatalf("first: err %v, want a 429 handler error", err)
	}
	if z, _ := repl.GetString("http.rate_limit.zone"); z != "errroute_first" {
		t.Fatalf("after the first refusal: zone %q", z)
	}
	// What Caddy does before running the error routes.
	r = (&caddyhttp.HTTPErrorConfig{}).WithError(r, err)
	if err := second.ServeHTTP(w, r, okHandler); err != nil || w.Code != 429 {
		t.Fatalf("second: status %d, err %v", w.Code, err)
	}
	got := repl.ReplaceAll("{http.rate_limit.zone} {http.rate_limit.exceeded.name} {http.rate_limit.retry_after} {http.rate_limit.limit}", "-")
	if want := "errroute_second errroute_second 60 1"; got != want {
		t.Errorf("in the error route: %q, want %q", got, want)
	}
}

// TestRefusalHeaderValuesAreIndependent: the refusal's header values share
// one backing array; adding to one header, or rewriting one value in place
// (as a deferred `header` replacement does), changes no other header.
func TestRefusalHeaderValuesAreIndependent(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone independent {
			key {http.request.header.X-User}
			events 1
			window 1h
		}
		headers both
	}`, clock)
	h.logger = zap.NewNop()
	serve(t, h, "GET", "/", map[string]string{"X-User": "mallory"})
	w := serve(t, h, "GET", "/", map[string]string{"X-User": "mallory"})
	if w.Code != 429 {
		t.Fatalf("status %d", w.Code)
	}
	checkIndependent(t, w.Header(), reply.HeaderLimit, reply.HeaderRemaining, reply.HeaderReset, reply.HeaderPolicy, reply.HeaderState, reply.HeaderRetryAfter, reply.HeaderCacheControl, reply.HeaderContentType)
}

// TestAllowedHeaderValuesAreIndependent: an allowed response's
// X-RateLimit-* values and digits share one allocation (headerBlock);
// each value is right, and changing one changes no other.
func TestAllowedHeaderValuesAreIndependent(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone independent_allowed {
			key {http.request.header.X-User}
			events 1000
			window 1h
		}
	}`, clock)
	w := serve(t, h, "GET", "/", map[string]string{"X-User": "alice"})
	hdr := w.Header()
	if w.Code != 200 || hdr.Get(reply.HeaderLimit) != "1000" || hdr.Get(reply.HeaderRemaining) != "999" || len(hdr.Get(reply.HeaderReset)) != 10 {
		t.Fatalf("status %d, headers %v", w.Code, hdr)
	}
	checkIndependent(t, hdr, reply.HeaderLimit, reply.HeaderRemaining, reply.HeaderReset)
}

// checkIndependent fails unless each of names has one value in hdr, and
// adding a value to one, or rewriting its value in place (as a deferred
// `header` replacement does), leaves the others as they were.
func checkIndependent(t *testing.T, hdr http.Header, names ...string) {
	t.Helper()
	snapshot := hdr.Clone()
	for _, name := range names {
		if len(hdr[name]) != 1 {
			t.Fatalf("%s: %q, want one value", name, hdr[name])
		}
	}
	for i, name := range names {
		hdr.Add(name, "added")
		hdr[name][0] = "rewritten"
		for _, other := range names[i+1:] {
			if !slices.Equal(hdr[other], snapshot[other]) {
				t.Fatalf("changing %s changed %s: %q, was %q", name, other, hdr[other], snapshot[other])
			}
		}
	}
}

// TestRefusalAllocations pins what a refusal allocates, against the allowed
// request beside it. The key is static so that only the handler's own work
// is counted (a key from a request header costs the replacer one more
// allocation either way). The allowed request spends one allocation on
// X-RateLimit-* (their values and digits together, headerBlock); the
// refusal spends three in all: the placeholders' provider, the headers'
// numbers and the headers' values.
func TestRefusalAllocations(t *testing.T) {
	if raceBuild() {
		t.Skip("under -race, sync.Pool drops some of what it is given: the counts are not the program's")
	}
	allow := newLoop(t, `rate_limit {
		zone allocs_allow {
			key static
			events 1000000000
			window 1s
		}
	}`, okHandler)
	refused := newLoop(t, `rate_limit {
		zone allocs_refuse {
			key static
			events 1
			window 1h
		}
	}`, okHandler)
	count := func(l *loop, want int) float64 {
		t.Helper()
		return testing.AllocsPerRun(1000, func() {
			if err := l.serve(t); err != nil || l.w.status != want {
				t.Fatalf("status %d, err %v; want %d", l.w.status, err, want)
			}
		})
	}
	allowAllocs, refuseAllocs := count(allow, 200), count(refused, 429)
	t.Logf("allocations per request: allowed %v, refused %v", allowAllocs, refuseAllocs)
	if allowAllocs != 1 {
		t.Errorf("allowed request: %v allocations, want 1", allowAllocs)
	}
	if refuseAllocs != 3 {
		t.Errorf("refused request: %v allocations, want 3", refuseAllocs)
	}
	if !strings.HasPrefix(string(refused.w.body), `{"status":429,"error":"rate limit exceeded","zone":"allocs_refuse","retry_after":`) {
		t.Errorf("body %q", refused.w.body)
	}
}

// raceBuild reports whether this test binary was built with -race.
func raceBuild() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
