package sluice

import (
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/caddy-sluice/telemetry"
)

// TestReportOnly: 50 requests past a limit of 10 all pass; the headers count
// down to 0; the log and the metric count exactly 40 would-be refusals; the
// state evolves as under enforcement (a would-be refusal charges nothing).
func TestReportOnly(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone report_z {
			key {http.request.header.X-User}
			events 10
			window 1h
			report_only
		}
	}`, clock)
	core, logs := observer.New(zap.InfoLevel)
	h.logger = zap.New(core)
	user := map[string]string{"X-User": "r"}
	for i := 0; i < 50; i++ {
		w := serve(t, h, "GET", "/", user)
		if w.Code != 200 {
			t.Fatalf("request %d: status %d, want 200 (report only)", i+1, w.Code)
		}
		want := max(0, 9-i)
		if got := w.Header().Get("X-Ratelimit-Remaining"); got != strconv.Itoa(want) {
			t.Fatalf("request %d: remaining %q, want %d", i+1, got, want)
		}
	}
	if got := testutil.ToFloat64(telemetry.Metrics.Decisions.WithLabelValues("report_z", telemetry.OutcomeReportOnly)); got != 40 {
		t.Fatalf("report_only_refused metric = %v, want 40", got)
	}
	if got := testutil.ToFloat64(telemetry.Metrics.Decisions.WithLabelValues("report_z", telemetry.OutcomeAllowed)); got != 10 {
		t.Fatalf("allowed metric = %v, want 10", got)
	}
	// Every would-be refusal is accounted for in the log: written lines plus
	// the counts of lines the sampler suppressed.
	lines := logs.FilterMessage("rate limit would be exceeded (report only)").All()
	total := int64(len(lines)) + h.refusalLog.Suppressed()
	for _, l := range lines {
		f := l.ContextMap()
		if f["zone"] != "report_z" || f["retry_after"] != int64(360) || f["cost"] != int64(1) || f["key"] == "" {
			t.Fatalf("log line fields %v", f)
		}
		total += f["suppressed_since_last"].(int64)
	}
	if total != 40 || len(lines) == 0 || len(lines) > 40 {
		t.Fatalf("log accounts for %d would-be refusals in %d lines, want 40", total, len(lines))
	}
	// Enforcing it now (same state): exactly what report-only predicted.
	clock.add(360_000) // one token back
	h2 := newHandler(t, `rate_limit {
		zone report_z {
			key {http.request.header.X-User}
			events 10
			window 1h
		}
	}`, nil)
	useStores(h2, h.store, nil)
	if w := serve(t, h2, "GET", "/", user); w.Code != 200 {
		t.Fatalf("after one refill, enforced: %d, want 200", w.Code)
	}
	if w := serve(t, h2, "GET", "/", user); w.Code != 429 {
		t.Fatalf("enforced past the limit: %d, want 429", w.Code)
	}
}

// TestReportOnlyNeverVetoes: a report-only zone that would refuse does not
// block an enforcing zone, which is charged; an enforcing refusal charges
// the report-only zone nothing.
func TestReportOnlyNeverVetoes(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone ro_tight {
			key {http.request.header.X-User}
			events 1
			window 1h
			report_only
		}
		zone ro_enforced {
			key {http.request.header.X-User}
			events 3
			window 1h
		}
		headers draft
	}`, clock)
	user := map[string]string{"X-User": "v"}
	for i := 0; i < 3; i++ {
		w := serve(t, h, "GET", "/", user)
		if w.Code != 200 {
			t.Fatalf("request %d: %d", i+1, w.Code)
		}
		got := parseDraft(t, w.Header())
		if got["ro_enforced"].r != int64(2-i) || got["ro_tight"].r != 0 {
			t.Fatalf("request %d: %+v", i+1, got)
		}
	}
	w := serve(t, h, "GET", "/", user)
	if w.Code != 429 || w.Header().Get("Retry-After") != "1200" {
		t.Fatalf("enforced zone exhausted: %d Retry-After %q, want 429 / 1200", w.Code, w.Header().Get("Retry-After"))
	}
}

// TestZoneOffSwitch: `enabled false` on one zone switches it off and leaves
// the directive's other zones deciding.
func TestZoneOffSwitch(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone zoff_off {
			key {http.request.header.X-User}
			events 1
			window 1h
			enabled false
		}
		zone zoff_on {
			key {http.request.header.X-User}
			events 3
			window 1h
		}
		headers draft
	}`, &fakeClock{ms: 1_800_000_000_000})
	user := map[string]string{"X-User": "z"}
	for i := 0; i < 3; i++ {
		w := serve(t, h, "GET", "/", user)
		got := parseDraft(t, w.Header())
		if w.Code != 200 || len(got) != 1 || got["zoff_on"].r != int64(2-i) {
			t.Fatalf("request %d: %d %+v; only zoff_on may decide", i+1, w.Code, got)
		}
	}
	if w := serve(t, h, "GET", "/", user); w.Code != 429 {
		t.Fatalf("zoff_on exhausted: %d", w.Code)
	}
}
