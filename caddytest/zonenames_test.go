package caddytest_test

import (
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dunglas/httpsfv"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/internal/zonename"
)

// oddNames are zone names caddy-ratelimit accepts and Sluice once refused,
// each with something for a sink to get wrong. zoneName adds "_<n>" to
// each, which changes none of that.
var oddNames = []string{
	"api/v1",
	"login:v2",
	"my zone",
	strings.Repeat("long.", 20) + "name",
	"a{b}:{c}",
	`q"uo\te`,
	"%41",
	"café ☕",
	"trailing/",
	"/lead",
	"a//b/../c",
}

// namedZoneSite is a site with one zone named @ZONE@ (a backquoted
// Caddyfile token: any name without a backquote), keyed on a header.
const namedZoneSite = "\nhttp://localhost:@A@ {\n\trate_limit {\n\t\tzone `@ZONE@` {\n\t\t\tkey {http.request.header.X-Key}\n\t\t\tevents 1\n\t\t\twindow 1h\n\t\t}\n\t\theaders both\n\t}\n\trespond \"ok\"\n}\n"

// draftPolicies returns the policy names of a draft field, parsed as a
// structured field list and percent-decoded.
func draftPolicies(t *testing.T, vals []string) []string {
	t.Helper()
	l, err := httpsfv.UnmarshalList(vals)
	if err != nil {
		t.Fatalf("%q is not a structured field list: %v", vals, err)
	}
	var out []string
	for _, m := range l {
		it, ok := m.(httpsfv.Item)
		s, isStr := it.Value.(string)
		if !ok || !isStr {
			t.Fatalf("%q: member %v is not a string item", vals, m)
		}
		name, err := url.PathUnescape(s)
		if err != nil {
			t.Fatalf("%q: policy %q is not percent-encoded: %v", vals, s, err)
		}
		out = append(out, name)
	}
	return out
}

// promLabel escapes a label value as the Prometheus text format writes it.
func promLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// TestZoneNamesEndToEnd: a zone of each odd name, through Caddy with the
// memory store, decides; its name reaches the draft fields (parsable,
// decoding to the name), the default refusal body (valid JSON holding the
// name), the placeholders and the metrics (raw), and the admin API
// addresses it percent-encoded and lists it raw.
func TestZoneNamesEndToEnd(t *testing.T) {
	tc := newTester(t)
	for i, base := range append(oddNames, ".", "..") {
		name := base
		if base != "." && base != ".." {
			name = zoneName(base)
		}
		key := "X-Key: names-" + nonce + "-" + strconv.Itoa(i) + "-" + strconv.FormatInt(seq.Add(1), 10)
		what := strconv.Quote(name)
		load(t, tc, config("", namedZoneSite, "ZONE", name))

		r := expect(t, get(t, tc.Client, siteA+"/", key), 200, what+": first request")
		expectLimitHeaders(t, r, 1, 0, what)
		for _, f := range []string{"RateLimit-Policy", "RateLimit"} {
			if got := draftPolicies(t, r.header.Values(f)); !slices.Equal(got, []string{name}) {
				t.Errorf("%s: %s %q names %q", what, f, r.header.Values(f), got)
			}
		}

		r = expect(t, get(t, tc.Client, siteA+"/", key), 429, what+": second request")
		var body struct {
			Status int    `json:"status"`
			Zone   string `json:"zone"`
		}
		if err := json.Unmarshal([]byte(r.body), &body); err != nil || body.Zone != name || body.Status != 429 {
			t.Errorf("%s: refusal body %s: %+v, %v", what, r.body, body, err)
		}
		if got := draftPolicies(t, r.header.Values("RateLimit")); !slices.Equal(got, []string{name}) {
			t.Errorf("%s: refusal's RateLimit names %q", what, got)
		}

		if m := scrapeDecisions(t, promLabel(name)); m["allowed"] != 1 || m["refused"] != 1 {
			t.Errorf("%s: decisions by outcome %v, want 1 allowed and 1 refused", what, m)
		}

		if z := listedZones(t)[name]; z == nil {
			t.Errorf("%s: not listed by GET /rate_limit/zones (raw name)", what)
		}
		k := strings.TrimPrefix(key, "X-Key: ")
		// The documented encoding (every byte outside [A-Za-z0-9_.-]), with
		// '.' too for the names "." and "..", which a path would lose.
		enc := zonename.Key(name)
		if name == "." || name == ".." {
			enc = strings.ReplaceAll(name, ".", "%2E")
		}
		paths := []string{"/rate_limit/zones/" + enc + "/keys/" + url.PathEscape(k)}
		if pe := url.PathEscape(name); pe != enc && !strings.Contains(name, "..") && name != "." {
			paths = append(paths, "/rate_limit/zones/"+pe+"/keys/"+url.PathEscape(k)) // Go's own escaping works too
		}
		for _, p := range paths {
			code, peek := adminAPI(t, "GET", p)
			if code != 200 || peek["zone"] != name || peek["found"] != true || jsonInt(t, peek, "remaining") != 0 {
				t.Errorf("%s: GET %s: %d %v", what, p, code, peek)
			}
		}
		if code, info := adminAPI(t, "GET", "/rate_limit/zones/"+enc); code != 200 || info["name"] != name {
			t.Errorf("%s: GET /rate_limit/zones/%s: %d %v", what, enc, code, info)
		}
		if code, reset := adminAPI(t, "DELETE", paths[0]); code != 200 || jsonInt(t, reset, "deleted") != 1 {
			t.Errorf("%s: DELETE %s: %d %v", what, paths[0], code, reset)
		}
		expect(t, get(t, tc.Client, siteA+"/", key), 200, what+": after the reset")
	}
}

// TestZoneNamesRedisKeys: with a Redis store, each odd name's key is
// <prefix><name percent-encoded>:{<token>} (SCAN on a real server), with
// the identity token as the only hash tag.
func TestZoneNamesRedisKeys(t *testing.T) {
	tc := newTester(t)
	srv := redistest.Start(t)
	var zones strings.Builder
	names := make([]string, len(oddNames))
	for i, base := range oddNames {
		names[i] = zoneName(base)
		zones.WriteString("\t\tzone `" + names[i] + "` {\n\t\t\tkey {http.request.header.X-Key}\n\t\t\tevents 1\n\t\t\twindow 1h\n\t\t}\n")
	}
	load(t, tc, config("", `
http://localhost:@A@ {
	rate_limit {
@ZONES@		store redis @URL@ {
			timeout 2s
		}
	}
	respond "ok"
}
`, "ZONES", zones.String(), "URL", srv.URL()))
	key := "X-Key: redis-names-" + nonce
	expect(t, get(t, tc.Client, siteA+"/", key), 200, "first request")
	r := expect(t, get(t, tc.Client, siteA+"/", key), 429, "second request")
	var body struct{ Zone string }
	if err := json.Unmarshal([]byte(r.body), &body); err != nil || !slices.Contains(names, body.Zone) {
		t.Errorf("refusal body %s: %+v %v", r.body, body, err)
	}

	keys := scanRedis(t, srv)
	if len(keys) != len(names) {
		t.Fatalf("SCAN: %d keys %q, want one per zone (%d)", len(keys), keys, len(names))
	}
	var tag string
	for _, name := range names {
		prefix := "sluice:v1:" + zonename.Key(name) + ":{"
		var found []string
		for _, k := range keys {
			if strings.HasPrefix(k, prefix) {
				found = append(found, k)
			}
		}
		if len(found) != 1 {
			t.Errorf("zone %q: keys %q, want exactly one starting %q (of %q)", name, found, prefix, keys)
			continue
		}
		k := found[0]
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 || !strings.HasSuffix(k, "}") {
			t.Errorf("zone %q: key %q has braces beside its hash tag", name, k)
		}
		ht := k[strings.IndexByte(k, '{'):]
		if tag == "" {
			tag = ht
		} else if ht != tag {
			t.Errorf("zone %q: hash tag %s, other zones of the same client %s", name, ht, tag)
		}
	}
}
