package caddytest_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
)

// oneZoneSite is a site with one rate_limit zone keyed on the client IP.
const oneZoneSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events @EVENTS@
			window @WINDOW@
		}
@EXTRA@
	}
	respond "ok"
}
`

func oneZone(zone, events, window, extra string) string {
	return config("", oneZoneSite, "ZONE", zone, "EVENTS", events, "WINDOW", window, "EXTRA", extra)
}

// TestLimitExact: events 3 per hour admits requests 1-3 and refuses the 4th,
// and keeps refusing.
func TestLimitExact(t *testing.T) {
	tc := newTester(t)
	z := zoneName("exact")
	load(t, tc, oneZone(z, "3", "1h", ""))

	for i := 1; i <= 3; i++ {
		r := expect(t, get(t, tc.Client, siteA+"/"), 200, "request "+strconv.Itoa(i))
		if r.body != "ok" {
			t.Errorf("request %d: body %q, want the site's %q", i, r.body, "ok")
		}
	}
	for i := 4; i <= 6; i++ {
		r := expect(t, get(t, tc.Client, siteA+"/"), 429, "request "+strconv.Itoa(i))
		if r.body == "ok" {
			t.Errorf("request %d: a refusal reached the site's handler", i)
		}
	}
}

// TestHeaders: X-RateLimit-Limit/-Remaining/-Reset on every response,
// Retry-After and Cache-Control: no-store on the refusal.
func TestHeaders(t *testing.T) {
	tc := newTester(t)
	z := zoneName("headers")
	load(t, tc, oneZone(z, "3", "1h", ""))

	const window = int64(3600)
	const perToken = window / 3 // a token bucket refills one token per 20 minutes
	for i := int64(1); i <= 4; i++ {
		before := time.Now().Unix()
		r := get(t, tc.Client, siteA+"/")
		after := time.Now().Unix()
		what := "request " + strconv.FormatInt(i, 10)
		spent := min(i, 3)
		if i <= 3 {
			expect(t, r, 200, what)
			if v := r.header.Get("Retry-After"); v != "" {
				t.Errorf("%s: Retry-After %q on an allowed request", what, v)
			}
		} else {
			expect(t, r, 429, what)
		}
		expectLimitHeaders(t, r, 3, 3-spent, what)
		reset := intHeader(t, r, "X-Ratelimit-Reset")
		if reset <= before || reset > after+window+1 {
			t.Errorf("%s: X-RateLimit-Reset %d, want in (%d, %d]", what, reset, before, after+window+1)
		}
		// Back to full once the spent tokens have refilled.
		if want := before + spent*perToken; reset < want-1 || reset > after+spent*perToken+1 {
			t.Errorf("%s: X-RateLimit-Reset %d is %ds from now, want about %ds (%d tokens to refill)", what, reset, reset-before, spent*perToken, spent)
		}
		if i == 4 {
			// One token refills in 20 minutes: that is the wait.
			expectRetryAfter(t, r, perToken-5, perToken, what)
			if got := r.header.Get("Cache-Control"); got != "no-store" {
				t.Errorf("%s: Cache-Control %q, want no-store", what, got)
			}
		}
	}

	// events 1 window 10s: Retry-After is within the window.
	t.Run("short window", func(t *testing.T) {
		z := zoneName("headers_short")
		load(t, tc, oneZone(z, "1", "10s", ""))
		before := time.Now().Unix()
		r := expect(t, get(t, tc.Client, siteA+"/"), 200, "first")
		expectLimitHeaders(t, r, 1, 0, "first")
		r = expect(t, get(t, tc.Client, siteA+"/"), 429, "second")
		after := time.Now().Unix()
		expectLimitHeaders(t, r, 1, 0, "second")
		expectRetryAfter(t, r, 1, 10, "second")
		if reset := intHeader(t, r, "X-Ratelimit-Reset"); reset <= before || reset > after+10+1 {
			t.Errorf("second: X-RateLimit-Reset %d, want in (%d, %d]", reset, before, after+11)
		}
		if got := r.header.Get("Cache-Control"); got != "no-store" {
			t.Errorf("second: Cache-Control %q, want no-store", got)
		}
	})

	// headers off: no X-RateLimit-*, but Retry-After on the refusal.
	t.Run("headers off", func(t *testing.T) {
		z := zoneName("headers_off")
		load(t, tc, oneZone(z, "1", "1h", "\t\theaders off"))
		r := expect(t, get(t, tc.Client, siteA+"/"), 200, "first")
		expectNoLimitHeaders(t, r, "first")
		r = expect(t, get(t, tc.Client, siteA+"/"), 429, "second")
		expectNoLimitHeaders(t, r, "second")
		expectRetryAfter(t, r, 3600-5, 3600, "second")
		if got := r.header.Get("Cache-Control"); got != "no-store" {
			t.Errorf("second: Cache-Control %q, want no-store", got)
		}
	})
}

// TestDefaultBody: the default refusal is JSON with the status, the zone and
// retry_after equal to Retry-After.
func TestDefaultBody(t *testing.T) {
	tc := newTester(t)
	z := zoneName("body")
	load(t, tc, oneZone(z, "1", "1h", ""))

	expect(t, get(t, tc.Client, siteA+"/"), 200, "first")
	r := expect(t, get(t, tc.Client, siteA+"/"), 429, "second")
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var body struct {
		Status     *int    `json:"status"`
		Zone       *string `json:"zone"`
		RetryAfter *int64  `json:"retry_after"`
	}
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		t.Fatalf("body %q is not JSON: %v", r.body, err)
	}
	ra := expectRetryAfter(t, r, 3600-5, 3600, "second")
	switch {
	case body.Status == nil || *body.Status != 429:
		t.Errorf("body %s: status is not 429", r.body)
	case body.Zone == nil || *body.Zone != z:
		t.Errorf("body %s: zone is not %q", r.body, z)
	case body.RetryAfter == nil || *body.RetryAfter != ra:
		t.Errorf("body %s: retry_after is not the Retry-After header %d", r.body, ra)
	}
	if cl := r.header.Get("Content-Length"); cl != strconv.Itoa(len(r.body)) {
		t.Errorf("Content-Length %q, body is %d bytes", cl, len(r.body))
	}
}

// TestCustomResponse: a response block with status, content_type, a body
// template with placeholders and a header.
func TestCustomResponse(t *testing.T) {
	tc := newTester(t)
	z := zoneName("custom")
	bt := "`"
	extra := `		response {
			content_type application/problem+json
			body ` + bt + `{"type":"about:blank","zone":"{http.rate_limit.zone}","retry":{http.rate_limit.retry_after},"limit":{http.rate_limit.limit},"name":"{http.rate_limit.exceeded.name}"}` + bt + `
			header X-Custom "z={http.rate_limit.zone}"
			status 503
		}`
	load(t, tc, oneZone(z, "2", "1h", extra))

	for i := 1; i <= 2; i++ {
		r := expect(t, get(t, tc.Client, siteA+"/"), 200, "allowed")
		if v := r.header.Get("X-Custom"); v != "" {
			t.Errorf("request %d: the refusal's X-Custom %q is on an allowed response", i, v)
		}
	}
	r := expect(t, get(t, tc.Client, siteA+"/"), 503, "refused")
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	if v := r.header.Get("X-Custom"); v != "z="+z {
		t.Errorf("X-Custom %q, want %q", v, "z="+z)
	}
	ra := expectRetryAfter(t, r, 1800-5, 1800, "refused")
	if got := r.header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", got)
	}
	expectLimitHeaders(t, r, 2, 0, "refused")
	var body struct {
		Type  string `json:"type"`
		Zone  string `json:"zone"`
		Retry int64  `json:"retry"`
		Limit int64  `json:"limit"`
		Name  string `json:"name"`
	}
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		t.Fatalf("body %q is not JSON: %v", r.body, err)
	}
	if body.Type != "about:blank" || body.Zone != z || body.Retry != ra || body.Limit != 2 || body.Name != z {
		t.Errorf("body %s: want type about:blank, zone and name %q, retry %d, limit 2", r.body, z, ra)
	}
}

// TestHandleErrors: `response handle_errors` hands the refusal to the site's
// handle_errors routes, with the headers already set.
func TestHandleErrors(t *testing.T) {
	tc := newTester(t)
	z := zoneName("handle_errors")
	cfg := config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 1
			window 1h
		}
		response handle_errors
	}
	respond "ok"
	handle_errors {
		respond "custom error {err.status_code} zone={http.rate_limit.zone} retry={http.rate_limit.retry_after}"
	}
}
`, "ZONE", z)
	load(t, tc, cfg)

	r := expect(t, get(t, tc.Client, siteA+"/"), 200, "first")
	if r.body != "ok" {
		t.Errorf("first: body %q, want ok", r.body)
	}
	r = expect(t, get(t, tc.Client, siteA+"/"), 429, "second")
	ra := expectRetryAfter(t, r, 3600-5, 3600, "second")
	if want := "custom error 429 zone=" + z + " retry=" + strconv.FormatInt(ra, 10); r.body != want {
		t.Errorf("second: body %q, want %q (rendered by handle_errors)", r.body, want)
	}
	expectLimitHeaders(t, r, 1, 0, "second")
	if got := r.header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("second: Cache-Control %q, want no-store", got)
	}
}

// TestCORSKept: a header set by the `header` directive before rate_limit
// runs is on the 200 and kept on the 429.
func TestCORSKept(t *testing.T) {
	tc := newTester(t)
	z := zoneName("cors")
	cfg := config("", `
http://localhost:@A@ {
	header Access-Control-Allow-Origin https://app.example
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 1
			window 1h
		}
	}
	respond "ok"
}
`, "ZONE", z)
	load(t, tc, cfg)

	for i, code := range []int{200, 429} {
		r := expect(t, get(t, tc.Client, siteA+"/", "Origin: https://app.example"), code, "request "+strconv.Itoa(i+1))
		if got := r.header.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "https://app.example" {
			t.Errorf("%d: Access-Control-Allow-Origin %q, want exactly https://app.example", code, got)
		}
		if code == 429 {
			expectRetryAfter(t, r, 3600-5, 3600, "refused")
		}
	}
}

// TestRefill: events 1 window 1s; after Retry-After the next request passes.
func TestRefill(t *testing.T) {
	tc := newTester(t)
	z := zoneName("refill")
	load(t, tc, oneZone(z, "1", "1s", ""))

	expect(t, get(t, tc.Client, siteA+"/"), 200, "first")
	r := expect(t, get(t, tc.Client, siteA+"/"), 429, "second")
	ra := expectRetryAfter(t, r, 1, 1, "second")
	time.Sleep(time.Duration(ra) * time.Second)
	r = expect(t, get(t, tc.Client, siteA+"/"), 200, "after Retry-After")
	expectLimitHeaders(t, r, 1, 0, "after Retry-After")
	expect(t, get(t, tc.Client, siteA+"/"), 429, "right after")
}
