package caddytest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// adminAPI sends one request to Caddy's admin endpoint and decodes the JSON
// answer (an object), failing the test on anything else.
func adminAPI(t *testing.T, method, path string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, adminURL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := doRetry(t, c, req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("%s %s: status %d, body not a JSON object: %v", method, path, resp.StatusCode, err)
	}
	return resp.StatusCode, body
}

func jsonInt(t *testing.T, m map[string]any, k string) int64 {
	t.Helper()
	f, ok := m[k].(float64)
	if !ok {
		t.Fatalf("field %q missing or not a number in %v", k, m)
	}
	return int64(f)
}

// listedZones returns the zones GET /rate_limit/zones lists, by name.
func listedZones(t *testing.T) map[string]map[string]any {
	t.Helper()
	code, body := adminAPI(t, "GET", "/rate_limit/zones")
	if code != 200 {
		t.Fatalf("GET /rate_limit/zones: %d %v", code, body)
	}
	out := map[string]map[string]any{}
	list, _ := body["zones"].([]any)
	for _, z := range list {
		m := z.(map[string]any)
		out[m["name"].(string)] = m
	}
	return out
}

// adminSite is a site with one zone keyed on an API key header, else the
// client's IP, and the given store block.
const adminSite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Api-Key} {client_ip}
			events 3
			window 1h
			fail closed
		}
		@STORE@
	}
	respond "ok"
}
`

// exerciseAdmin runs the operator's story against the loaded zone: list it,
// peek a client without charging it, exhaust it, reset it, for a client
// keyed by API key (hashed) and one keyed by IP address (masked). It
// returns the tokens the store must have held.
func exerciseAdmin(t *testing.T, zone, wantStore string) {
	zones := listedZones(t)
	z := zones[zone]
	if z == nil {
		t.Fatalf("GET /rate_limit/zones does not list %s: %v", zone, zones)
	}
	if z["algorithm"] != "token_bucket" || jsonInt(t, z, "events") != 3 || z["window"] != "1h0m0s" || z["fail"] != "closed" {
		t.Errorf("zone %s listed as %v", zone, z)
	}
	if st, _ := z["store"].(map[string]any); st["module"] != wantStore {
		t.Errorf("zone %s store %v, want module %s", zone, z["store"], wantStore)
	}

	apiKey := "sk_live/" + nonce + "/Zt9 Wv4"
	for _, c := range []struct {
		name   string
		client *http.Client
		hdrs   []string
		key    string // raw, as the admin API takes it
	}{
		{"api key", clientFrom(t, "127.0.0.1"), []string{"X-Api-Key: " + apiKey}, apiKey},
		{"ip", clientFrom(t, "127.0.0.3"), nil, "127.0.0.3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := "/rate_limit/zones/" + zone + "/keys/" + url.PathEscape(c.key)
			send := func(want int, remaining int64, what string) {
				t.Helper()
				r := expect(t, get(t, c.client, siteA+"/", c.hdrs...), want, what)
				if want == 200 {
					if got := intHeader(t, r, "X-Ratelimit-Remaining"); got != remaining {
						t.Errorf("%s: X-RateLimit-Remaining %d, want %d", what, got, remaining)
					}
				}
			}
			peek := func(what string) map[string]any {
				t.Helper()
				code, body := adminAPI(t, "GET", path)
				if code != 200 {
					t.Fatalf("%s: GET %s: %d %v", what, path, code, body)
				}
				return body
			}

			if body := peek("before any request"); body["found"] != false || jsonInt(t, body, "remaining") != 3 {
				t.Fatalf("a client never seen: %v", body)
			}
			send(200, 2, "request 1")
			for i := 1; i <= 2; i++ {
				body := peek("peek " + strconv.Itoa(i))
				if body["found"] != true || jsonInt(t, body, "remaining") != 2 || jsonInt(t, body, "limit") != 3 || body["allowed"] != true {
					t.Fatalf("peek %d after 1 of 3: %v", i, body)
				}
			}
			// The peeks charged nothing: the next request sees 1 left.
			send(200, 1, "request 2, after two peeks")
			send(200, 0, "request 3")
			send(http.StatusTooManyRequests, 0, "request 4 of 3")
			body := peek("exhausted")
			if body["allowed"] != false || jsonInt(t, body, "remaining") != 0 || jsonInt(t, body, "retry_after_ms") <= 0 {
				t.Fatalf("an exhausted client: %v", body)
			}

			code, del := adminAPI(t, "DELETE", path)
			if code != 200 || jsonInt(t, del, "deleted") != 1 {
				t.Fatalf("DELETE %s: %d %v", path, code, del)
			}
			send(200, 2, "the request after the reset")
		})
	}
}

// The admin API through the in-process Caddy with the memory store.
func TestAdminAPIMemory(t *testing.T) {
	tc := newTester(t)
	z := zoneName("admin_mem")
	load(t, tc, config("", adminSite, "ZONE", z, "STORE", ""))
	exerciseAdmin(t, z, "memory")
	adminAPIErrors(t, z)
}

// The admin API through the in-process Caddy with a real Redis: the peek
// reads Redis, the reset deletes the key there.
func TestAdminAPIRedis(t *testing.T) {
	srv := redistest.Start(t)
	tc := newTester(t)
	z := zoneName("admin_redis")
	load(t, tc, config("", adminSite, "ZONE", z, "STORE", "store redis "+srv.URL()+" {\n\t\t\ttimeout 2s\n\t\t}"))
	exerciseAdmin(t, z, "redis")
	zones := listedZones(t)
	if st, _ := zones[z]["store"].(map[string]any); st["target"] != "redis://"+srv.Addr || st["key_prefix"] != "sluice:v1:" {
		t.Errorf("redis store listed as %v", st)
	}
	// The reset deleted the keys; the requests after it wrote them again.
	code, body := adminAPI(t, "DELETE", "/rate_limit/zones/"+z+"/keys/127.0.0.3")
	if code != 200 || jsonInt(t, body, "deleted") != 1 {
		t.Fatalf("DELETE: %d %v", code, body)
	}
	if keys := scanRedis(t, srv); len(keys) != 1 {
		t.Errorf("Redis holds %v; want only the API key's", keys)
	}
	// Redis down: the admin API answers 503 with a JSON error, promptly.
	srv.Stop()
	start := time.Now()
	code, body = adminAPI(t, "GET", "/rate_limit/zones/"+z+"/keys/127.0.0.3")
	if code != http.StatusServiceUnavailable || body["error"] == nil {
		t.Errorf("GET with Redis down: %d %v, want 503 with an error", code, body)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("GET with Redis down took %v", el)
	}
}

// adminAPIErrors: 404 for an unknown zone, 400 for a malformed path, 405
// for another method, each with a JSON error body.
func adminAPIErrors(t *testing.T, zone string) {
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/rate_limit/zones/no_such_zone/keys/127.0.0.1", 404},
		{"DELETE", "/rate_limit/zones/no_such_zone/keys/127.0.0.1", 404},
		{"GET", "/rate_limit/zones/no_such_zone", 404},
		{"GET", "/rate_limit/zones/" + zone + "/keys", 400},
		{"GET", "/rate_limit/zones/" + zone + "/keys/a/b", 400},
		{"GET", "/rate_limit/zones/" + zone + "/tokens/not-a-token", 400},
		{"GET", "/rate_limit/nothing", 400},
		{"POST", "/rate_limit/zones", 405},
		{"PUT", "/rate_limit/zones/" + zone + "/keys/127.0.0.1", 405},
	} {
		code, body := adminAPI(t, tc.method, tc.path)
		if code != tc.code || body["error"] == nil {
			t.Errorf("%s %s: %d %v, want %d with an error", tc.method, tc.path, code, body, tc.code)
		}
	}
}

// The listing follows the active configuration: a reload replaces it, and a
// configuration refused at load (after one of its handlers provisioned)
// leaves the running one listed.
func TestAdminAPIFollowsReloads(t *testing.T) {
	tc := newTester(t)
	za, zb, zc := zoneName("admin_gen_a"), zoneName("admin_gen_b"), zoneName("admin_gen_c")
	load(t, tc, config("", adminSite, "ZONE", za, "STORE", ""))
	if zs := listedZones(t); zs[za] == nil {
		t.Fatalf("%s not listed: %v", za, zs)
	}
	load(t, tc, config("", adminSite, "ZONE", zb, "STORE", ""))
	zs := listedZones(t)
	if zs[zb] == nil || zs[za] != nil {
		t.Fatalf("after the reload: %v, want %s and not %s", zs, zb, za)
	}
	if code, _ := adminAPI(t, "GET", "/rate_limit/zones/"+za+"/keys/127.0.0.1"); code != 404 {
		t.Errorf("a zone of the unloaded configuration: %d, want 404", code)
	}

	// The first handler provisions (and registers zc), the second fails.
	bad := fmt.Sprintf(`{"admin":{"listen":"localhost:%d","config":{"persist":false}},"storage":{"module":"file_system","root":%q},
"apps":{"http":{"servers":{"a":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
{"handler":"rate_limit","rate_limits":{%q:{"max_events":5,"window":60000000000}}},
{"handler":"rate_limit","rate_limits":{"bad_zone":{"max_events":5,"window":60000000000,"fail":"sideways"}}}]}]}}}}}`,
		adminPort, storageDir, portA, zc)
	expectLoadRefused(t, bad, "application/json", "bad_zone", "fail")
	zs = listedZones(t)
	if zs[zb] == nil || zs[zc] != nil || zs["bad_zone"] != nil {
		t.Fatalf("after a refused load: %v, want %s only", zs, zb)
	}
	expect(t, get(t, tc.Client, siteA+"/"), 200, "the running configuration still serves")
}
