package caddytest_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// The asynchronous mode (zone setting sync, docs/redis.md) through a real
// Caddy and a real Redis.

// syncSite is a site with a fixed_window zone of 20 per hour keyed on the
// client's IP in the asynchronous mode (@SYNC@ its setting), an exact zone
// of @EXACT@ per hour on path /both, and store redis @URL@.
const syncSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 20
			window 1h
			algorithm fixed_window
			sync @SYNC@
		}
		zone @ZONE@_exact {
			match {
				path /both
			}
			key {client_ip}
			events @EXACT@
			window 1h
			fail closed
		}
		store redis @URL@ {
			timeout 250ms
		}
	}
	respond "@BODY@"
}
`

// syncAdmin is the zone's sync in the admin API.
func syncAdmin(t *testing.T, zone string) map[string]any {
	t.Helper()
	code, body := adminAPI(t, "GET", "/rate_limit/zones/"+zone)
	s, _ := body["sync"].(map[string]any)
	if code != 200 || s == nil {
		t.Fatalf("GET /rate_limit/zones/%s: %d %v, want its sync", zone, code, body)
	}
	return s
}

// TestSyncRedisStoppedAndStarted: Redis stops mid-test; the zone keeps
// deciding here (no 5xx, the limit held from what this instance knows),
// the admin view shows the failures, the lag and the units held; Redis
// starts again and the held charges land: Redis counts every admission.
func TestSyncRedisStoppedAndStarted(t *testing.T) {
	srv := redistest.Start(t)
	tc := newTester(t)
	z := zoneName("sync_outage")
	load(t, tc, config("", syncSite, "ZONE", z, "SYNC", "20ms", "EXACT", "100", "URL", srv.URL(), "BODY", "ok"))
	c := clientFrom(t, "127.0.0.21")
	for i := range 5 {
		expect(t, get(t, c, siteA+"/"), 200, "before the outage #"+string(rune('1'+i)))
	}
	waitUntil(t, 10*time.Second, "the first sync", func() bool { return jsonInt(t, syncAdmin(t, z), "held") == 0 })
	srv.Stop()
	admitted := 5
	for range 25 {
		r := get(t, c, siteA+"/")
		switch r.code {
		case 200:
			admitted++
		case 429:
		default:
			t.Fatalf("with Redis stopped: %d %s, want the zone decided here", r.code, r.body)
		}
	}
	if admitted != 20 {
		t.Errorf("%d admitted in all, want exactly the limit 20 (one instance: exact)", admitted)
	}
	waitUntil(t, 10*time.Second, "a failed sync shown", func() bool {
		s := syncAdmin(t, z)
		return jsonInt(t, s, "failures") > 0 && s["error"] != nil
	})
	s := syncAdmin(t, z)
	if jsonInt(t, s, "held") != 15 {
		t.Errorf("held %v, want the 15 admitted during the outage", s["held"])
	}
	if jsonInt(t, s, "lag_ms") < 20 {
		t.Errorf("lag %v ms during the outage, want at least an interval", s["lag_ms"])
	}
	if !strings.Contains(s["bound"].(string), "20 + (I-1)") {
		t.Errorf("bound %q, want the formula with the limit", s["bound"])
	}
	srv.Restart(t)
	waitUntil(t, 15*time.Second, "the held charges synced", func() bool {
		s := syncAdmin(t, z)
		return jsonInt(t, s, "held") == 0 && jsonInt(t, s, "failures") == 0
	})
	// The held charges landed: Redis counts the 15, plus the 5 from before
	// if the restart kept its data (then the key is at its limit).
	keys := scanRedis(t, srv)
	if len(keys) != 1 {
		t.Fatalf("Redis holds %v, want the one key", keys)
	}
	r := get(t, c, siteA+"/")
	if rem := r.header.Get("X-Ratelimit-Remaining"); !(r.code == 200 && rem == "4" || r.code == 429) {
		t.Errorf("after the outage: %d, remaining %q; want 200 with 4 left (20 - 15 synced - 1) or 429 (the 5 before kept too)", r.code, rem)
	}
}

// TestSyncBesideExactZone: a request with a zone in the mode and an exact
// zone: the exact zone's refusal refuses it and takes the async charge
// back, so the async zone still admits its whole limit elsewhere.
func TestSyncBesideExactZone(t *testing.T) {
	srv := redistest.Start(t)
	tc := newTester(t)
	z := zoneName("sync_beside")
	load(t, tc, config("", syncSite, "ZONE", z, "SYNC", "20ms", "EXACT", "3", "URL", srv.URL(), "BODY", "ok"))
	c := clientFrom(t, "127.0.0.22")
	for i := range 6 {
		want := 200
		if i >= 3 {
			want = 429
		}
		expect(t, get(t, c, siteA+"/both"), want, "both zones")
	}
	for i := range 20 {
		want := 200
		if i >= 17 {
			want = 429
		}
		expect(t, get(t, c, siteA+"/"), want, "the async zone alone")
	}
}

// TestSyncReloadKeepsLocalState: a reload keeps the charges an instance
// holds and has not sent (a sync of a minute: nothing reached Redis), so
// the limit holds across it.
func TestSyncReloadKeepsLocalState(t *testing.T) {
	srv := redistest.Start(t)
	tc := newTester(t)
	z := zoneName("sync_reload")
	load(t, tc, config("", syncSite, "ZONE", z, "SYNC", "1m", "EXACT", "100", "URL", srv.URL(), "BODY", "one"))
	c := clientFrom(t, "127.0.0.23")
	for range 15 {
		expect(t, get(t, c, siteA+"/"), 200, "before the reload")
	}
	if keys := scanRedis(t, srv); len(keys) != 0 {
		t.Fatalf("Redis holds %v before the first sync", keys)
	}
	load(t, tc, config("", syncSite, "ZONE", z, "SYNC", "1m", "EXACT", "100", "URL", srv.URL(), "BODY", "two"))
	for i := range 10 {
		want := 200
		if i >= 5 {
			want = 429
		}
		r := expect(t, get(t, c, siteA+"/"), want, "after the reload")
		if want == 200 && r.body != "two" {
			t.Fatalf("answered %q: the reload did not take", r.body)
		}
	}
}

// TestSyncDistributedWithRedis: caddy-ratelimit's distributed block loads
// where the directive has a Redis store: its zones in the asynchronous
// mode at the lesser interval, a zone without algorithm a sliding window.
func TestSyncDistributedWithRedis(t *testing.T) {
	srv := redistest.Start(t)
	tc := newTester(t)
	z := zoneName("sync_distributed")
	site := "http://localhost:@A@ {\n\trate_limit {\n\t\tzone @ZONE@ {\n\t\t\tkey {remote_host}\n\t\t\tevents 2\n\t\t\twindow 1h\n\t\t}\n" +
		"\t\tdistributed {\n\t\t\tread_interval 5s\n\t\t\twrite_interval 2s\n\t\t\tpurge_age 1m\n\t\t}\n\t\tstore redis @URL@\n\t}\n\trespond ok\n}\n"
	load(t, tc, config("", site, "ZONE", z, "URL", srv.URL()))
	c := clientFrom(t, "127.0.0.24")
	expect(t, get(t, c, siteA+"/"), 200, "#1")
	expect(t, get(t, c, siteA+"/"), 200, "#2")
	expect(t, get(t, c, siteA+"/"), 429, "#3")
	zones := listedZones(t)
	if zones[z]["algorithm"] != "sliding_window" {
		t.Errorf("algorithm %v, want sliding_window", zones[z]["algorithm"])
	}
	if s := syncAdmin(t, z); s["interval"] != "2s" {
		t.Errorf("sync %v, want the interval 2s", s)
	}
}

// waitUntil polls cond until it holds, failing the test past timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSyncZoneTakesNoOverride: a zone in the asynchronous mode decides from
// counts no script call overrides, so the admin API refuses an override
// for it (a 400 saying why) rather than storing one nothing would obey.
func TestSyncZoneTakesNoOverride(t *testing.T) {
	srv := redistest.Start(t)
	tc := newTester(t)
	z := zoneName("sync_override")
	load(t, tc, config("", syncSite, "ZONE", z, "SYNC", "20ms", "EXACT", "3", "URL", srv.URL(), "BODY", "ok"))
	code, body := adminSend(t, "PUT", "/rate_limit/zones/"+z+"/overrides/127.0.0.24", `{"block": true, "expires_in": "1h"}`)
	if msg, _ := body["error"].(string); code != http.StatusBadRequest || !strings.Contains(msg, "asynchronously") {
		t.Errorf("an override on a sync zone: %d %v, want 400 naming the mode", code, body)
	}
}
