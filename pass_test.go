package sluice

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/caddy-sluice/telemetry"
)

// on_exceed pass: every request reaches the next handler; exactly the
// would-be refusals carry {http.rate_limit.exceeded} = true and the zone;
// they are counted as exceeded_passed and charge nothing; an enforcing
// zone of the same directive still refuses.
func TestOnExceedPass(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone soft_quota {
			key {http.request.header.X-User}
			events 3
			window 1h
			on_exceed pass
		}
		zone hard_cap {
			key {http.request.header.X-User}
			events 6
			window 1h
		}
	}`, clock)
	type seen struct{ exceeded, zone, remaining string }
	var got []seen
	app := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		got = append(got, seen{
			exceeded:  repl.ReplaceAll("{http.rate_limit.exceeded}", ""),
			zone:      repl.ReplaceAll("{http.rate_limit.zone}", ""),
			remaining: repl.ReplaceAll("{http.rate_limit.remaining}", ""),
		})
		w.WriteHeader(200)
		return nil
	})
	before := testutil.ToFloat64(telemetry.Metrics.Decisions.WithLabelValues("soft_quota", telemetry.OutcomeExceededPassed))
	var codes []int
	for range 8 {
		w, err := serveNext(t, h, app, map[string]string{"X-User": "u"})
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, w.Code)
	}
	// soft_quota passes 3, then marks; hard_cap refuses the 7th and 8th
	// (the marked ones charged only hard_cap).
	want := []int{200, 200, 200, 200, 200, 200, 429, 429}
	for i := range want {
		if codes[i] != want[i] {
			t.Fatalf("statuses %v, want %v", codes, want)
		}
	}
	if len(got) != 6 {
		t.Fatalf("the application saw %d requests, want 6", len(got))
	}
	for i, s := range got {
		if i < 3 && (s.exceeded != "false" || s.zone != "") {
			t.Errorf("request %d (within the quota) carries exceeded %q zone %q; want false and none", i+1, s.exceeded, s.zone)
		}
		if i >= 3 && (s.exceeded != "true" || s.zone != "soft_quota" || s.remaining != "0") {
			t.Errorf("request %d (over the quota) carries exceeded %q zone %q remaining %q; want true, soft_quota, 0", i+1, s.exceeded, s.zone, s.remaining)
		}
	}
	// Counted like report_only: every request the zone would refuse (the
	// 4th to 6th, forwarded; the 7th and 8th, refused by hard_cap).
	if d := testutil.ToFloat64(telemetry.Metrics.Decisions.WithLabelValues("soft_quota", telemetry.OutcomeExceededPassed)) - before; d != 5 {
		t.Errorf("exceeded_passed counted %v, want 5", d)
	}
	// The soft zone was charged 3 (the marked requests charged it nothing).
	if d := peekZone(t, h, "soft_quota", "u"); d.Remaining != 0 || d.ResetAfter.Seconds() != 3600 {
		t.Errorf("soft_quota shows %+v; want its 3 charges only", d)
	}
}

// report_only decides and records, but hands nothing on.
func TestReportOnlyHandsNothingOn(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone dry_run {
			key {http.request.header.X-User}
			events 1
			window 1h
			report_only
		}
	}`, clock)
	var marks []string
	app := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		marks = append(marks, repl.ReplaceAll("{http.rate_limit.exceeded}", ""))
		return nil
	})
	for range 3 {
		if _, err := serveNext(t, h, app, map[string]string{"X-User": "u"}); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range marks {
		if m != "" {
			t.Errorf("request %d: exceeded %q under report_only; want nothing handed on", i, m)
		}
	}
}

// A penalty: refused at once for its length, Retry-After counting down,
// then the bucket's own behaviour.
func TestPenaltyThroughTheHandler(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone box {
			key {http.request.header.X-User}
			events 2
			window 10s
			penalty 1m
		}
	}`, clock)
	u := map[string]string{"X-User": "u"}
	retry := func(w interface{ Header() http.Header }) int {
		n, _ := strconv.Atoi(w.Header().Get("Retry-After"))
		return n
	}
	for i := range 2 {
		if w := serve(t, h, "GET", "/", u); w.Code != 200 {
			t.Fatalf("request %d: %d", i, w.Code)
		}
	}
	w := serve(t, h, "GET", "/", u)
	if w.Code != 429 || retry(w) != 60 {
		t.Fatalf("3rd: %d Retry-After %q; want 429, 60 (the penalty)", w.Code, w.Header().Get("Retry-After"))
	}
	for _, step := range []struct {
		advance int64
		retry   int
	}{{10_000, 50}, {20_000, 30}, {29_000, 1}} {
		clock.add(step.advance)
		if w := serve(t, h, "GET", "/", u); w.Code != 429 || retry(w) != step.retry {
			t.Fatalf("in the penalty: %d Retry-After %q; want 429, %d", w.Code, w.Header().Get("Retry-After"), step.retry)
		}
	}
	clock.add(999)
	if w := serve(t, h, "GET", "/", u); w.Code != 429 {
		t.Fatalf("1ms before the penalty's end: %d", w.Code)
	}
	clock.add(1)
	for i := range 2 {
		if w := serve(t, h, "GET", "/", u); w.Code != 200 {
			t.Fatalf("after the penalty, request %d: %d (the bucket is full again)", i, w.Code)
		}
	}
	if w := serve(t, h, "GET", "/", u); w.Code != 429 || retry(w) != 60 {
		t.Fatalf("the next refusal: %d Retry-After %q; want a new penalty", w.Code, w.Header().Get("Retry-After"))
	}
}

// A directive with an on_exceed pass zone marks the requests it lets
// through; a later directive's refusal still names its own zone in its
// placeholders, and a later pass directive that is exceeded overrides an
// earlier one's "false".
func TestPassMarksAndLaterDirectives(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	soft := newHandler(t, `rate_limit {
		zone soft_first {
			key {http.request.header.X-User}
			events 100
			window 1h
			on_exceed pass
		}
	}`, clock)
	hard := newHandler(t, `rate_limit {
		zone hard_second {
			key {http.request.header.X-User}
			events 1
			window 1h
		}
		response {
			body "refused by {http.rate_limit.zone}, exceeded {http.rate_limit.exceeded}"
		}
	}`, clock)
	softer := newHandler(t, `rate_limit {
		zone soft_second {
			key {http.request.header.X-User}
			events 1
			window 1h
			on_exceed pass
		}
	}`, clock)
	chain := func(second *Handler) (*http.Response, string) {
		var seen string
		final := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
			seen = repl.ReplaceAll("{http.rate_limit.exceeded}|{http.rate_limit.zone}", "")
			return nil
		})
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			return second.ServeHTTP(w, r, final)
		})
		w, err := serveNext(t, soft, next, map[string]string{"X-User": "u"})
		if err != nil {
			t.Fatal(err)
		}
		return w.Result(), seen + w.Body.String()
	}
	if _, seen := chain(hard); seen != "false|" {
		t.Fatalf("within both: the application sees %q, want false|", seen)
	}
	if resp, body := chain(hard); resp.StatusCode != 429 || body != "refused by hard_second, exceeded true" {
		t.Fatalf("refused by the second directive: %d %q", resp.StatusCode, body)
	}
	if _, seen := chain(softer); seen != "false|" {
		t.Fatalf("within the soft second: %q", seen)
	}
	if _, seen := chain(softer); seen != "true|soft_second" {
		t.Fatalf("over the soft second: the application sees %q, want true|soft_second", seen)
	}
}
