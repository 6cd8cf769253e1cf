package caddytest_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// adminSend sends method path with a JSON body to Caddy's admin endpoint
// and decodes the JSON object it answers.
func adminSend(t *testing.T, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, adminURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s %s: status %d, body not a JSON object: %v", method, path, resp.StatusCode, err)
	}
	return resp.StatusCode, out
}

const overrideSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Api-Key}
			events 3
			window 1h
			max_overrides 2
		}
		@STORE@
	}
	respond "ok"
}
`

// exerciseOverrides is the operator's story of overrides against the
// loaded zone: raise a key's limit (the headers and the key's admin view
// show it; the history is not refunded), list it with its audit, keep it
// across a reload, refuse a third override over the bound, block a key,
// delete the override (the zone's limit again), and answer malformed
// bodies with a 400 naming the field and an unknown zone with a 404.
func exerciseOverrides(t *testing.T, tc reloader, zone string) {
	c := clientFrom(t, "127.0.0.1")
	key := "sk_" + nonce + "_ov"
	hdr := "X-Api-Key: " + key
	base := "/rate_limit/zones/" + zone + "/overrides/"
	path := base + url.PathEscape(key)

	expectLimitHeaders(t, expect(t, get(t, c, siteA+"/", hdr), 200, "before"), 3, 2, "before")
	expectLimitHeaders(t, expect(t, get(t, c, siteA+"/", hdr), 200, "2"), 3, 1, "2")
	code, body := adminSend(t, "PUT", path, `{"events": 10, "window": "1h", "expires_in": "2h", "reason": "migration tonight"}`)
	if code != 200 {
		t.Fatalf("PUT %s: %d %v", path, code, body)
	}
	// 2 spent of 10
	expectLimitHeaders(t, expect(t, get(t, c, siteA+"/", hdr), 200, "raised"), 10, 7, "raised")
	code, peek := adminAPI(t, "GET", "/rate_limit/zones/"+zone+"/keys/"+url.PathEscape(key))
	if code != 200 || jsonInt(t, peek, "limit") != 10 || jsonInt(t, peek, "remaining") != 7 || peek["overrides"] == nil {
		t.Fatalf("the key's view under the override: %d %v", code, peek)
	}
	code, list := adminAPI(t, "GET", strings.TrimSuffix(base, "/"))
	ovs, _ := list["overrides"].([]any)
	if code != 200 || len(ovs) != 1 || jsonInt(t, list, "max_overrides") != 2 {
		t.Fatalf("the listing: %d %v", code, list)
	}
	o := ovs[0].(map[string]any)
	if o["kind"] != "limit" || jsonInt(t, o, "events") != 10 || o["reason"] != "migration tonight" || !strings.HasPrefix(o["by"].(string), "127.0.0.1:") {
		t.Errorf("the override listed: %v", o)
	}

	tc.reload(t)
	expectLimitHeaders(t, expect(t, get(t, c, siteA+"/", hdr), 200, "after a reload"), 10, 6, "after a reload")

	// the bound: 2 (this key, and one more)
	if code, body := adminSend(t, "PUT", base+"other1", `{"block": true}`); code != 200 {
		t.Fatalf("a second override: %d %v", code, body)
	}
	if code, body := adminSend(t, "PUT", base+"other2", `{"block": true}`); code != http.StatusConflict || !strings.Contains(body["error"].(string), "max_overrides 2") {
		t.Fatalf("a third override of 2: %d %v", code, body)
	}
	r := expect(t, get(t, c, siteA+"/", "X-Api-Key: other1"), http.StatusTooManyRequests, "blocked")
	if ra := intHeader(t, r, "Retry-After"); ra < 3500 || ra > 3600 {
		t.Errorf("blocked for the override's hour: Retry-After %d", ra)
	}

	for _, bad := range []struct{ body, want string }{
		{`{"events": "ten", "window": "1h"}`, "field events"},
		{`{"events": 10}`, "field window"},
		{`{"events": 10, "window": "soon"}`, "field window"},
		{`{"events": 10, "window": "1h", "colour": "red"}`, `unknown field "colour"`},
		{`{"block": true, "unlimited": true}`, "field block, unlimited"},
		{`{"block": true, "expires_in": "90d"}`, "field expires_in"},
		{`{"block": true, "expires": "2001-01-01T00:00:00Z"}`, "field expires"},
		{`not json`, "not a JSON object"},
	} {
		code, body := adminSend(t, "PUT", base+"bad", bad.body)
		if msg, _ := body["error"].(string); code != 400 || !strings.Contains(msg, bad.want) {
			t.Errorf("PUT %s: %d %v, want 400 naming %q", bad.body, code, body, bad.want)
		}
	}
	if code, body := adminSend(t, "PUT", "/rate_limit/zones/no_such_zone_"+nonce+"/overrides/x", `{"block": true}`); code != 404 {
		t.Errorf("an unknown zone: %d %v, want 404", code, body)
	}

	code, body = adminSend(t, "DELETE", path, "")
	if code != 200 {
		t.Fatalf("DELETE %s: %d %v", path, code, body)
	}
	// 4 spent of 3: refused at once
	expect(t, get(t, c, siteA+"/", hdr), http.StatusTooManyRequests, "after the delete")
	if code, _ := adminSend(t, "DELETE", path, ""); code != 404 {
		t.Errorf("a second DELETE: %d, want 404", code)
	}
}

// reloader loads the test's config again.
type reloader struct{ reload func(t *testing.T) }

func TestOverridesMemory(t *testing.T) {
	tc := newTester(t)
	z := zoneName("ov_mem")
	cfg := config("", overrideSite, "ZONE", z, "STORE", "")
	load(t, tc, cfg)
	exerciseOverrides(t, reloader{func(t *testing.T) { load(t, tc, cfg) }}, z)
}

func TestOverridesRedis(t *testing.T) {
	srv := redistest.Start(t)
	tc := newTester(t)
	z := zoneName("ov_redis")
	cfg := config("", overrideSite, "ZONE", z, "STORE", "store redis "+srv.URL()+" {\n\t\t\ttimeout 2s\n\t\t}")
	load(t, tc, cfg)
	exerciseOverrides(t, reloader{func(t *testing.T) { load(t, tc, cfg) }}, z)
}

// A raw key of two candidates takes two overrides: set both or neither
// (max_overrides 1: a 409, and nothing set).
func TestOverridesKeyAllOrNothing(t *testing.T) {
	tc := newTester(t)
	z := zoneName("ov_two")
	load(t, tc, config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Api-Key} {client_ip}
			events 3
			window 1h
			max_overrides 1
		}
	}
	respond "ok"
}`, "ZONE", z))
	base := "/rate_limit/zones/" + z + "/overrides"
	code, body := adminSend(t, "PUT", base+"/203.0.113.9", `{"block": true}`)
	if msg, _ := body["error"].(string); code != http.StatusConflict || !strings.Contains(msg, "needs 2") {
		t.Errorf("two tokens into a bound of 1: %d %v, want 409", code, body)
	}
	if code, list := adminAPI(t, "GET", base); code != 200 || len(list["overrides"].([]any)) != 0 {
		t.Errorf("after the refusal: %d %v, want no override", code, list)
	}
}
