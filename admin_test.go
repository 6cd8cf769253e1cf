package sluice

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/admin"
)

// adminCall sends one request to the admin.api.rate_limit routes and
// returns the status and the JSON body, as Caddy's admin server would
// answer it (an error becomes its status and {"error": ...}).
func adminCall(t *testing.T, method, target string) (int, map[string]any) {
	t.Helper()
	routes := admin.API{}.Routes()
	if len(routes) != 1 || !strings.HasPrefix(target, routes[0].Pattern) {
		t.Fatalf("%s is not under the module's route %v", target, routes)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest(method, target, nil)
	err := routes[0].Handler.ServeHTTP(w, r)
	var body map[string]any
	if err != nil {
		var ae caddy.APIError
		if !errors.As(err, &ae) {
			t.Fatalf("%s %s: a non-API error %v (Caddy would answer 500)", method, target, err)
		}
		return ae.HTTPStatus, map[string]any{"error": ae.Err.Error(), "allow": w.Header().Get("Allow")}
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, target, ct)
	}
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s %s: %v in %q", method, target, err, w.Body.String())
	}
	return w.Code, body
}

func num(t *testing.T, m map[string]any, k string) int64 {
	t.Helper()
	f, ok := m[k].(float64)
	if !ok {
		t.Fatalf("field %q missing or not a number in %v", k, m)
	}
	return int64(f)
}

const adminBlock = `rate_limit {
	zone adm_keys {
		key {http.request.header.X-Api-Key} {http.request.header.X-Client}
		events 3
		window 1m
	}
	zone adm_other {
		key {http.request.header.X-Client}
		events 10
		window 1h
		burst 20
		algorithm gcra
		cost {http.request.header.X-Cost}
		fail closed
		ipv4_prefix 24
	}
}`

func TestAdminListsZones(t *testing.T) {
	newHandler(t, adminBlock, nil)
	code, body := adminCall(t, "GET", "/rate_limit/zones")
	if code != 200 {
		t.Fatalf("GET /rate_limit/zones: %d %v", code, body)
	}
	zones := map[string]map[string]any{}
	for _, z := range body["zones"].([]any) {
		m := z.(map[string]any)
		zones[m["name"].(string)] = m
	}
	a, b := zones["adm_keys"], zones["adm_other"]
	if a == nil || b == nil {
		t.Fatalf("zones %v: want adm_keys and adm_other", body)
	}
	if a["algorithm"] != "token_bucket" || num(t, a, "events") != 3 || a["window"] != "1m0s" || num(t, a, "window_ms") != 60000 ||
		num(t, a, "capacity") != 3 || num(t, a, "cost") != 1 || a["fail"] != "open" || a["enabled"] != true || a["report_only"] != false ||
		num(t, a, "ipv4_prefix") != 32 || num(t, a, "ipv6_prefix") != 64 {
		t.Errorf("adm_keys: %v", a)
	}
	if k := a["key"].([]any); len(k) != 2 || k[0] != "{http.request.header.X-Api-Key}" {
		t.Errorf("adm_keys key: %v", k)
	}
	if st := a["store"].(map[string]any); st["module"] != "memory" {
		t.Errorf("adm_keys store: %v", st)
	}
	if b["algorithm"] != "gcra" || num(t, b, "burst") != 20 || num(t, b, "capacity") != 20 || b["cost"] != "{http.request.header.X-Cost}" ||
		b["fail"] != "closed" || num(t, b, "ipv4_prefix") != 24 {
		t.Errorf("adm_other: %v", b)
	}
	code, one := adminCall(t, "GET", "/rate_limit/zones/adm_other")
	if code != 200 || one["name"] != "adm_other" || one["algorithm"] != "gcra" {
		t.Errorf("GET /rate_limit/zones/adm_other: %d %v", code, one)
	}
}

// Peek shows a key's state without charging it; reset lets the next request
// through. Keys are raw values: an API key (hashed) and an IP address
// (masked), addressed in any form, and tokens as logs show them.
func TestAdminPeekAndReset(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, adminBlock, clock)
	for _, tc := range []struct {
		name, header, value, path string
		candidate                 string
		token                     string
	}{
		{"api key", "X-Api-Key", "sk_live/51Hx Q?", "sk_live%2F51Hx%20Q%3F", "{http.request.header.X-Api-Key}", ""},
		{"ip", "X-Client", "192.0.2.7", "192.0.2.7", "{http.request.header.X-Client}", "42-c0000207"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{tc.header: tc.value}
			path := "/rate_limit/zones/adm_keys/keys/" + tc.path
			peek := func(what string) map[string]any {
				t.Helper()
				code, body := adminCall(t, "GET", path)
				if code != 200 {
					t.Fatalf("%s: GET %s: %d %v", what, path, code, body)
				}
				return body
			}

			body := peek("fresh")
			if body["found"] != false || num(t, body, "remaining") != 3 || num(t, body, "limit") != 3 || body["allowed"] != true {
				t.Fatalf("fresh key: %v", body)
			}
			serve(t, h, "GET", "/", hdr)
			clock.add(1000)
			first := peek("after 1 request")
			again := peek("again")
			if first["found"] != true || num(t, first, "remaining") != 2 || num(t, first, "reset_after_ms") != 19000 {
				t.Fatalf("after one request: %v", first)
			}
			if !jsonEqual(first, again) {
				t.Fatalf("two peeks differ: %v and %v", first, again)
			}
			var found []map[string]any
			for _, k := range first["keys"].([]any) {
				if m := k.(map[string]any); m["found"] == true {
					found = append(found, m)
				}
			}
			if len(found) != 1 || found[0]["candidate"] != tc.candidate || tc.token != "" && found[0]["token"] != tc.token {
				t.Fatalf("tokens found: %v, want one of candidate %s", found, tc.candidate)
			}
			if w := serve(t, h, "GET", "/", hdr); w.Code != 200 || w.Header().Get("X-Ratelimit-Remaining") != "1" {
				t.Fatalf("the request after the peeks: %d remaining %q, want 1 (the peeks charged nothing)", w.Code, w.Header().Get("X-Ratelimit-Remaining"))
			}
			serve(t, h, "GET", "/", hdr)
			if w := serve(t, h, "GET", "/", hdr); w.Code != http.StatusTooManyRequests {
				t.Fatalf("4th of 3: %d", w.Code)
			}
			body = peek("exhausted")
			if body["allowed"] != false || num(t, body, "remaining") != 0 || num(t, body, "retry_after_ms") != 19000 {
				t.Fatalf("exhausted: %v", body)
			}

			// The same through the token a log line shows.
			tok := found[0]["token"].(string)
			code, byToken := adminCall(t, "GET", "/rate_limit/zones/adm_keys/tokens/"+tok)
			if code != 200 || num(t, byToken, "remaining") != 0 || byToken["found"] != true {
				t.Fatalf("peek by token %s: %d %v", tok, code, byToken)
			}

			code, del := adminCall(t, "DELETE", path)
			if code != 200 || num(t, del, "deleted") != 1 || len(del["tokens"].([]any)) != 2 {
				t.Fatalf("DELETE %s: %d %v", path, code, del)
			}
			if w := serve(t, h, "GET", "/", hdr); w.Code != 200 || w.Header().Get("X-Ratelimit-Remaining") != "2" {
				t.Fatalf("after the reset: %d remaining %q, want 200 with 2", w.Code, w.Header().Get("X-Ratelimit-Remaining"))
			}
			code, del = adminCall(t, "DELETE", "/rate_limit/zones/adm_keys/tokens/"+tok)
			if code != 200 || num(t, del, "deleted") != 1 {
				t.Fatalf("DELETE by token: %d %v", code, del)
			}
			if body := peek("after reset by token"); body["found"] != false {
				t.Fatalf("after the reset by token: %v", body)
			}
		})
	}

	// An address in another form, or another address of the same masked
	// prefix, is the same client.
	serve(t, h, "GET", "/", map[string]string{"X-Client": "198.51.100.9"})
	for _, p := range []string{"198.51.100.9", "198.51.100.9:443", "%3A%3Affff%3A198.51.100.9"} {
		code, body := adminCall(t, "GET", "/rate_limit/zones/adm_keys/keys/"+p)
		if code != 200 || body["found"] != true || num(t, body, "remaining") != 2 {
			t.Errorf("GET keys/%s: %d %v", p, code, body)
		}
	}
	serve(t, h, "GET", "/", map[string]string{"X-Client": "198.51.100.9", "X-Cost": "5"})
	code, body := adminCall(t, "GET", "/rate_limit/zones/adm_other/keys/198.51.100.200") // ipv4_prefix 24
	if code != 200 || body["found"] != true || num(t, body, "remaining") != 20-1-5 {
		t.Errorf("GET adm_other/keys/198.51.100.200 (same /24): %d %v", code, body)
	}
}

func TestAdminErrors(t *testing.T) {
	newHandler(t, adminBlock, nil)
	newHandler(t, `rate_limit {
		zone adm_composite {
			key {http.request.header.A}-{http.request.header.B}
			events 1
			window 1m
		}
	}`, nil)
	for _, tc := range []struct {
		method, path string
		code         int
		says         string
	}{
		{"GET", "/rate_limit/zones/nope", 404, `unknown zone "nope"`},
		{"GET", "/rate_limit/zones/nope/keys/1.2.3.4", 404, `unknown zone "nope"`},
		{"DELETE", "/rate_limit/zones/nope/keys/1.2.3.4", 404, `unknown zone "nope"`},
		{"GET", "/rate_limit/zones/a%20b/keys/x", 404, "unknown zone"},
		{"GET", "/rate_limit/zone", 400, "malformed path"},
		{"GET", "/rate_limit/zonesx", 400, "malformed path"},
		{"GET", "/rate_limit/zones/adm_keys/keys", 400, "malformed path"},
		{"GET", "/rate_limit/zones/adm_keys/keys/", 400, "malformed path"},
		{"GET", "/rate_limit/zones/adm_keys/key/x", 400, "malformed path"},
		{"GET", "/rate_limit/zones/adm_keys/keys/x/y", 400, "malformed path"},
		{"GET", "/rate_limit/zones//keys/x", 400, "malformed path"},
		{"GET", "/rate_limit/zones/adm_keys/tokens/h1-00", 400, "malformed token"},
		{"GET", "/rate_limit/zones/adm_keys/tokens/h3-00112233445566778899aabbccddeeff", 400, "candidate 3"},
		{"GET", "/rate_limit/zones/adm_composite/keys/x-y", 400, "tokens/<token>"},
		{"POST", "/rate_limit/zones", 405, "GET"},
		{"DELETE", "/rate_limit/zones", 405, "GET"},
		{"DELETE", "/rate_limit/zones/adm_keys", 405, "GET"},
		{"PUT", "/rate_limit/zones/adm_keys/keys/x", 405, "GET, DELETE"},
	} {
		code, body := adminCall(t, tc.method, tc.path)
		msg, _ := body["error"].(string)
		if code != tc.code || !strings.Contains(msg, tc.says) {
			t.Errorf("%s %s: %d %q, want %d mentioning %q", tc.method, tc.path, code, msg, tc.code, tc.says)
		}
		if code == 405 && body["allow"] == "" {
			t.Errorf("%s %s: 405 without Allow", tc.method, tc.path)
		}
	}
	// The shared bucket of requests with no key is addressable by token.
	if code, body := adminCall(t, "GET", "/rate_limit/zones/adm_composite/tokens/e0-"); code != 200 || body["found"] != false {
		t.Errorf("GET tokens/e0-: %d %v", code, body)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
