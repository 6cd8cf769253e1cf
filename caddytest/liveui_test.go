package caddytest_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// operatorHash is bcrypt (cost 4) of "right", for basic_auth in front of the
// live page.
const operatorHash = "$2a$04$xxYDoGSASAtMnSGV1SP7nOJt7YYEVvhJ9nWL0nugD7EUeXb6CjTdy"

// uiLoginZone is a zone of two logins an hour per X-User, for the live
// page's tests (zone name @ZL@).
const uiLoginZone = `		zone @ZL@ {
			match {
				path /login
			}
			key {http.request.header.X-User}
			events 2
			window 1h
		}
`

// expectExhausted checks a peek's answer (the admin API's or
// rate_limit_ui's): the key holds state and has nothing left.
func expectExhausted(t *testing.T, r result, when string) {
	t.Helper()
	var p struct {
		Found     bool  `json:"found"`
		Remaining int64 `json:"remaining"`
	}
	if err := json.Unmarshal([]byte(r.body), &p); r.code != 200 || err != nil {
		t.Fatalf("%s: peek: %d %s", when, r.code, r.body)
	}
	if !p.Found || p.Remaining != 0 {
		t.Fatalf("%s: found %v remaining %d, want the key still exhausted", when, p.Found, p.Remaining)
	}
}

// TestLiveUIDirective: the rate_limit_ui directive serves the live page and
// its JSON under the site route where it is placed (behind the site's
// basic_auth, or inside handle_path), in-process; a reset through it is
// refused unless same-origin (Sec-Fetch-Site, else Origin against Host);
// the admin API keeps its JSON and no longer serves the page.
func TestLiveUIDirective(t *testing.T) {
	zl := zoneName("uid_login")
	load(t, newTester(t), config("", `
:@A@ {
	rate_limit {
`+uiLoginZone+`	}
	basic_auth /sluice/* {
		operator @HASH@
	}
	rate_limit_ui /sluice/*
	respond "ok"
}
:@B@ {
	handle_path /ops/limits/* {
		rate_limit_ui
	}
	respond "site b"
}`, "ZL", zl, "HASH", operatorHash))
	c := loopbackClient(1)
	for range 4 {
		get(t, c, siteA+"/login", "X-User: alice")
	}
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("operator:right"))
	send := func(method, url string, fields ...string) result {
		t.Helper()
		return sendFields(t, c, method, url, append([]string{"Authorization", auth}, fields...)...)
	}
	key := siteA + "/sluice/zones/" + zl + "/keys/alice"

	if r := get(t, c, siteA+"/sluice/"); r.code != http.StatusUnauthorized {
		t.Errorf("the page without credentials: %d, want 401 from the site's basic_auth", r.code)
	}
	if r := get(t, c, siteA+"/sluice/activity"); r.code != http.StatusUnauthorized {
		t.Errorf("the JSON without credentials: %d, want 401", r.code)
	}
	page := send("GET", siteA+"/sluice/")
	if page.code != 200 || !strings.Contains(page.header.Get("Content-Type"), "text/html") || !strings.Contains(page.body, `src="ui.js"`) {
		t.Fatalf("the page: %d %q %.80q", page.code, page.header.Get("Content-Type"), page.body)
	}
	if csp := page.header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("the page's CSP %q", csp)
	}
	if r := send("GET", siteA+"/sluice/ui.js"); r.code != 200 || !strings.Contains(r.header.Get("Content-Type"), "javascript") {
		t.Errorf("the script: %d %q", r.code, r.header.Get("Content-Type"))
	}
	if r := send("GET", siteA+"/sluice/zones"); r.code != 200 || !strings.Contains(r.body, `"name":"`+zl+`"`) {
		t.Errorf("the zones: %d %s", r.code, r.body)
	}
	act := send("GET", siteA+"/sluice/activity")
	if act.code != 200 || !strings.Contains(act.body, `"count":2`) {
		t.Errorf("the activity: %d %s", act.code, act.body)
	}
	if r := send("GET", siteA+"/sluice/zones/no_such_zone"); r.code != 404 || !strings.Contains(r.body, `"error"`) {
		t.Errorf("an unknown zone: %d %s, want 404 with a JSON error", r.code, r.body)
	}
	expectExhausted(t, send("GET", key), "before")

	// Cross-origin resets, as a browser would send them from another site.
	for _, h := range [][]string{
		{"Sec-Fetch-Site", "cross-site", "Origin", "http://127.0.0.1:1"},
		{"Sec-Fetch-Site", "same-site", "Origin", siteB},
		{"Origin", "http://evil.example"}, // a browser without Sec-Fetch-Site
		{"Origin", "null"},                // a sandboxed frame or a redirect
		{"Sec-Fetch-Site", "cross-site"},  // no Origin
	} {
		if r := send("DELETE", key, h...); r.code != http.StatusForbidden || !strings.Contains(r.body, "same-origin") {
			t.Errorf("DELETE with %q: %d %s, want 403 naming same-origin", h, r.code, r.body)
		}
		if r := send("POST", key, h...); r.code != http.StatusForbidden {
			t.Errorf("POST with %q: %d, want 403", h, r.code)
		}
	}
	expectExhausted(t, send("GET", key), "after the cross-origin resets")

	// The page's own reset: same-origin.
	r := send("DELETE", key, "Sec-Fetch-Site", "same-origin", "Origin", siteA)
	if r.code != 200 || !strings.Contains(r.body, `"deleted":1`) {
		t.Fatalf("same-origin reset: %d %s", r.code, r.body)
	}
	if r := get(t, c, siteA+"/login", "X-User: alice"); r.code != 200 {
		t.Errorf("after the reset: /login %d, want 200", r.code)
	}

	// Inside handle_path, under another site.
	if r := get(t, c, siteB+"/ops/limits/"); r.code != 200 || !strings.Contains(r.body, `src="ui.js"`) {
		t.Errorf("handle_path: the page %d", r.code)
	}
	if r := get(t, c, siteB+"/ops/limits/zones/"+zl); r.code != 200 || !strings.Contains(r.body, `"name":"`+zl+`"`) {
		t.Errorf("handle_path: one zone %d %s", r.code, r.body)
	}
	if r := get(t, c, siteB+"/"); r.body != "site b" {
		t.Errorf("the rest of site b: %q", r.body)
	}

	// The admin API keeps the JSON for curl and scripts, not the page.
	if r := get(t, c, adminURL+"/rate_limit/activity"); r.code != 200 {
		t.Errorf("admin activity: %d", r.code)
	}
	if r := get(t, c, adminURL+"/rate_limit/ui"); r.code != 404 || !strings.Contains(r.body, "rate_limit_ui") {
		t.Errorf("admin /rate_limit/ui: %d %s, want 404 pointing at the rate_limit_ui directive", r.code, r.body)
	}
}
