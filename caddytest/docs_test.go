package caddytest_test

// The behaviour the manual (README.md, docs/) shows, against the running
// Caddy: the tutorials' Caddyfiles as they are in docs/tutorial/, and the
// snippets of docs/*.md marked <!-- snippet: id NAME --> as they are
// written (the root package's docs_test.go checks that every snippet loads).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/redisstore"
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
	if most := redisstore.KeyTTL(time.Minute).Milliseconds(); !ok || pttl <= 0 || pttl > most {
		t.Errorf("PTTL %s = %v, want a TTL of at most the window plus a second, rounded up (%dms)", redisKey, srv.Do(t, "PTTL", redisKey), most)
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

// TestDocsModules compares the module table of docs/reference.md (the rows
// after <!-- modules --> to the end of the table) with the modules whose ID
// names rate_limit in `caddy list-modules` of cmd/caddy, both ways: the
// list shows nothing the table does not explain, and the table lists
// nothing the build lacks (issue 23, item 13).
func TestDocsModules(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "docs", "reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(raw), "<!-- modules -->\n")
	if !ok {
		t.Fatal("docs/reference.md: no <!-- modules --> table")
	}
	documented := map[string]bool{}
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, m := range regexp.MustCompile("`([a-z0-9_.]+)`").FindAllStringSubmatch(first, -1) {
			documented[m[1]] = true
		}
	}
	// The built command, not this test binary, which registers modules
	// of its own tests.
	out, err := exec.Command(filepath.Join(consoleCaddy(t), "caddy"), "list-modules").Output()
	if err != nil {
		t.Fatalf("caddy list-modules: %v", err)
	}
	registered := map[string]bool{}
	for _, id := range strings.Fields(string(out)) {
		if strings.Contains(id, "rate_limit") {
			registered[id] = true
		}
	}
	for id := range registered {
		if !documented[id] {
			t.Errorf("module %s is registered (caddy list-modules shows it) but not in docs/reference.md's module table", id)
		}
	}
	for id := range documented {
		if !registered[id] {
			t.Errorf("docs/reference.md's module table lists %s, which this build does not register", id)
		}
	}
	if len(documented) == 0 {
		t.Error("docs/reference.md's module table lists no module")
	}

	// As the table says, the simulator's modules load only in a replay.
	for _, handler := range []string{"rate_limit_simulate_upstream", "rate_limit_simulate_auth"} {
		expectLoadRefused(t, fmt.Sprintf(`{"admin":{"listen":"localhost:%d"},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[{"handler":%q}]}]}}}}}`, adminPort, portA, handler),
			"application/json", handler, "only `caddy rate-limit simulate`")
	}
	expectLoadRefused(t, fmt.Sprintf(`{"admin":{"listen":"localhost:%d"},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[{"handler":"rate_limit","rate_limits":{"z":{"key":"{client_ip}","max_events":1,"window":"1m"}},"store":{"module":"simulate"}}]}]}}}}}`, adminPort, portA),
		"application/json", "only `caddy rate-limit simulate`")
}

// The console blocks of README.md and docs/*.md are sessions: a line
// starting with "$ " is a command (a line ending in "\" continues on the
// next), the lines after it are what it prints. TestDocsConsole runs each
// block in one bash session, in a directory where docs/, examples/ and
// Caddyfile.example are the project's and bin/caddy (also first in PATH as
// caddy) is cmd/caddy built once, and compares what each command prints
// with the block, after normaliseConsole and allowing what consoleLine
// allows. At the end of the last line before a block (its own line, or
// the paragraph's last):
//
//	<!-- console: caddy <file> -->  a `caddy run --config <file>` is started
//	                                first (the command the text tells the
//	                                reader to run in another terminal);
//	<!-- console: not run: <why> --> the block is not run; say why.
//
// An output line "..." stands for any lines (the block shows that it is
// shortened). The ports the pages use (consolePorts) are each replaced by
// a free one in commands, and back in the output. Commands the test does
// itself: `redis-server ...` is a redistest server (its port is the one
// the block names), `go build -o bin/caddy ./cmd/caddy` is the build above,
// and `go run ./cmd/caddy` runs it.

// consoleMarker is a <!-- console: ... --> comment at the end of a line.
var consoleMarker = regexp.MustCompile(`<!-- console:(.*?)-->$`)

// consolePorts are the loopback ports the pages' sessions use.
var consolePorts = []string{"8080", "8081", "8082", "2019", "2020", "2021", "6390"}

// consoleBlock is one ```console block of a page.
type consoleBlock struct {
	where  string // page:line
	marker string // the <!-- console: ... --> line before it, if any
	steps  []consoleStep
}

// consoleStep is one command and the output shown after it.
type consoleStep struct {
	cmd  string
	want []string
}

// consoleBlocks returns every ```console block of README.md and docs/*.md.
func consoleBlocks(t *testing.T) []consoleBlock {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{filepath.Join("..", "README.md")}, pages...)
	var out []consoleBlock
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		for i := 0; i < len(lines); i++ {
			if lines[i] != "```console" {
				continue
			}
			b := consoleBlock{where: fmt.Sprintf("%s:%d", strings.TrimPrefix(page, "../"), i+1)}
			// The marker ends the last line before the block (after any
			// blank line).
			prev := i - 1
			for prev > 0 && lines[prev] == "" {
				prev--
			}
			if m := consoleMarker.FindStringSubmatch(lines[max(prev, 0)]); m != nil {
				b.marker = strings.TrimSpace(m[1])
			}
			for i++; i < len(lines) && lines[i] != "```"; i++ {
				line := lines[i]
				if cmd, ok := strings.CutPrefix(line, "$ "); ok {
					for strings.HasSuffix(cmd, "\\") && i+1 < len(lines) {
						i++
						cmd += "\n" + lines[i]
					}
					b.steps = append(b.steps, consoleStep{cmd: cmd})
					continue
				}
				if len(b.steps) == 0 {
					t.Errorf("%s: output before any command (a block that is not a session is not ```console)", b.where)
					continue
				}
				s := &b.steps[len(b.steps)-1]
				s.want = append(s.want, line)
			}
			out = append(out, b)
		}
	}
	return out
}

// consoleRules normalise what changes from run to run, in the pages'
// output and in the real output alike.
var consoleRules = []struct {
	re   *regexp.Regexp
	repl string
}{
	// An HTTP date, and a Unix time in seconds (X-RateLimit-Reset).
	{regexp.MustCompile(`[A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT`), "<date>"},
	{regexp.MustCompile(`\b1[7-9]\d{8}\b`), "<unix time>"},
	// A Go duration with a fraction: the time left, as the admin API reads it.
	{regexp.MustCompile(`"(\d+m)?\d+\.\d+s"`), `"<duration>"`},
	// The simulator's own speed.
	{regexp.MustCompile(`run in [0-9.]+[µmn]?s \(replay: \d+ lines/s\)`), "run in <time> (replay: <rate> lines/s)"},
}

// consoleVaries are commands whose whole output is a number that changes
// with time (a TTL in milliseconds).
var consoleVaries = regexp.MustCompile(`^redis-cli .* pttl `)

func normaliseConsole(cmd string, lines []string) []string {
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		// curl -i prints the header lines with CRLF; a page keeps no
		// trailing space.
		l = strings.TrimRight(l, " \r")
		for _, r := range consoleRules {
			l = r.re.ReplaceAllString(l, r.repl)
		}
		if consoleVaries.MatchString(cmd) {
			l = regexp.MustCompile(`^\d+$`).ReplaceAllString(l, "<ms>")
		}
		out = append(out, l)
	}
	return out
}

// consoleMatch compares output lines with the block's, where a "..." line
// of the block stands for any lines.
func consoleMatch(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if want[0] == "..." {
		for i := 0; i <= len(got); i++ {
			if consoleMatch(want[1:], got[i:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && consoleLine(want[0], got[0]) && consoleMatch(want[1:], got[1:])
}

// consoleRetryAfter is a Retry-After in seconds, as a header, in the
// refusal's JSON body or in an access log field (operating.md's log_append).
var consoleRetryAfter = regexp.MustCompile(`(Retry-After: |"retry_after":|"rate_limit_retry_after":)(\d+)`)

// consoleLine compares one line. A Retry-After may be up to 5 s shorter
// than the page's: it counts down from the refused key's last charge, and
// a loaded machine takes longer between the commands than the page's run.
func consoleLine(want, got string) bool {
	if want == got {
		return true
	}
	w, g := consoleRetryAfter.FindAllStringSubmatch(want, -1), consoleRetryAfter.FindAllStringSubmatch(got, -1)
	if len(w) == 0 || len(w) != len(g) || consoleRetryAfter.ReplaceAllString(want, "$1") != consoleRetryAfter.ReplaceAllString(got, "$1") {
		return false
	}
	for i := range w {
		wn, _ := strconv.Atoi(w[i][2])
		gn, _ := strconv.Atoi(g[i][2])
		if gn > wn || gn < wn-5 {
			return false
		}
	}
	return true
}

var (
	consoleBuildOnce sync.Once
	consoleBinDir    string
	consoleBuildErr  error
)

// consoleCaddy builds cmd/caddy once for this test process and returns the
// directory holding bin/caddy.
func consoleCaddy(t *testing.T) string {
	t.Helper()
	consoleBuildOnce.Do(func() {
		// Not t.TempDir: the build outlives this test for the next ones,
		// in storageDir, which TestMain removes.
		consoleBinDir = filepath.Join(storageDir, "console-bin")
		out, err := exec.Command("go", "build", "-o", filepath.Join(consoleBinDir, "caddy"), "github.com/sluicehq/caddy-sluice/cmd/caddy").CombinedOutput()
		if err != nil {
			consoleBuildErr = fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
		}
	})
	if consoleBuildErr != nil {
		t.Fatal(consoleBuildErr)
	}
	return consoleBinDir
}

// consoleShell is one bash session in a block's directory.
type consoleShell struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	mu     sync.Mutex
	stdout bytes.Buffer
	stderr bytes.Buffer
	seq    int
}

// lockedWriter appends to a buffer under the shell's lock.
type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func startConsoleShell(t *testing.T, dir string, env []string) *consoleShell {
	t.Helper()
	sh := &consoleShell{t: t}
	sh.cmd = exec.Command("bash", "--noprofile", "--norc")
	sh.cmd.Dir = dir
	sh.cmd.Env = env
	sh.cmd.Stdout = lockedWriter{&sh.mu, &sh.stdout}
	sh.cmd.Stderr = lockedWriter{&sh.mu, &sh.stderr}
	sh.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var err error
	if sh.stdin, err = sh.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := sh.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The session's background jobs (the Caddy instances) first, then
		// the shell; whatever is left of its process group after that.
		_, _ = io.WriteString(sh.stdin, "kill $(jobs -p) 2>/dev/null; wait; exit\n")
		done := make(chan struct{})
		go func() { _ = sh.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-sh.cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			sh.mu.Lock()
			t.Logf("the session's stderr:\n%s", sh.stderr.String())
			sh.mu.Unlock()
		}
	})
	return sh
}

// run runs one command and returns the lines it printed on stdout.
func (sh *consoleShell) run(cmd string) []string {
	sh.t.Helper()
	sh.seq++
	end := fmt.Sprintf("__console_end_%d__", sh.seq)
	// A newline first, for output that does not end with one.
	if _, err := io.WriteString(sh.stdin, cmd+"\necho; echo "+end+"\n"); err != nil {
		sh.t.Fatalf("%s: %v", cmd, err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		sh.mu.Lock()
		s := sh.stdout.String()
		if before, _, ok := strings.Cut(s, "\n"+end+"\n"); ok {
			sh.stdout.Reset()
			sh.mu.Unlock()
			if before == "" {
				return nil
			}
			return strings.Split(before, "\n")
		}
		sh.mu.Unlock()
		if time.Now().After(deadline) {
			sh.t.Fatalf("%s: no end after 2 minutes; output so far:\n%s", cmd, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitConsoleAdmin waits until an admin endpoint answers GET /config/.
func waitConsoleAdmin(t *testing.T, port string) {
	t.Helper()
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := c.Get("http://localhost:" + port + "/config/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Caddy answers on admin port %s after 60 s: %v", port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freeConsolePorts maps each of consolePorts to a free loopback port.
func freeConsolePorts(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	var ls []net.Listener
	for _, p := range consolePorts {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		m[p] = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return m
}

// TestDocsConsole runs every console block of the manual and compares its
// output (issue 23, item 11).
func TestDocsConsole(t *testing.T) {
	blocks := consoleBlocks(t)
	if len(blocks) == 0 {
		t.Fatal("no ```console block found")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		t.Run(b.where, func(t *testing.T) {
			if why, ok := strings.CutPrefix(b.marker, "not run:"); ok {
				if strings.TrimSpace(why) == "" {
					t.Errorf("%s: `not run:` says no reason", b.where)
				}
				return
			}
			runConsoleBlock(t, root, b)
		})
	}
}

func runConsoleBlock(t *testing.T, root string, b consoleBlock) {
	for _, tool := range []string{"bash", "curl", "jq", "redis-cli"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the manual's console blocks need %s: %v (scripts/test-deps.sh installs it)", tool, err)
		}
	}
	bin := consoleCaddy(t)
	dir := t.TempDir()
	for _, name := range []string{"docs", "examples", "Caddyfile.example"} {
		if err := os.Symlink(filepath.Join(root, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(bin, filepath.Join(dir, "bin")); err != nil {
		t.Fatal(err)
	}
	ports := freeConsolePorts(t)
	word := regexp.MustCompile(`\b\d{4,5}\b`)
	rewrite := func(s string, m map[string]string) string {
		return word.ReplaceAllStringFunc(s, func(p string) string {
			if q, ok := m[p]; ok {
				return q
			}
			return p
		})
	}
	reverse := map[string]string{}
	for from, to := range ports {
		reverse[to] = from
	}
	env := append(os.Environ(),
		"PATH="+bin+":"+os.Getenv("PATH"),
		"XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
	for _, name := range []string{"SLUICE_PORT", "SLUICE_ADMIN_PORT", "REDIS_URL"} {
		env = append(env, name+"=") // what the reader's shell has not set
	}
	sh := startConsoleShell(t, dir, env)
	sh.run("unset SLUICE_PORT SLUICE_ADMIN_PORT REDIS_URL")

	if file, ok := strings.CutPrefix(b.marker, "caddy "); ok {
		sh.run(fmt.Sprintf("SLUICE_PORT=%s SLUICE_ADMIN_PORT=%s caddy run --config %s 2>caddy-marker.log &", ports["8080"], ports["2019"], strings.TrimSpace(file)))
		waitConsoleAdmin(t, ports["2019"])
	} else if b.marker != "" {
		t.Fatalf("%s: unknown marker %q", b.where, b.marker)
	}
	adminPort := regexp.MustCompile(`SLUICE_ADMIN_PORT=(\d+)`)
	for _, s := range b.steps {
		cmd := rewrite(s.cmd, ports)
		// What `go run ./cmd/caddy` would build is bin/caddy.
		if rest, ok := strings.CutPrefix(cmd, "go run ./cmd/caddy "); ok {
			cmd = "caddy " + rest
		}
		var got []string
		switch {
		case strings.HasPrefix(s.cmd, "redis-server "):
			srv := redistest.Start(t)
			_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL(), "redis://"))
			ports["6390"] = port
			reverse[port] = "6390"
		case s.cmd == "go build -o bin/caddy ./cmd/caddy":
			// bin/caddy is the build above.
		default:
			got = sh.run(cmd)
			if strings.HasSuffix(strings.TrimSpace(cmd), "&") {
				if m := adminPort.FindStringSubmatch(cmd); m != nil {
					waitConsoleAdmin(t, m[1])
				}
			}
		}
		got = strings.Split(rewrite(strings.Join(got, "\n"), reverse), "\n")
		if len(got) > 0 && got[len(got)-1] == "" {
			got = got[:len(got)-1] // the newline run adds
		}
		want, norm := normaliseConsole(s.cmd, s.want), normaliseConsole(s.cmd, got)
		if !consoleMatch(want, norm) {
			t.Errorf("%s: $ %s\nthe page shows:\n%s\nit prints:\n%s", b.where, s.cmd, strings.Join(s.want, "\n"), strings.Join(got, "\n"))
		}
	}
}

// TestDocsConsoleLine checks what consoleLine lets differ: a Retry-After
// counted down by a few seconds, nothing else.
func TestDocsConsoleLine(t *testing.T) {
	for _, tc := range []struct {
		want, got string
		ok        bool
	}{
		{"Retry-After: 180", "Retry-After: 180", true},
		{"Retry-After: 180", "Retry-After: 178", true},
		{"Retry-After: 180", "Retry-After: 181", false},
		{"Retry-After: 180", "Retry-After: 170", false},
		{`{"zone":"login","retry_after":12} 429`, `{"zone":"login","retry_after":11} 429`, true},
		{`{"zone":"login","retry_after":12} 429`, `{"zone":"api","retry_after":12} 429`, false},
		{`{"status":429,"rate_limit_retry_after":30}`, `{"status":429,"rate_limit_retry_after":28}`, true},
		{`{"status":429,"rate_limit_retry_after":30}`, `{"status":200,"rate_limit_retry_after":28}`, false},
		{"X-Ratelimit-Remaining: 19", "X-Ratelimit-Remaining: 18", false},
	} {
		if got := consoleLine(tc.want, tc.got); got != tc.ok {
			t.Errorf("consoleLine(%q, %q) = %v, want %v", tc.want, tc.got, got, tc.ok)
		}
	}
}
