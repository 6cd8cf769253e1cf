package caddytest_test

import (
	"strconv"
	"strings"
	"testing"
)

// reloadSite is a site with one zone whose limit and response body vary.
const reloadSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events @EVENTS@
			window 1h
		}
	}
	respond "@BODY@"
}
`

func reloadConfig(zone, events, body string) string {
	return config("", reloadSite, "ZONE", zone, "EVENTS", events, "BODY", body)
}

// TestReloadKeepsCounter: reloading a config where the zone is unchanged
// (only the site's body changed) keeps the zone's counter.
func TestReloadKeepsCounter(t *testing.T) {
	tc := newTester(t)
	z := zoneName("reload_keep")
	load(t, tc, reloadConfig(z, "3", "v1"))
	for i := 1; i <= 2; i++ {
		r := expect(t, get(t, tc.Client, siteA+"/"), 200, "before reload")
		expectLimitHeaders(t, r, 3, int64(3-i), "before reload")
	}

	load(t, tc, reloadConfig(z, "3", "v2"))
	r := expect(t, get(t, tc.Client, siteA+"/"), 200, "after reload #1")
	if r.body != "v2" {
		t.Fatalf("after reload: body %q, want v2 (the reload did not take effect)", r.body)
	}
	expectLimitHeaders(t, r, 3, 0, "after reload #1")
	expect(t, get(t, tc.Client, siteA+"/"), 429, "after reload #2")
}

// TestReloadChangedLimit: a changed limit applies at once to the existing
// counters. The test reads "applies at once" as an operator does: what a
// client has spent in the window carries over, measured against the new
// limit.
func TestReloadChangedLimit(t *testing.T) {
	t.Run("raise", func(t *testing.T) {
		tc := newTester(t)
		z := zoneName("reload_raise")
		load(t, tc, reloadConfig(z, "3", "three"))
		for i := 1; i <= 3; i++ {
			expect(t, get(t, tc.Client, siteA+"/"), 200, "under 3 #"+strconv.Itoa(i))
		}
		expect(t, get(t, tc.Client, siteA+"/"), 429, "under 3 #4")

		// 3 spent of a new limit of 10: 7 more pass at once, then refused.
		load(t, tc, reloadConfig(z, "10", "ten"))
		for i := 1; i <= 7; i++ {
			what := "under 10 #" + strconv.Itoa(i)
			r := expect(t, get(t, tc.Client, siteA+"/"), 200, what)
			expectLimitHeaders(t, r, 10, int64(7-i), what)
			if r.code == 200 && r.body != "ten" {
				t.Errorf("%s: body %q, want ten", what, r.body)
			}
			if t.Failed() {
				return
			}
		}
		expect(t, get(t, tc.Client, siteA+"/"), 429, "under 10 #8")
	})

	t.Run("lower", func(t *testing.T) {
		tc := newTester(t)
		z := zoneName("reload_lower")
		load(t, tc, reloadConfig(z, "10", "ten"))
		for i := 1; i <= 4; i++ {
			r := expect(t, get(t, tc.Client, siteA+"/"), 200, "under 10 #"+strconv.Itoa(i))
			expectLimitHeaders(t, r, 10, int64(10-i), "under 10")
		}

		// 4 spent already exceeds a new limit of 3: refused at once.
		load(t, tc, reloadConfig(z, "3", "three"))
		r := expect(t, get(t, tc.Client, siteA+"/"), 429, "under 3 #1")
		if r.code == 429 {
			expectLimitHeaders(t, r, 3, 0, "under 3 #1")
		}
	})

	t.Run("lower caps", func(t *testing.T) {
		// Whatever the carry-over rule, a lower limit caps what is left:
		// 1 spent of 10, lowered to 2, leaves at most 2 (at least 1).
		tc := newTester(t)
		z := zoneName("reload_cap")
		load(t, tc, reloadConfig(z, "10", "ten"))
		r := expect(t, get(t, tc.Client, siteA+"/"), 200, "under 10")
		expectLimitHeaders(t, r, 10, 9, "under 10")

		load(t, tc, reloadConfig(z, "2", "two"))
		r = expect(t, get(t, tc.Client, siteA+"/"), 200, "under 2 #1")
		if got := intHeader(t, r, "X-Ratelimit-Limit"); got != 2 {
			t.Errorf("under 2 #1: X-RateLimit-Limit %d, want 2", got)
		}
		get(t, tc.Client, siteA+"/")
		r = expect(t, get(t, tc.Client, siteA+"/"), 429, "under 2 #3")
		expectLimitHeaders(t, r, 2, 0, "under 2 #3")
	})
}

// TestReloadRefusesBadConfig: configs with errors are refused by /load with
// a message naming the zone and the field, and the old config keeps serving
// with its counter intact.
func TestReloadRefusesBadConfig(t *testing.T) {
	tc := newTester(t)
	z := zoneName("reload_bad")
	load(t, tc, reloadConfig(z, "3", "good"))
	for i := 1; i <= 2; i++ {
		expect(t, get(t, tc.Client, siteA+"/"), 200, "before")
	}

	caddyfileCases := []struct {
		name  string
		sites string
		wants []string
	}{
		{"events 0", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 0
			window 1h
		}
	}
	respond "bad"
}
`, []string{z, "events"}},
		{"unknown subdirective", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 3
			window 1h
			evnets 4
		}
	}
	respond "bad"
}
`, []string{z, "evnets"}},
		{"negative window", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 3
			window -1h
		}
	}
	respond "bad"
}
`, []string{z, "window"}},
		{"ipv4_prefix out of range", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 3
			window 1h
			ipv4_prefix 33
		}
	}
	respond "bad"
}
`, []string{z, "ipv4_prefix"}},
		{"one zone, two limits, two sites", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 3
			window 1h
		}
	}
	respond "bad"
}

http://localhost:@B@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 30
			window 1h
		}
	}
	respond "bad"
}
`, []string{z, "events 3", "events 30"}},
	}
	for _, c := range caddyfileCases {
		t.Run(c.name, func(t *testing.T) {
			expectLoadRefused(t, config("", c.sites, "ZONE", z), "text/caddyfile", c.wants...)
		})
	}

	// JSON configs skip the Caddyfile adapter's checks: these errors surface
	// at provisioning, when the new config is being built next to the old.
	jsonCases := []struct {
		name  string
		json  string
		wants []string
	}{
		{"json max_events 0", jsonConfig(`[
			{"handler":"rate_limit","rate_limits":{"@ZONE@":{"key":"{http.vars.client_ip}","window":"1h","max_events":0}}},
			{"handler":"static_response","body":"bad"}]`, z), []string{z, "events"}},
		{"json one zone, two limits", jsonConfig(`[
			{"handler":"rate_limit","rate_limits":{"@ZONE@":{"key":"{http.vars.client_ip}","window":"1h","max_events":3}}},
			{"handler":"rate_limit","rate_limits":{"@ZONE@":{"key":"{http.vars.client_ip}","window":"1h","max_events":30}}},
			{"handler":"static_response","body":"bad"}]`, z), []string{z, "events 3", "events 30"}},
	}
	for _, c := range jsonCases {
		t.Run(c.name, func(t *testing.T) {
			expectLoadRefused(t, c.json, "application/json", c.wants...)
		})
	}

	// The old config still serves, with its limit and its counter.
	r := expect(t, get(t, tc.Client, siteA+"/"), 200, "after refused loads #1")
	if r.body != "good" {
		t.Errorf("after refused loads: body %q, want good (the old config)", r.body)
	}
	expectLimitHeaders(t, r, 3, 0, "after refused loads #1")
	expect(t, get(t, tc.Client, siteA+"/"), 429, "after refused loads #2")

	// The refused loads released whatever they took: the old config's
	// store still carries the counter into the next good reload.
	load(t, tc, reloadConfig(z, "3", "good2"))
	r = expect(t, get(t, tc.Client, siteA+"/"), 429, "after a good reload")
	if r.code == 200 && r.body == "good2" {
		t.Errorf("after a good reload: the zone's counter was lost (store dropped by a refused load?)")
	}
}

// jsonConfig is a full JSON config with one server on portA whose route runs
// handlers (a JSON array, with @ZONE@ replaced by zone).
func jsonConfig(handlers, zone string) string {
	handlers = strings.ReplaceAll(handlers, "@ZONE@", zone)
	return strings.NewReplacer("@HANDLERS@", handlers, "@ADMIN@", strconv.Itoa(adminPort), "@A@", strconv.Itoa(portA)).Replace(`{
	"admin": {"listen": "localhost:@ADMIN@", "config": {"persist": false}},
	"apps": {"http": {"http_port": @A@, "servers": {"srv0": {
		"listen": ["127.0.0.1:@A@"],
		"automatic_https": {"disable": true},
		"routes": [{"handle": @HANDLERS@}]
	}}}}
}`)
}
