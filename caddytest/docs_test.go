package caddytest_test

// The behaviour the manual (README.md, docs/) shows, against the running
// Caddy: the tutorials' Caddyfiles as they are in docs/tutorial/, and the
// snippets of docs/*.md marked <!-- snippet: id NAME --> as they are
// written (the root package's docs_test.go checks that every snippet loads).

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// docSnippet returns the ```caddy block after <!-- snippet: id name --> in
// docs/<page>.
func docSnippet(t *testing.T, page, name string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "docs", page))
	if err != nil {
		t.Fatal(err)
	}
	marker := "<!-- snippet: id " + name + " -->\n```caddy\n"
	_, rest, ok := strings.Cut(string(raw), marker)
	if !ok {
		t.Fatalf("docs/%s: no snippet %q", page, name)
	}
	body, _, ok := strings.Cut(rest, "\n```\n")
	if !ok {
		t.Fatalf("docs/%s: snippet %q is not closed", page, name)
	}
	return body + "\n"
}

// loadSnippet loads a directive-level snippet in the site on port A, each
// zone in renames given a name of this run's own, then `respond "ok"`.
func loadSnippet(t *testing.T, snippet string, renames map[string]string) {
	t.Helper()
	for from, to := range renames {
		decl := "zone " + from + " {"
		if n := strings.Count(snippet, decl); n != 1 {
			t.Fatalf("%q appears %d times in the snippet, want once:\n%s", decl, n, snippet)
		}
		snippet = strings.Replace(snippet, decl, "zone "+to+" {", 1)
	}
	load(t, newTester(t), config("", ":@A@ {\n"+snippet+"\trespond \"ok\"\n}\n"))
}

// TestDocsTutorialSingle runs the README's first tutorial
// (docs/tutorial/single.Caddyfile) and checks what its output shows: the
// API key's bucket of 20, another key unaffected; alice refused after 5
// guesses by the account zone with Retry-After 180, her bucket read and
// reset through the admin API; 30 accounts sprayed from one address
// stopped when the address's 20 attempts are spent (14 pass, 16 refused).
func TestDocsTutorialSingle(t *testing.T) {
	loginIP, account, api := zoneName("login_ip"), zoneName("login_account"), zoneName("api_key")
	loadExample(t, "../docs/tutorial/single.Caddyfile", nil,
		map[string]string{"login_ip": loginIP, "login_account": account, "api_key": api})
	c := clientFrom(t, "127.0.0.1")

	// The API: a bucket of 20 per key, refilled 100 a minute.
	key := "X-Api-Key: k_live_1_" + nonce
	start := time.Now()
	r := expect(t, get(t, c, siteA+"/api/items", key), 200, "first API call")
	expectLimitHeaders(t, r, 20, 19, "first API call")
	allowed := 1
	for ; allowed < 40; allowed++ {
		if get(t, c, siteA+"/api/items", key).code == http.StatusTooManyRequests {
			break
		}
	}
	// 20 at once, plus what refilled meanwhile (one every 600ms).
	if hi := 20 + refilled(100.0/60, time.Since(start)); allowed < 20 || allowed > hi {
		t.Errorf("API key: %d calls allowed before the first 429, want 20 (at most %d with the refill)", allowed, hi)
	}
	expect(t, get(t, c, siteA+"/api/items", "X-Api-Key: k_live_2_"+nonce), 200, "another API key")

	// Six guesses at alice's password.
	alice := "X-Login-User: alice_" + nonce
	for i := 1; i <= 5; i++ {
		expect(t, do(t, c, http.MethodPost, siteA+"/login", alice), 200, "alice #"+strconv.Itoa(i))
	}
	r = expect(t, do(t, c, http.MethodPost, siteA+"/login", alice), 429, "alice #6")
	expectLimitHeaders(t, r, 5, 0, "alice #6")
	expectRetryAfter(t, r, 175, 180, "alice #6")
	if want := `{"status":429,"error":"rate limit exceeded","zone":"` + account + `","retry_after":`; !strings.HasPrefix(r.body, want) {
		t.Errorf("alice #6: body %q, want it to start with %s", r.body, want)
	}

	// The admin API shows her bucket, then resets it.
	code, body := adminAPI(t, http.MethodGet, "/rate_limit/zones/"+account+"/keys/alice_"+nonce)
	if code != 200 || body["found"] != true || jsonInt(t, body, "remaining") != 0 {
		t.Errorf("admin read of alice: %d %v, want found with 0 remaining", code, body)
	}
	code, body = adminAPI(t, http.MethodDelete, "/rate_limit/zones/"+account+"/keys/alice_"+nonce)
	if code != 200 || jsonInt(t, body, "deleted") != 1 {
		t.Errorf("admin reset of alice: %d %v, want 1 deleted", code, body)
	}
	if tokens, _ := body["tokens"].([]any); len(tokens) != 2 {
		t.Errorf("admin reset of alice: tokens %v, want one per key candidate (2)", body["tokens"])
	}
	expect(t, do(t, c, http.MethodPost, siteA+"/login", alice), 200, "alice after the reset")

	// Spraying: the address has spent 6 of its 20.
	var ok, refused int
	for u := 1; u <= 30; u++ {
		r := do(t, c, http.MethodPost, siteA+"/login", "X-Login-User: user"+strconv.Itoa(u)+"_"+nonce)
		switch r.code {
		case 200:
			ok++
		case 429:
			refused++
			if got := intHeader(t, r, "X-Ratelimit-Limit"); got != 20 {
				t.Errorf("spray: refused with X-RateLimit-Limit %d, want the address zone's 20", got)
			}
		default:
			t.Errorf("spray: status %d", r.code)
		}
	}
	if ok != 14 || refused != 16 {
		t.Errorf("30 accounts from one address: %d passed and %d were refused, want 14 and 16", ok, refused)
	}
}

// TestDocsTutorialFleet runs the README's fleet tutorial
// (docs/tutorial/fleet.Caddyfile) on one instance with a real Redis: the
// address the trusted load balancer (127.0.0.1) forwards is the key, a
// client's own X-Forwarded-For entry changes nothing, the key in Redis is
// the one shown, and with Redis gone the login fails closed (503) while the
// API is limited locally, as the metrics count.
func TestDocsTutorialFleet(t *testing.T) {
	srv := redistest.Start(t)
	login, api := zoneName("login"), zoneName("api")
	loadExample(t, "../docs/tutorial/fleet.Caddyfile", map[string]string{"REDIS_URL": srv.URL()},
		map[string]string{"login": login, "api": api})
	c := clientFrom(t, "127.0.0.1")

	xff := "X-Forwarded-For: 203.0.113.7"
	for i := 1; i <= 5; i++ {
		expect(t, do(t, c, http.MethodPost, siteA+"/login", xff), 200, "login #"+strconv.Itoa(i))
	}
	r := expect(t, do(t, c, http.MethodPost, siteA+"/login", xff), 429, "login #6")
	expectRetryAfter(t, r, 10, 12, "login #6")
	expect(t, do(t, c, http.MethodPost, siteA+"/login", "X-Forwarded-For: 198.51.100.1, 203.0.113.7"), 429, "login with a client-written X-Forwarded-For entry")
	expect(t, do(t, c, http.MethodPost, siteA+"/login", "X-Forwarded-For: 198.51.100.23"), 200, "another client")

	redisKey := "sluice:v1:" + login + ":{41-cb007107}"
	pttl, ok := srv.Do(t, "PTTL", redisKey).(int64)
	if !ok || pttl <= 0 || pttl > 61_000 {
		t.Errorf("PTTL %s = %v, want a TTL of at most the window plus a second", redisKey, srv.Do(t, "PTTL", redisKey))
	}
	if n, _ := srv.Do(t, "MEMORY", "USAGE", redisKey).(int64); n <= 0 || n > 104 {
		t.Errorf("MEMORY USAGE %s = %d, want at most 104", redisKey, n)
	}

	srv.Stop()
	r = expect(t, do(t, c, http.MethodPost, siteA+"/login", "X-Forwarded-For: 192.0.2.50"), 503, "login, Redis stopped")
	if want := `{"status":503,"error":"rate limiter unavailable","zone":"` + login + `","retry_after":1}`; r.body != want {
		t.Errorf("login, Redis stopped: body %q, want %s", r.body, want)
	}
	expectRetryAfter(t, r, 1, 1, "login, Redis stopped")
	r = expect(t, get(t, c, siteA+"/api/items", "X-Api-Key: k_live_1_"+nonce), 200, "API, Redis stopped")
	if got := intHeader(t, r, "X-Ratelimit-Remaining"); got != 99 {
		t.Errorf("API, Redis stopped: X-RateLimit-Remaining %d, want 99 (this instance's memory, from zero)", got)
	}
	if n := scrapeMetric(t, "caddy_rate_limit_decisions_total", `outcome="failed_closed"`, `zone="`+login+`"`); n != 1 {
		t.Errorf("failed_closed for %s: %v, want 1", login, n)
	}
	if n := scrapeMetric(t, "caddy_rate_limit_decisions_total", `outcome="failed_local"`, `zone="`+api+`"`); n != 1 {
		t.Errorf("failed_local for %s: %v, want 1", api, n)
	}
}

// TestDocsWeightedCost loads docs/reference.md's "Weighted requests"
// snippet: /search and everything under it costs 5, anything else 1
// (issue 13, item 16); and, as the text says, a map key /search* matches
// only the literal text.
func TestDocsWeightedCost(t *testing.T) {
	snippet := docSnippet(t, "reference.md", "weighted")
	c := clientFrom(t, "127.0.0.1")
	remaining := func(path, key string) int64 {
		t.Helper()
		return intHeader(t, expect(t, get(t, c, siteA+path, key), 200, path), "X-Ratelimit-Remaining")
	}
	// drop is what a request spent, within the one event that may refill
	// (100 a minute) between two requests.
	spent := func(path, key string, before int64, want int64) int64 {
		t.Helper()
		after := remaining(path, key)
		if d := before - after; d != want && d != want-1 {
			t.Errorf("%s cost %d, want %d", path, d, want)
		}
		return after
	}

	loadSnippet(t, snippet, map[string]string{"api": zoneName("api")})
	key := "X-Api-Key: weighted_" + nonce
	left := remaining("/search?q=caddy", key)
	if left != 95 {
		t.Errorf("first search: %d remaining, want 95", left)
	}
	left = spent("/search/advanced", key, left, 5)
	left = spent("/items/42", key, left, 1)
	left = spent("/searching", key, left, 1)
	_ = spent("/search", key, left, 5)

	// The map of issue 13, item 16: `/search* 5` is compared exactly.
	wrong := strings.Replace(snippet, `~^/search(/.*)?$ 5`, `/search* 5`, 1)
	if wrong == snippet {
		t.Fatal("the snippet's map line changed: update this test")
	}
	loadSnippet(t, wrong, map[string]string{"api": zoneName("api")})
	key = "X-Api-Key: weighted_wrong_" + nonce
	left = remaining("/search", key)
	if left != 99 {
		t.Errorf("with `/search* 5`, /search left %d, want 99 (cost 1: the map compares exactly)", left)
	}
	_ = spent("/search*", key, left, 5)
}

// TestDocsHandleErrors loads docs/reference.md's handle_errors snippet: the
// sixth login attempt in a minute gets the site's own 429 text.
func TestDocsHandleErrors(t *testing.T) {
	loadSnippet(t, docSnippet(t, "reference.md", "handle-errors"), map[string]string{"login": zoneName("login")})
	c := clientFrom(t, "127.0.0.1")
	for i := 1; i <= 5; i++ {
		expect(t, do(t, c, http.MethodPost, siteA+"/login"), 200, "attempt #"+strconv.Itoa(i))
	}
	r := expect(t, do(t, c, http.MethodPost, siteA+"/login"), 429, "attempt #6")
	ra := expectRetryAfter(t, r, 10, 12, "attempt #6")
	if want := "Too many attempts; try again in " + strconv.FormatInt(ra, 10) + "s"; r.body != want {
		t.Errorf("attempt #6: body %q, want %q", r.body, want)
	}
	expect(t, get(t, c, siteA+"/login"), 200, "GET /login (not matched)")
}

// TestDocsOffSwitchPortSite follows docs/operating.md's off switch on the
// README's first tutorial, a `:port` site: the jq query's paths, PATCH
// refused while the config has no `enabled` (404), PUT creating it (and
// 409 once it exists), PATCH then flipping it, POST setting it either way,
// DELETE restoring the default.
func TestDocsOffSwitchPortSite(t *testing.T) {
	loginIP, account := zoneName("login_ip"), zoneName("login_account")
	loadExample(t, "../docs/tutorial/single.Caddyfile", nil,
		map[string]string{"login_ip": loginIP, "login_account": account, "api_key": zoneName("api_key")})
	c := clientFrom(t, "127.0.0.1")

	// What `jq 'paths(type == "object" and .handler? == "rate_limit")'` lists.
	resp, err := http.Get(adminURL + "/config/apps/http/servers")
	if err != nil {
		t.Fatal(err)
	}
	var servers any
	err = json.NewDecoder(resp.Body).Decode(&servers)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	var walk func(v any, path []string)
	walk = func(v any, path []string) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "rate_limit" {
				paths = append(paths, strings.Join(path, "/"))
			}
			for k, e := range v {
				walk(e, append(slices.Clone(path), k))
			}
		case []any:
			for i, e := range v {
				walk(e, append(slices.Clone(path), strconv.Itoa(i)))
			}
		}
	}
	walk(servers, nil)
	slices.Sort(paths)
	if want := []string{"srv0/routes/0/handle/0", "srv0/routes/1/handle/0"}; !slices.Equal(paths, want) {
		t.Fatalf("rate_limit handlers at %v, want %v (as docs/operating.md shows)", paths, want)
	}
	enabled := "/config/apps/http/servers/" + paths[0] + "/enabled"
	admin := func(method, value string, want int) {
		t.Helper()
		req, _ := http.NewRequest(method, adminURL+enabled, strings.NewReader(value))
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, enabled, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s %s %s: %d %s, want %d", method, enabled, value, resp.StatusCode, b, want)
		}
		closeIdle(c)
	}
	login := func(what string) result {
		t.Helper()
		return do(t, c, http.MethodPost, siteA+"/login", "X-Login-User: off_"+nonce)
	}
	for i := 1; i <= 5; i++ {
		expect(t, login("attempt"), 200, "attempt #"+strconv.Itoa(i))
	}
	expect(t, login("attempt #6"), 429, "attempt #6, switched on")

	admin(http.MethodPatch, "false", http.StatusNotFound) // no `enabled` in the config yet
	admin(http.MethodPut, "false", http.StatusOK)
	for i := 0; i < 3; i++ {
		expectNoLimitHeaders(t, expect(t, login("off"), 200, "switched off by PUT"), "switched off by PUT")
	}
	admin(http.MethodPut, "true", http.StatusConflict) // it exists now
	admin(http.MethodPatch, "true", http.StatusOK)
	expect(t, login("on"), 429, "switched back on by PATCH (the counter survived)")
	admin(http.MethodPost, "false", http.StatusOK)
	expect(t, login("off"), 200, "switched off by POST")
	admin(http.MethodDelete, "", http.StatusOK)
	expect(t, login("default"), 429, "enabled removed: the default, on")
}
