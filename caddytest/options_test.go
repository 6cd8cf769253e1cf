package caddytest_test

import (
	"strconv"
	"testing"
)

// TestGlobalStoreOption: the global option `rate_limit { store ... }` is the
// store of every directive without its own; a directive's own store wins.
func TestGlobalStoreOption(t *testing.T) {
	tc := newTester(t)
	za, zb := zoneName("global_store"), zoneName("own_store")
	cfg := config(`	rate_limit {
		store memory {
			max_keys 1000
		}
	}`, `
http://localhost:@A@ {
	rate_limit {
		zone @ZA@ {
			key {client_ip}
			events 2
			window 1h
		}
	}
	respond "ok"
}

http://localhost:@B@ {
	rate_limit {
		zone @ZB@ {
			key {client_ip}
			events 2
			window 1h
		}
		store memory {
			max_keys 50
		}
	}
	respond "ok"
}
`, "ZA", za, "ZB", zb)
	load(t, tc, cfg)

	wantStore := map[string]float64{za: 1000, zb: 50}
	handlers := findHandlers(adminConfig(t), "rate_limit")
	if len(handlers) != 2 {
		t.Fatalf("GET /config/: %d rate_limit handlers, want 2", len(handlers))
	}
	for _, h := range handlers {
		zones, _ := h["rate_limits"].(map[string]any)
		for name, want := range wantStore {
			if _, ok := zones[name]; !ok {
				continue
			}
			store, _ := h["store"].(map[string]any)
			if store == nil || store["module"] != "memory" || store["max_keys"] != want {
				t.Errorf("handler of zone %s: store %v, want {module: memory, max_keys: %v}", name, h["store"], want)
			}
			delete(wantStore, name)
		}
	}
	if len(wantStore) != 0 {
		t.Errorf("GET /config/: no handler for zones %v", wantStore)
	}

	// And the directive works on that store.
	for _, site := range []string{siteA, siteB} {
		expect(t, get(t, tc.Client, site+"/"), 200, site+" #1")
		r := expect(t, get(t, tc.Client, site+"/"), 200, site+" #2")
		expectLimitHeaders(t, r, 2, 0, site+" #2")
		expect(t, get(t, tc.Client, site+"/"), 429, site+" #3")
	}
}

// TestEnabledFalse: `enabled false` passes everything, sets no header and
// charges nothing; flipping it back by a reload enforces again.
func TestEnabledFalse(t *testing.T) {
	tc := newTester(t)
	z := zoneName("disabled")
	load(t, tc, oneZone(z, "1", "1h", "\t\tenabled false"))
	for i := 1; i <= 5; i++ {
		r := expect(t, get(t, tc.Client, siteA+"/"), 200, "disabled #"+strconv.Itoa(i))
		expectNoLimitHeaders(t, r, "disabled")
		if v := r.header.Get("Retry-After"); v != "" {
			t.Errorf("disabled: Retry-After %q", v)
		}
		if r.body != "ok" {
			t.Errorf("disabled: body %q, want ok", r.body)
		}
	}

	load(t, tc, oneZone(z, "1", "1h", "\t\tenabled true"))
	r := expect(t, get(t, tc.Client, siteA+"/"), 200, "enabled #1")
	expectLimitHeaders(t, r, 1, 0, "enabled #1")
	expect(t, get(t, tc.Client, siteA+"/"), 429, "enabled #2")
}

// TestCaddyRatelimitGrammar: a Caddyfile written for mholt/caddy-ratelimit
// loads and limits.
func TestCaddyRatelimitGrammar(t *testing.T) {
	tc := newTester(t)
	static, prefix, dyn := zoneName("mholt_static"), zoneName("mholt_prefix"), zoneName("mholt_dyn")
	cfg := config("", `
http://localhost:@A@ {
	rate_limit {
		zone @STATIC@ {
			match {
				method GET
				path /static
			}
			key static
			events 2
			window 1h
		}
		zone @PREFIX@ {
			match {
				path /ip
			}
			key {http.request.header.X-Ip}
			window 1h
			events 2
			ipv4_prefix 24
			ipv6_prefix 48
		}
		zone @DYN@ {
			key {remote_host}
			events 1000
			window 1h
		}
		jitter 0.2
		log_key
		sweep_interval 30s
		disable_metrics
	}
	respond "ok"
}
`, "STATIC", static, "PREFIX", prefix, "DYN", dyn)
	load(t, tc, cfg)

	// The JSON carries caddy-ratelimit's field names.
	handlers := findHandlers(adminConfig(t), "rate_limit")
	if len(handlers) != 1 {
		t.Fatalf("GET /config/: %d rate_limit handlers, want 1", len(handlers))
	}
	h := handlers[0]
	if h["jitter"] != 0.2 || h["log_key"] != true || h["disable_metrics"] != true || h["sweep_interval"] == nil {
		t.Errorf("handler JSON %v: want jitter 0.2, log_key, disable_metrics, sweep_interval", h)
	}
	zones, _ := h["rate_limits"].(map[string]any)
	if zs, _ := zones[static].(map[string]any); zs == nil || zs["max_events"] != 2.0 || zs["key"] != "static" || zs["match"] == nil {
		t.Errorf("zone %s JSON %v: want max_events 2, key static, match", static, zones[static])
	}
	if zp, _ := zones[prefix].(map[string]any); zp == nil || zp["ipv4_prefix"] != 24.0 || zp["ipv6_prefix"] != 48.0 {
		t.Errorf("zone %s JSON %v: want ipv4_prefix 24, ipv6_prefix 48", prefix, zones[prefix])
	}

	// key static: one bucket for everyone, GET only.
	r := expect(t, get(t, tc.Client, siteA+"/static"), 200, "GET /static #1")
	expectLimitHeaders(t, r, 2, 1, "GET /static #1")
	expect(t, get(t, tc.Client, siteA+"/static"), 200, "GET /static #2")
	r = expect(t, get(t, tc.Client, siteA+"/static"), 429, "GET /static #3")
	// One token per 30 minutes, plus up to 20% jitter.
	expectRetryAfter(t, r, 1800-5, 2160, "GET /static #3")
	if z := zoneOf(t, r); z != static {
		t.Errorf("GET /static #3: refused by %q, want %q", z, static)
	}
	r = expect(t, do(t, tc.Client, "POST", siteA+"/static"), 200, "POST /static")
	// The dyn zone alone: charged by the 2 admitted GETs (not the refused
	// one) and this POST.
	expectLimitHeaders(t, r, 1000, 1000-3, "POST /static (only the dyn zone)")

	// ipv4_prefix 24 / ipv6_prefix 48 mask address keys.
	steps := []struct {
		ip        string
		code      int
		remaining int64
	}{
		{"10.1.2.3", 200, 1},
		{"10.1.2.200", 200, 0}, // same /24
		{"10.1.3.1", 200, 1},   // another /24
		{"10.1.2.9", 429, 0},
		{"2001:db8:1:2::1", 200, 1},
		{"2001:db8:1:ffff::5", 200, 0}, // same /48
		{"2001:db8:2::1", 200, 1},      // another /48
		{"[2001:db8:1:7::7]", 429, 0},
	}
	for _, s := range steps {
		what := "/ip X-Ip " + s.ip
		r := expect(t, get(t, tc.Client, siteA+"/ip", "X-Ip: "+s.ip), s.code, what)
		expectLimitHeaders(t, r, 2, s.remaining, what)
	}
}

// TestCaddyRatelimitUnsupported: caddy-ratelimit's distributed and storage
// fail to load, pointing at `store redis`.
func TestCaddyRatelimitUnsupported(t *testing.T) {
	z := zoneName("unsupported")
	zoneBlock := `
		zone @ZONE@ {
			key {client_ip}
			events 3
			window 1h
		}`
	cases := map[string]string{
		"distributed": `
http://localhost:@A@ {
	rate_limit {` + zoneBlock + `
		distributed {
			read_interval 5s
			write_interval 5s
		}
	}
	respond "ok"
}
`,
		"storage": `
http://localhost:@A@ {
	rate_limit {` + zoneBlock + `
		storage file_system {
			root /tmp/sluice-storage
		}
	}
	respond "ok"
}
`,
	}
	for name, sites := range cases {
		t.Run(name, func(t *testing.T) {
			expectLoadRefused(t, config("", sites, "ZONE", z), "text/caddyfile", name, "store redis")
		})
	}
	jsonCases := map[string]string{
		"json distributed": `[{"handler":"rate_limit","rate_limits":{"@ZONE@":{"key":"{http.vars.client_ip}","window":"1h","max_events":3}},"distributed":{"read_interval":"5s"}},{"handler":"static_response","body":"ok"}]`,
		"json storage":     `[{"handler":"rate_limit","rate_limits":{"@ZONE@":{"key":"{http.vars.client_ip}","window":"1h","max_events":3}},"storage":{"module":"file_system","root":"/tmp/sluice-storage"}},{"handler":"static_response","body":"ok"}]`,
	}
	for name, handlers := range jsonCases {
		t.Run(name, func(t *testing.T) {
			expectLoadRefused(t, jsonConfig(handlers, z), "application/json", name[len("json "):], "store redis")
		})
	}
}
