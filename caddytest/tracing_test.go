package caddytest_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// otlpReceiver is an OTLP/gRPC trace collector on loopback: it keeps every
// span exported to it, by trace ID.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	addr string

	mu    sync.Mutex
	spans map[string][]*tracepb.Span // by trace ID, hex
	added chan struct{}              // closed and replaced on each export
}

// startOTLPReceiver serves an otlpReceiver on a free loopback port until
// the test ends.
func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rcv := &otlpReceiver{addr: l.Addr().String(), spans: map[string][]*tracepb.Span{}, added: make(chan struct{})}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, rcv)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return rcv
}

func (r *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				id := hex.EncodeToString(s.GetTraceId())
				r.spans[id] = append(r.spans[id], s)
			}
		}
	}
	close(r.added)
	r.added = make(chan struct{})
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// serverSpan waits (at most 30 s) for the server span of the trace traceID
// and returns its attributes.
func (r *otlpReceiver) serverSpan(t *testing.T, traceID string) map[string]*commonpb.AnyValue {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		spans, added := r.spans[traceID], r.added
		r.mu.Unlock()
		for _, s := range spans {
			if s.GetKind() == tracepb.Span_SPAN_KIND_SERVER {
				attrs := map[string]*commonpb.AnyValue{}
				for _, kv := range s.GetAttributes() {
					attrs[kv.GetKey()] = kv.GetValue()
				}
				return attrs
			}
		}
		select {
		case <-added:
		case <-deadline:
			t.Fatalf("no server span of trace %s reached the OTLP receiver in 30 s", traceID)
		}
	}
}

// traceIDs makes the W3C trace IDs of the test's requests.
var traceIDs struct {
	sync.Mutex
	n int
}

// traced returns a traceparent header of a new sampled trace, and its ID.
func traced() (header, id string) {
	traceIDs.Lock()
	traceIDs.n++
	n := traceIDs.n
	traceIDs.Unlock()
	id = fmt.Sprintf("%016x%016x", time.Now().UnixNano(), n)
	return "traceparent: 00-" + id + "-00f067aa0ba902b7-01", id
}

// TestTracingDecision: with Caddy's tracing directive on, exporting to a
// real OTLP receiver, each request's server span carries its rate limit
// decision: an allowed request's zones, deciding zone, remaining, store
// time and wait; a refusal's zone and Retry-After; a request admitted
// after a wait for its turn; an on_exceed pass zone's would-be refusal; a
// store failure under fail open, fail closed and fail local.
func TestTracingDecision(t *testing.T) {
	rcv := startOTLPReceiver(t)
	// Read by Caddy's tracing module when it creates its exporter, on the
	// first load with a tracing handler (autoexport, the OTLP exporter and
	// the batch span processor read them).
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+rcv.addr)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")

	// A Redis address nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()

	tc := newTester(t)
	tight, wide, shaped, failing := zoneName("trace_tight"), zoneName("trace_wide"), zoneName("trace_delay"), zoneName("trace_down")
	soft, closed, local := zoneName("trace_soft"), zoneName("trace_closed"), zoneName("trace_local")
	load(t, tc, config("", `
http://localhost:@A@ {
	tracing {
		span sluice_test
	}
	route /limited {
		rate_limit {
			zone @TIGHT@ {
				key {http.request.header.X-User}
				events 2
				window 1h
			}
			zone @WIDE@ {
				key {client_ip}
				events 100
				window 1h
			}
		}
		respond "ok"
	}
	route /delayed {
		rate_limit {
			zone @SHAPED@ {
				key {http.request.header.X-User}
				algorithm token_bucket
				events 1
				window 3s
				delay 5s
			}
		}
		respond "ok"
	}
	route /soft {
		rate_limit {
			zone @SOFT@ {
				key {http.request.header.X-User}
				events 1
				window 1h
				on_exceed pass
			}
		}
		respond "ok"
	}
	route /closed {
		rate_limit {
			zone @CLOSED@ {
				key {http.request.header.X-User}
				events 2
				window 1h
				fail closed
			}
			store redis redis://@DOWN@ {
				timeout 2s
			}
		}
		respond "ok"
	}
	route /local {
		rate_limit {
			zone @LOCAL@ {
				key {http.request.header.X-User}
				events 2
				window 1h
				fail local
			}
			store redis redis://@DOWN@ {
				timeout 2s
			}
		}
		respond "ok"
	}
	route /down {
		rate_limit {
			zone @FAILING@ {
				key {http.request.header.X-User}
				events 2
				window 1h
				fail open
			}
			store redis redis://@DOWN@ {
				timeout 2s
			}
		}
		respond "ok"
	}
}`, "TIGHT", tight, "WIDE", wide, "SHAPED", shaped, "FAILING", failing, "DOWN", down, "SOFT", soft, "CLOSED", closed, "LOCAL", local))
	// Before the receiver stops: a config without tracing shuts Caddy's
	// tracer provider down, its last spans flushed to the receiver.
	t.Cleanup(func() { load(t, tc, config("", "")) })

	user := "X-User: tracer-" + nonce
	request := func(path string, code int) string {
		t.Helper()
		tp, id := traced()
		expect(t, get(t, tc.Client, siteA+path, user, tp), code, path)
		return id
	}
	first := request("/limited", http.StatusOK)
	second := request("/limited", http.StatusOK)
	refused := request("/limited", http.StatusTooManyRequests)
	_ = request("/delayed", http.StatusOK) // the one event, spent
	delayed := request("/delayed", http.StatusOK)
	failed := request("/down", http.StatusOK)
	_ = request("/soft", http.StatusOK) // its one event
	passed := request("/soft", http.StatusOK)
	failedClosed := request("/closed", http.StatusServiceUnavailable)
	failedLocal := request("/local", http.StatusOK)

	str := func(attrs map[string]*commonpb.AnyValue, key string) string { return attrs[key].GetStringValue() }
	num := func(attrs map[string]*commonpb.AnyValue, key string) int64 { return attrs[key].GetIntValue() }
	secs := func(attrs map[string]*commonpb.AnyValue, key string) float64 { return attrs[key].GetDoubleValue() }
	expectAttr := func(what string, attrs map[string]*commonpb.AnyValue, key string, want any) {
		t.Helper()
		var got any
		switch want.(type) {
		case string:
			got = str(attrs, key)
		case int64:
			got = num(attrs, key)
		}
		if _, ok := attrs[key]; !ok || got != want {
			t.Errorf("%s: %s = %v (present: %v), want %v", what, key, got, ok, want)
		}
	}
	expectAbsent := func(what string, attrs map[string]*commonpb.AnyValue, keys ...string) {
		t.Helper()
		for _, k := range keys {
			if v, ok := attrs[k]; ok {
				t.Errorf("%s: %s = %v, want none", what, k, v)
			}
		}
	}
	expectZones := func(what string, attrs map[string]*commonpb.AnyValue, want ...string) {
		t.Helper()
		var got []string
		for _, v := range attrs["rate_limit.zones"].GetArrayValue().GetValues() {
			got = append(got, v.GetStringValue())
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: rate_limit.zones = %q, want %q", what, got, want)
		}
	}
	expectStoreTime := func(what string, attrs map[string]*commonpb.AnyValue) {
		t.Helper()
		if d := secs(attrs, "rate_limit.store.duration"); d <= 0 || d > 60 {
			t.Errorf("%s: rate_limit.store.duration = %v s, want a store call's time", what, d)
		}
	}

	for i, id := range []string{first, second} {
		what := fmt.Sprintf("allowed request %d", i+1)
		attrs := rcv.serverSpan(t, id)
		expectAttr(what, attrs, "rate_limit.outcome", "allowed")
		expectZones(what, attrs, tight, wide)
		expectAttr(what, attrs, "rate_limit.zone", tight) // the least remaining
		expectAttr(what, attrs, "rate_limit.limit", int64(2))
		expectAttr(what, attrs, "rate_limit.remaining", int64(1-i))
		if k := str(attrs, "rate_limit.key"); len(k) < 3 || k[0] != 'h' {
			t.Errorf("%s: rate_limit.key = %q, want the key's token", what, k)
		}
		expectStoreTime(what, attrs)
		if d, ok := attrs["rate_limit.delay.duration"]; !ok || d.GetDoubleValue() != 0 {
			t.Errorf("%s: rate_limit.delay.duration = %v, want 0", what, d)
		}
		expectAbsent(what, attrs, "rate_limit.retry_after", "rate_limit.store.error.type")
		if code := num(attrs, "http.response.status_code"); code != http.StatusOK {
			t.Errorf("%s: http.response.status_code = %d: not the request's server span", what, code)
		}
	}

	attrs := rcv.serverSpan(t, refused)
	expectAttr("refusal", attrs, "rate_limit.outcome", "refused")
	expectZones("refusal", attrs, tight, wide)
	expectAttr("refusal", attrs, "rate_limit.zone", tight)
	expectAttr("refusal", attrs, "rate_limit.remaining", int64(0))
	if ra := secs(attrs, "rate_limit.retry_after"); ra <= 0 || ra > 3600 {
		t.Errorf("refusal: rate_limit.retry_after = %v s, want within the window", ra)
	}
	expectStoreTime("refusal", attrs)
	expectAbsent("refusal", attrs, "rate_limit.delay.duration", "rate_limit.store.error.type")

	attrs = rcv.serverSpan(t, delayed)
	expectAttr("delayed", attrs, "rate_limit.outcome", "delayed")
	expectZones("delayed", attrs, shaped)
	// Its turn comes 3 s after the first's, so it waits unless the machine
	// stalled 3 s between the two.
	if d := secs(attrs, "rate_limit.delay.duration"); d <= 0 || d > 3 {
		t.Errorf("delayed: rate_limit.delay.duration = %v s, want its turn's wait (at most 3 s)", d)
	}

	attrs = rcv.serverSpan(t, failed)
	expectAttr("fail open", attrs, "rate_limit.outcome", "failed_open")
	expectZones("fail open", attrs, failing)
	expectAttr("fail open", attrs, "rate_limit.store.error.type", "connection")
	expectStoreTime("fail open", attrs)
	expectAbsent("fail open", attrs, "rate_limit.zone", "rate_limit.remaining")

	attrs = rcv.serverSpan(t, passed)
	expectAttr("on_exceed pass", attrs, "rate_limit.outcome", "exceeded_passed")
	expectAttr("on_exceed pass", attrs, "rate_limit.zone", soft)
	expectAttr("on_exceed pass", attrs, "rate_limit.remaining", int64(0))

	attrs = rcv.serverSpan(t, failedClosed)
	expectAttr("fail closed", attrs, "rate_limit.outcome", "failed_closed")
	expectAttr("fail closed", attrs, "rate_limit.zone", closed)
	if str(attrs, "rate_limit.store.error.type") == "" {
		t.Error("fail closed: no rate_limit.store.error.type")
	}
	if ra := secs(attrs, "rate_limit.retry_after"); ra <= 0 {
		t.Errorf("fail closed: rate_limit.retry_after = %v s, want the 503's wait", ra)
	}
	expectAbsent("fail closed", attrs, "rate_limit.remaining", "rate_limit.delay.duration")

	// Decided by this instance's memory store: its numbers, and the failure.
	attrs = rcv.serverSpan(t, failedLocal)
	expectAttr("fail local", attrs, "rate_limit.outcome", "allowed")
	expectAttr("fail local", attrs, "rate_limit.zone", local)
	expectAttr("fail local", attrs, "rate_limit.remaining", int64(1))
	if str(attrs, "rate_limit.store.error.type") == "" {
		t.Error("fail local: no rate_limit.store.error.type")
	}
}
