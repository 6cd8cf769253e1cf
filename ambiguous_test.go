package sluice

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sluicehq/caddy-sluice/telemetry"
)

// serveHeader sends one request with header (names as given, values in
// order) through h, and returns the recorder, the handler's error and
// whether the next handler ran.
func serveHeader(t *testing.T, h *Handler, header http.Header) (*httptest.ResponseRecorder, error, bool) {
	t.Helper()
	r := httptest.NewRequest("GET", "/", nil)
	for k, vs := range header {
		r.Header[k] = vs
	}
	caddyhttp.NewTestReplacer(r)
	w := httptest.NewRecorder()
	reached := false
	err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		reached = true
		w.WriteHeader(http.StatusOK)
		return nil
	}))
	return w, err, reached
}

// TestAmbiguousKeyRefusedWith400: a request whose key header carries
// different values is refused with a 400 Caddy error, reaches nothing,
// gets no rate limit header, charges no zone (the account's nor the
// address's), and is counted and logged with the zone and the header's
// name, never its values.
func TestAmbiguousKeyRefusedWith400(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone amb_account {
			key {http.request.header.X-User} {http.request.remote.host}
			events 5
			window 1h
		}
		zone amb_addr {
			key {http.request.remote.host}
			events 6
			window 1h
		}
	}`, clock)
	core, logs := observer.New(zap.InfoLevel)
	h.logger = zap.New(core)

	for i, hdr := range []http.Header{
		{"X-User": {"alice", "mallory-1"}},
		{"X-User": {"mallory-2", "alice"}},
		{"X-User": {"alice", ""}},
		{"X-User": {"alice"}, "X_user": {"mallory-3"}},
		{"X-User": {"alice"}, "x-user": {"mallory-4"}},
	} {
		w, err, reached := serveHeader(t, h, hdr)
		var he caddyhttp.HandlerError
		if !errors.As(err, &he) || he.StatusCode != http.StatusBadRequest {
			t.Fatalf("ambiguous request %d: error %v, want a 400 HandlerError", i+1, err)
		}
		if reached {
			t.Errorf("ambiguous request %d reached the next handler", i+1)
		}
		for name := range w.Header() {
			if l := strings.ToLower(name); strings.Contains(l, "ratelimit") || l == "retry-after" {
				t.Errorf("ambiguous request %d: header %s set", i+1, name)
			}
		}
		if msg := err.Error(); strings.Contains(msg, "alice") || strings.Contains(msg, "mallory") || !strings.Contains(msg, "amb_account") || !strings.Contains(msg, "X-User") {
			t.Errorf("error %q: want the zone and the header's name, never a value", msg)
		}
	}
	if got := testutil.ToFloat64(telemetry.Metrics.Decisions.WithLabelValues("amb_account", telemetry.OutcomeAmbiguous)); got != 5 {
		t.Errorf("ambiguous_key metric = %v, want 5", got)
	}
	lines := logs.FilterMessage("rate limit key is ambiguous: request refused with 400").All()
	if len(lines) != 5 {
		t.Errorf("%d log lines, want 5", len(lines))
	}
	for _, l := range lines {
		f := l.ContextMap()
		if f["zone"] != "amb_account" || f["source"] != "header" || f["name"] != "X-User" {
			t.Errorf("log line fields %v", f)
		}
	}
	for _, e := range logs.All() {
		for _, f := range e.Context {
			if strings.Contains(f.String, "alice") || strings.Contains(f.String, "mallory") {
				t.Errorf("log line %q holds a header value: %v", e.Message, e.ContextMap())
			}
		}
	}

	// Nothing was charged: alice has her 5, the address its 6.
	for i := 1; i <= 5; i++ {
		if w, err, _ := serveHeader(t, h, http.Header{"X-User": {"alice", "alice"}}); err != nil || w.Code != 200 {
			t.Fatalf("alice #%d (the header repeated identically): %d %v, want 200", i, w.Code, err)
		}
	}
	if w, _, _ := serveHeader(t, h, http.Header{"X-User": {"alice"}}); w.Code != http.StatusTooManyRequests {
		t.Fatalf("alice #6: %d, want 429", w.Code)
	}
	if w, _, _ := serveHeader(t, h, nil); w.Code != 200 || w.Header().Get("X-Ratelimit-Remaining") != "0" {
		t.Fatalf("the address's 6th: %d remaining %q, want 200 and 0", w.Code, w.Header().Get("X-Ratelimit-Remaining"))
	}
}

// TestAmbiguousKeyReportOnly: a report-only zone refuses nothing: the
// ambiguous request passes, decided by the other zones alone; the
// report-only zone is not charged (as the refusal it reports would charge
// nothing) and counts and logs it.
func TestAmbiguousKeyReportOnly(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone amb_ro_account {
			key {http.request.header.X-User} {http.request.remote.host}
			events 10
			window 1h
			report_only
		}
		zone amb_ro_addr {
			key {http.request.remote.host}
			events 100
			window 1h
		}
	}`, clock)
	core, logs := observer.New(zap.InfoLevel)
	h.logger = zap.New(core)
	for i := 1; i <= 3; i++ {
		w, err, reached := serveHeader(t, h, http.Header{"X-User": {"alice", "mallory"}})
		if err != nil || !reached || w.Code != 200 {
			t.Fatalf("ambiguous request %d in a report-only zone: %d %v (reached %v), want 200", i, w.Code, err, reached)
		}
		// The headers are the enforcing zone's: the report-only zone
		// decided nothing.
		if l, r := w.Header().Get("X-Ratelimit-Limit"), w.Header().Get("X-Ratelimit-Remaining"); l != "100" || r != strconv.Itoa(100-i) {
			t.Fatalf("ambiguous request %d: limit %s remaining %s, want 100 and %d", i, l, r, 100-i)
		}
	}
	if got := testutil.ToFloat64(telemetry.Metrics.Decisions.WithLabelValues("amb_ro_account", telemetry.OutcomeReportOnlyAmbiguous)); got != 3 {
		t.Errorf("report_only_ambiguous_key metric = %v, want 3", got)
	}
	if got := testutil.ToFloat64(telemetry.Metrics.Decisions.WithLabelValues("amb_ro_account", telemetry.OutcomeAmbiguous)); got != 0 {
		t.Errorf("ambiguous_key metric = %v, want 0", got)
	}
	if n := len(logs.FilterMessage("rate limit key is ambiguous (report only: passed, not charged in this zone)").All()); n != 3 {
		t.Errorf("%d report-only log lines, want 3", n)
	}
	// alice's bucket in the report-only zone is untouched.
	w, _, _ := serveHeader(t, h, http.Header{"X-User": {"alice"}})
	if l, r := w.Header().Get("X-Ratelimit-Limit"), w.Header().Get("X-Ratelimit-Remaining"); w.Code != 200 || l != "10" || r != "9" {
		t.Fatalf("alice, single header: %d limit %s remaining %s, want 200, 10 and 9", w.Code, l, r)
	}
}
