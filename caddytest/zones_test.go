package caddytest_test

import (
	"encoding/json"
	"strconv"
	"testing"
)

// zoneOf returns the zone named in a default JSON refusal body.
func zoneOf(t *testing.T, r result) string {
	t.Helper()
	var b struct {
		Zone string `json:"zone"`
	}
	if err := json.Unmarshal([]byte(r.body), &b); err != nil {
		t.Errorf("refusal body %q is not JSON: %v", r.body, err)
	}
	return b.Zone
}

// TestMatcherScopedZones: a zone with match { path /login } limits /login
// only; two match blocks in one zone are OR'd (one shared bucket).
func TestMatcherScopedZones(t *testing.T) {
	tc := newTester(t)
	login, ab := zoneName("login"), zoneName("ab")
	cfg := config("", `
http://localhost:@A@ {
	rate_limit {
		zone @LOGIN@ {
			key {client_ip}
			events 2
			window 1h
			match {
				path /login
			}
		}
		zone @AB@ {
			key {client_ip}
			events 3
			window 1h
			match {
				path /a
			}
			match {
				path /b
			}
		}
	}
	respond "ok {path}"
}
`, "LOGIN", login, "AB", ab)
	load(t, tc, cfg)

	unlimited := func(path string, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			r := expect(t, get(t, tc.Client, siteA+path), 200, path)
			expectNoLimitHeaders(t, r, path)
			if r.body != "ok "+path {
				t.Errorf("%s: body %q", path, r.body)
			}
		}
	}

	unlimited("/other", 10)

	r := expect(t, get(t, tc.Client, siteA+"/login"), 200, "/login 1")
	expectLimitHeaders(t, r, 2, 1, "/login 1")
	r = expect(t, get(t, tc.Client, siteA+"/login"), 200, "/login 2")
	expectLimitHeaders(t, r, 2, 0, "/login 2")
	r = expect(t, get(t, tc.Client, siteA+"/login"), 429, "/login 3")
	if z := zoneOf(t, r); z != login {
		t.Errorf("/login 3: refused by zone %q, want %q", z, login)
	}

	unlimited("/other", 10)
	unlimited("/login/sub", 3) // path /login is exact

	// /a and /b: one bucket of 3.
	steps := []struct {
		path      string
		code      int
		remaining int64
	}{
		{"/a", 200, 2}, {"/b", 200, 1}, {"/a", 200, 0}, {"/b", 429, 0}, {"/a", 429, 0},
	}
	for i, s := range steps {
		what := s.path + " #" + strconv.Itoa(i+1)
		r := expect(t, get(t, tc.Client, siteA+s.path), s.code, what)
		expectLimitHeaders(t, r, 3, s.remaining, what)
		if s.code == 429 {
			if z := zoneOf(t, r); z != ab {
				t.Errorf("%s: refused by zone %q, want %q", what, z, ab)
			}
		}
	}
	unlimited("/c", 5)
	unlimited("/other", 5)
}

// TestTwoZonesDifferentKeys: zone A keyed on X-User (2 per user), zone B on
// the client IP (5 in all). Different users get separate A buckets while B
// counts every request; the headers and the refusal report the most
// constrained zone.
func TestTwoZonesDifferentKeys(t *testing.T) {
	tc := newTester(t)
	a, b := zoneName("peruser"), zoneName("perip")
	cfg := config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZA@ {
			key {http.request.header.X-User}
			events 2
			window 1h
		}
		zone @ZB@ {
			key {client_ip}
			events 5
			window 1h
		}
	}
	respond "ok"
}
`, "ZA", a, "ZB", b)
	load(t, tc, cfg)

	user := func(u string) string { return "X-User: " + u + "-" + nonce }
	steps := []struct {
		user      string
		code      int
		limit     int64
		remaining int64
		zone      string // refusing zone
		retry     [2]int64
	}{
		// alice: A(alice) 2→1, B 5→4: A is the most constrained.
		{user: "alice", code: 200, limit: 2, remaining: 1},
		{user: "alice", code: 200, limit: 2, remaining: 0},
		// alice is out in A; nothing is charged, B stays at 3.
		{user: "alice", code: 429, limit: 2, remaining: 0, zone: a, retry: [2]int64{1800 - 5, 1800}},
		// bob has his own A bucket; B 3→2.
		{user: "bob", code: 200, limit: 2, remaining: 1},
		{user: "bob", code: 200, limit: 2, remaining: 0},
		// carol: A(carol) 2→1, but B 1→0 is now the most constrained.
		{user: "carol", code: 200, limit: 5, remaining: 0},
		// dave has a fresh A bucket, but B is out for the whole IP.
		{user: "dave", code: 429, limit: 5, remaining: 0, zone: b, retry: [2]int64{720 - 5, 720}},
		// alice is refused by both: the report is the zone with the longest
		// wait (A: 30 minutes per token, B: 12), the time she must wait.
		{user: "alice", code: 429, limit: 2, remaining: 0, zone: a, retry: [2]int64{1800 - 5, 1800}},
	}
	for i, s := range steps {
		what := "step " + strconv.Itoa(i+1) + " (" + s.user + ")"
		r := expect(t, get(t, tc.Client, siteA+"/", user(s.user)), s.code, what)
		expectLimitHeaders(t, r, s.limit, s.remaining, what)
		if s.code == 429 {
			if z := zoneOf(t, r); z != s.zone {
				t.Errorf("%s: refused by zone %q, want %q", what, z, s.zone)
			}
			expectRetryAfter(t, r, s.retry[0], s.retry[1], what)
		}
	}
}

// TestKeyFallback: key {http.request.header.X-Api-Key} {client_ip}: each API
// key has its own bucket; without the header the client IP's bucket is used.
func TestKeyFallback(t *testing.T) {
	tc := newTester(t)
	z := zoneName("fallback")
	cfg := config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Api-Key} {client_ip}
			events 2
			window 1h
		}
	}
	respond "ok"
}
`, "ZONE", z)
	load(t, tc, cfg)

	k1, k2, k3 := "X-Api-Key: k1-"+nonce, "X-Api-Key: k2-"+nonce, "X-Api-Key: k3-"+nonce
	steps := []struct {
		hdr       []string
		code      int
		remaining int64
		what      string
	}{
		{[]string{k1}, 200, 1, "k1 #1"},
		{[]string{k1}, 200, 0, "k1 #2"},
		{[]string{k1}, 429, 0, "k1 #3"},
		{[]string{k2}, 200, 1, "k2 #1"},
		{nil, 200, 1, "no key #1 (client IP)"},
		{nil, 200, 0, "no key #2 (client IP)"},
		{nil, 429, 0, "no key #3 (client IP)"},
		{[]string{k2}, 200, 0, "k2 #2 (own bucket, IP exhausted)"},
		{[]string{k3}, 200, 1, "k3 #1 (own bucket, IP exhausted)"},
		{[]string{"X-Api-Key: "}, 429, 0, "empty header falls back to the IP"},
	}
	for _, s := range steps {
		r := expect(t, get(t, tc.Client, siteA+"/", s.hdr...), s.code, s.what)
		expectLimitHeaders(t, r, 2, s.remaining, s.what)
	}
}

// TestZoneSharedAcrossSites: one zone name in two sites (same limit) is one
// bucket: spend it through one site and the other refuses.
func TestZoneSharedAcrossSites(t *testing.T) {
	tc := newTester(t)
	z := zoneName("shared")
	cfg := config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 3
			window 1h
		}
	}
	respond "site A"
}

http://localhost:@B@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 3
			window 1h
		}
	}
	respond "site B"
}
`, "ZONE", z)
	load(t, tc, cfg)

	r := expect(t, get(t, tc.Client, siteA+"/"), 200, "A #1")
	expectLimitHeaders(t, r, 3, 2, "A #1")
	r = expect(t, get(t, tc.Client, siteB+"/"), 200, "B #1")
	expectLimitHeaders(t, r, 3, 1, "B #1")
	if r.body != "site B" {
		t.Errorf("B #1: body %q, want site B", r.body)
	}
	r = expect(t, get(t, tc.Client, siteA+"/"), 200, "A #2")
	expectLimitHeaders(t, r, 3, 0, "A #2")
	r = expect(t, get(t, tc.Client, siteB+"/"), 429, "B #2")
	if got := zoneOf(t, r); got != z {
		t.Errorf("B #2: refused by zone %q, want %q", got, z)
	}
	expect(t, get(t, tc.Client, siteA+"/"), 429, "A #3")
}
