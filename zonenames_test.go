package sluice

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dunglas/httpsfv"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/memstore"
	"github.com/sluicehq/caddy-sluice/reply"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// oddZoneNames are names caddy-ratelimit accepts that Sluice once refused,
// each with something for every sink to get wrong.
var oddZoneNames = []string{
	"api/v1",
	"login:v2",
	"my zone",
	strings.Repeat("long-", 20) + "name", // over 64 bytes
	"a{b}:{c}",
	`q"uo\te`,
	"%41",
	"café ☕",
	"日本語",
	"<html>&amp;",
}

func TestZoneNameRules(t *testing.T) {
	ok := append([]string{"z", "login", "api.v2-EU_1", "a", ".", "..", " ", strings.Repeat("x", maxZoneNameLen),
		strings.Repeat("é", maxZoneNameLen/2)}, oddZoneNames...)
	for _, name := range ok {
		if err := zonemodel.ValidName(name); err != nil {
			t.Errorf("%q refused: %v", name, err)
		}
	}
	for _, bad := range []struct{ name, want string }{
		{"", "empty"},
		{strings.Repeat("x", maxZoneNameLen+1), "longer than"},
		{strings.Repeat("é", maxZoneNameLen/2) + "x", "longer than"},
		{"a\x00b", "control"},
		{"a\nb", "control"},
		{"tab\there", "control"},
		{"del\x7f", "control"},
		{"c1\u0085", "control"},
		{"bidi\u202eevil", "control"},
		{"zero\u200bwidth", "control"},
		{"bad\xffutf8", "UTF-8"},
		{"\xc3", "UTF-8"},
	} {
		err := zonemodel.ValidName(bad.name)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want one mentioning %q", bad.name, err, bad.want)
		}
	}
}

// newJSONHandler provisions a handler from its JSON configuration, on a
// private memory store with clock (as newHandler).
func newJSONHandler(t testing.TB, cfg map[string]any, clock *fakeClock) *Handler {
	t.Helper()
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := new(Handler)
	if err := json.Unmarshal(js, h); err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	if err := h.Provision(caddyContext(t)); err != nil {
		t.Fatalf("provision %s: %v", js, err)
	}
	if err := h.Validate(); err != nil {
		t.Fatalf("validate %s: %v", js, err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	h.logger = zap.NewNop()
	st := memstore.New(memstore.Config{Now: clock.now, SweepInterval: -1})
	t.Cleanup(st.Close)
	useStores(h, st, nil)
	return h
}

// draftNames returns the policy names of a RateLimit-Policy or RateLimit
// field, parsed as a structured field list and percent-decoded; every
// member's parameters are returned too.
func draftNames(t testing.TB, vals []string) ([]string, []*httpsfv.Params) {
	t.Helper()
	l, err := httpsfv.UnmarshalList(vals)
	if err != nil {
		t.Fatalf("%q is not a structured field list: %v", vals, err)
	}
	var names []string
	var params []*httpsfv.Params
	for _, m := range l {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("%q: member %v is not an item", vals, m)
		}
		s, ok := it.Value.(string)
		if !ok {
			t.Fatalf("%q: member %v is not a string", vals, it.Value)
		}
		name, err := url.PathUnescape(s)
		if err != nil {
			t.Fatalf("%q: policy %q is not percent-encoded: %v", vals, s, err)
		}
		names = append(names, name)
		params = append(params, it.Params)
	}
	return names, params
}

// TestZoneNamesInEverySink: a zone of each odd name, configured in JSON,
// decides, and its name reaches the draft fields (parsable, decoding to the
// name), the default refusal body and the handle_errors message (valid
// JSON holding the name) and the placeholders (raw) intact.
func TestZoneNamesInEverySink(t *testing.T) {
	for i, name := range oddZoneNames {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			clock := &fakeClock{ms: 1_800_000_000_000}
			zone := map[string]any{"key": "static", "max_events": 1, "window": "1h"}
			h := newJSONHandler(t, map[string]any{"rate_limits": map[string]any{name: zone}, "headers": "both"}, clock)
			w := serve(t, h, "GET", "/", nil)
			if w.Code != 200 {
				t.Fatalf("first request: %d", w.Code)
			}
			for _, f := range []string{"RateLimit-Policy", "RateLimit"} {
				if got, _ := draftNames(t, w.Header().Values(f)); len(got) != 1 || got[0] != name {
					t.Errorf("%s %q names %q, want %q", f, w.Header().Values(f), got, name)
				}
			}

			r := httptest.NewRequest("GET", "/", nil)
			repl := caddyhttp.NewTestReplacer(r)
			w = httptest.NewRecorder()
			if err := h.ServeHTTP(w, r, okHandler); err != nil || w.Code != 429 {
				t.Fatalf("second request: %d %v", w.Code, err)
			}
			var body struct {
				Zone  string `json:"zone"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Zone != name || body.Error != reply.MsgExceeded {
				t.Errorf("body %s: %+v, %v; want zone %q", w.Body, body, err, name)
			}
			if cl := w.Header().Get("Content-Length"); cl != "" && cl != strconv.Itoa(w.Body.Len()) { // else net/http sets it
				t.Errorf("Content-Length %s, body %d bytes", cl, w.Body.Len())
			}
			if z, _ := repl.GetString("http.rate_limit.zone"); z != name {
				t.Errorf("{http.rate_limit.zone} = %q, want the raw name %q", z, name)
			}
			if got, _ := draftNames(t, w.Header().Values("RateLimit")); len(got) != 1 || got[0] != name {
				t.Errorf("refusal: RateLimit names %q, want %q", got, name)
			}

			// The handle_errors message, dropped into a JSON string as
			// `{"error":"{err.message}"}` would, stays one valid string.
			h.resp = (&Response{HandleErrors: true}).Compile(reply.Settings{Legacy: h.legacy, Jitter: h.Jitter, GRPCStatus: h.GRPCStatus})
			err := h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(r.Context()), okHandler)
			var he caddyhttp.HandlerError
			if !errors.As(err, &he) {
				t.Fatalf("handle_errors: %v", err)
			}
			var msg string
			if err := json.Unmarshal([]byte(`"`+he.Err.Error()+`"`), &msg); err != nil || msg != reply.MsgExceeded+" in zone "+name {
				t.Errorf("handle_errors message %q: decodes to %q (%v)", he.Err.Error(), msg, err)
			}
		})
	}
}

// TestZoneNamesInTheCaddyfile: the names are accepted in a Caddyfile,
// quoted where a token needs it, and refused with a reason otherwise.
func TestZoneNamesInTheCaddyfile(t *testing.T) {
	for tok, name := range map[string]string{
		`api/v1`:      "api/v1",
		`login:v2`:    "login:v2",
		`"my zone"`:   "my zone",
		"`q\"uo\\te`": `q"uo\te`,
		`café`:        "café",
	} {
		h := new(Handler)
		block := "rate_limit {\n\tzone " + tok + " {\n\t\tevents 1\n\t\twindow 1m\n\t}\n}"
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(block)); err != nil {
			t.Errorf("zone %s: %v", tok, err)
			continue
		}
		if _, ok := h.RateLimits[name]; !ok || len(h.RateLimits) != 1 {
			t.Errorf("zone %s: parsed as %v, want %q", tok, h.RateLimits, name)
		}
	}
	err := validateCaddyfile(t, site("", "\t\tzone \"a\tb\" {\n\t\t\tevents 1\n\t\t\twindow 1m\n\t\t}"))
	if err == nil || !strings.Contains(err.Error(), "control") || !strings.Contains(err.Error(), `zone "a\tb"`) {
		t.Errorf("a name with a tab: %v, want a refusal at load naming the zone and control characters", err)
	}
}
