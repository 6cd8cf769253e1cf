package caddytest_test

import (
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The migration guide's promise (README, "Migrating from caddy-ratelimit"):
// a Caddyfile written for mholt/caddy-ratelimit, in its grammar, loads
// (its `distributed` and `storage` are refused, naming `store redis`),
// and with `algorithm sliding_log` in each zone and `response
// handle_errors` it behaves as that plugin documents: a zone allows at most
// `events` in any `window` (a sliding window over the exact events), a key
// without placeholders is one limit for all clients, a placeholder key one
// per value, matchers select the requests, a refusal is a 429 error handed
// to the site's error routes with {http.rate_limit.exceeded.name} set and
// Retry-After (plus up to `jitter` of it), and `log_key` logs the key.

// mholtSites is caddy-ratelimit's grammar, every subdirective of its
// Caddyfile but distributed and storage (refused below), plus the two lines
// the guide adds: `algorithm sliding_log` per zone and `response
// handle_errors` (site A). Site B keeps Sluice's own refusal.
const mholtSites = `
http://localhost:@A@ {
	rate_limit {
		zone @STATIC@ {
			match {
				method GET
				path /static
			}
			key    static
			events 3
			window 1m
			algorithm sliding_log
		}
		zone @DYNAMIC@ {
			match {
				path /dynamic
			}
			key    {remote_host}
			events 2
			window 2s
			algorithm sliding_log
		}
		sweep_interval 1m
		log_key
		response handle_errors
	}
	respond "I'm behind the rate limiter!"
	handle_errors {
		respond "{err.status_code} {http.rate_limit.exceeded.name}"
	}
}

http://localhost:@B@ {
	rate_limit {
		zone @JITTER@ {
			key    {remote_host}
			events 1
			window 10s
			algorithm sliding_log
		}
		jitter 0.5
	}
	respond "I'm behind the rate limiter!"
}
`

// TestMigrationFromCaddyRatelimit loads mholtSites and checks the behaviour
// caddy-ratelimit documents, zone by zone.
func TestMigrationFromCaddyRatelimit(t *testing.T) {
	tc := newTester(t)
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	static, dynamic, jitter := zoneName("mholt_static"), zoneName("mholt_dynamic"), zoneName("mholt_jitter")
	// The global option caddy-ratelimit's README tells its users to add.
	global := "\torder rate_limit before basicauth\n" + logGlobal(logPath, "INFO")
	load(t, tc, config(global, mholtSites, "STATIC", static, "DYNAMIC", dynamic, "JITTER", jitter))
	refusedBy := func(r result, zone, what string) {
		t.Helper()
		expect(t, r, 429, what)
		if want := "429 " + zone; r.body != want {
			t.Errorf("%s: body %q, want %q (rendered by handle_errors with {http.rate_limit.exceeded.name})", what, r.body, want)
		}
	}

	// key static: one limit for every client, GET /static only.
	for i, ip := range []string{"127.0.0.2", "127.0.0.2", "127.0.0.3"} {
		expect(t, get(t, clientFrom(t, ip), siteA+"/static"), 200, "GET /static #"+strconv.Itoa(i+1)+" from "+ip)
	}
	r := get(t, clientFrom(t, "127.0.0.4"), siteA+"/static")
	refusedBy(r, static, "GET /static #4, from yet another client")
	expectRetryAfter(t, r, 59, 60, "GET /static #4")
	expect(t, do(t, clientFrom(t, "127.0.0.4"), http.MethodPost, siteA+"/static"), 200, "POST /static (the zone matches GET)")

	// key {remote_host}: 2 in any 2 s, per client address, sliding.
	c, other := clientFrom(t, "127.0.0.5"), clientFrom(t, "127.0.0.6")
	sentA := time.Now()
	expect(t, get(t, c, siteA+"/dynamic"), 200, "A")
	time.Sleep(600 * time.Millisecond)
	expect(t, get(t, c, siteA+"/dynamic"), 200, "B, 0.6 s later")
	before := time.Since(sentA)
	r = get(t, c, siteA+"/dynamic")
	after := time.Since(sentA)
	refusedBy(r, dynamic, "C, right after B")
	// C waits until A leaves the window: 2 s after A (a token bucket of 2 per
	// 2 s would have it wait for one token, 1 s after A).
	expectRetryAfter(t, r, ceilSec(2*time.Second-after), ceilSec(2*time.Second-before), "C")
	expect(t, get(t, other, siteA+"/dynamic"), 200, "another address")
	expect(t, get(t, other, siteA+"/dynamic"), 200, "another address #2")
	// Once A has left the window, one more passes; B is still in it, so the
	// next is refused. (A token bucket would have refilled both by now.)
	time.Sleep(time.Until(sentA.Add(2*time.Second + 50*time.Millisecond)))
	expect(t, get(t, c, siteA+"/dynamic"), 200, "D, A out of the window")
	refusedBy(get(t, c, siteA+"/dynamic"), dynamic, "E, B still in the window")

	// jitter 0.5: Retry-After is the wait plus up to half of it. Site B has
	// no handle_errors: Sluice's own JSON refusal.
	jc := clientFrom(t, "127.0.0.7")
	expect(t, get(t, jc, siteB+"/"), 200, "jitter #1")
	r = expect(t, get(t, jc, siteB+"/"), 429, "jitter #2")
	expectRetryAfter(t, r, 9, 15, "jitter #2")
	if !strings.HasPrefix(r.body, `{"status":429,"error":"rate limit exceeded","zone":"`+jitter+`"`) {
		t.Errorf("jitter #2: body %q, want Sluice's JSON refusal", r.body)
	}

	// log_key: the refusal's log line carries the key.
	lines, _ := readLog(t, logPath)
	logged := false
	for _, l := range lines {
		if l.str("logger") == sluiceLogger && l.str("msg") == "rate limit exceeded" && l.str("zone") == dynamic {
			logged = true
			if l.str("raw_key") != "127.0.0.5" {
				t.Errorf("refusal log line %v: raw_key %q, want 127.0.0.5", l, l.str("raw_key"))
			}
		}
	}
	if !logged {
		t.Errorf("no refusal log line for zone %s", dynamic)
	}
	// sweep_interval reached the memory store's setting.
	swept := 0
	for _, h := range findHandlers(adminConfig(t), "rate_limit") {
		if h["sweep_interval"] == float64(time.Minute) && h["log_key"] == true {
			swept++
		}
	}
	if swept != 1 {
		t.Errorf("%d rate_limit handlers with sweep_interval 1m and log_key, want 1", swept)
	}
}

// ceilSec is d in whole seconds, rounded up.
func ceilSec(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// TestMigrationJSONFromCaddyRatelimit: caddy-ratelimit's JSON example (its
// field names, windows as duration strings, a single key string) loads with
// `"algorithm": "sliding_log"` added, and limits as documented.
func TestMigrationJSONFromCaddyRatelimit(t *testing.T) {
	z := zoneName("mholt_json")
	body := jsonConfig(`[{"handler":"rate_limit","rate_limits":{"@ZONE@":{"match":[{"method":["GET"]}],"key":"static","window":"1m","max_events":2,"algorithm":"sliding_log"}},"jitter":0.0,"sweep_interval":"1m"},{"handler":"static_response","body":"I'm behind the rate limiter!"}]`, z)
	if code, msg := postLoad(t, body, "application/json"); code != http.StatusOK {
		t.Fatalf("POST /load: %d %s", code, msg)
	}
	c := clientFrom(t, "127.0.0.8")
	expect(t, get(t, c, siteA+"/"), 200, "GET #1")
	expect(t, get(t, clientFrom(t, "127.0.0.9"), siteA+"/"), 200, "GET #2, another client")
	expect(t, get(t, c, siteA+"/"), 429, "GET #3")
	expect(t, do(t, c, http.MethodPost, siteA+"/"), 200, "POST")
}

// TestMigrationRefusesDistributed: caddy-ratelimit's distributed block
// (read_interval, write_interval, purge_age) and storage fail to load with
// the Sluice equivalent named, rather than running with limits that are not
// shared.
func TestMigrationRefusesDistributed(t *testing.T) {
	z := zoneName("mholt_distributed")
	for name, extra := range map[string]string{
		"distributed": "\t\tdistributed {\n\t\t\tread_interval 5s\n\t\t\twrite_interval 5s\n\t\t\tpurge_age 1m\n\t\t}\n",
		"storage":     "\t\tstorage file_system {\n\t\t\troot /tmp/ratelimit\n\t\t}\n",
	} {
		t.Run(name, func(t *testing.T) {
			site := "http://localhost:@A@ {\n\trate_limit {\n\t\tzone @ZONE@ {\n\t\t\tkey {remote_host}\n\t\t\tevents 2\n\t\t\twindow 5s\n\t\t}\n" + extra + "\t}\n\trespond ok\n}\n"
			expectLoadRefused(t, config("\torder rate_limit before basicauth\n", site, "ZONE", z), "text/caddyfile", name, "store redis")
		})
	}
}
