package sluice

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// BenchmarkServeHTTPTraced prices the decision on the span, side by side,
// on the handler alone as BenchmarkServeHTTPDecision: off (no span in the
// request's context: Caddy's tracing not on the route), unsampled (a span
// that does not record), and recording (a sampled span of the OpenTelemetry
// SDK, no exporter, started and ended per request) beside span_only, the
// same span around no handler: recording minus span_only is what the
// decision's attributes cost.
//
//	go test -run XXX -bench ServeHTTPTraced -benchmem .
func BenchmarkServeHTTPTraced(b *testing.B) {
	for _, c := range []struct {
		name    string
		sampler sdktrace.Sampler // nil: no span
		handler bool
	}{
		{"off", nil, true},
		{"unsampled", sdktrace.NeverSample(), true},
		{"recording", sdktrace.AlwaysSample(), true},
		{"span_only", sdktrace.AlwaysSample(), false},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := newHandler(b, `rate_limit {
		zone traced {
			key {http.vars.client_ip}
			events 1000000000
			window 1s
		}
		headers off
	}`, nil)
			h.logger = zap.NewNop()
			w := newBenchWriter()
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = "192.0.2.1:40000"
			r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
			var tracer trace.Tracer
			if c.sampler != nil {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(c.sampler))
				defer func() { _ = tp.Shutdown(context.Background()) }()
				tracer = tp.Tracer("bench")
			}
			b.ReportAllocs()
			cpu0, cpuOK := processCPU()
			for b.Loop() {
				w.reset()
				rs, span := r, trace.Span(nil)
				if tracer != nil {
					var ctx context.Context
					ctx, span = tracer.Start(r.Context(), "handler", trace.WithSpanKind(trace.SpanKindServer))
					rs = r.WithContext(ctx)
				}
				var err error
				if c.handler {
					err = h.ServeHTTP(w, rs, okHandler)
				} else {
					err = okHandler.ServeHTTP(w, rs)
				}
				if err != nil || w.status != http.StatusOK {
					b.Fatalf("status %d, err %v", w.status, err)
				}
				if span != nil {
					span.End()
				}
			}
			if cpu1, ok := processCPU(); cpuOK && ok {
				b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
			}
		})
	}
}

// BenchmarkTraceVerdictOff is what traceVerdict costs a request without a
// span (tracing off), its context as Caddy's server prepares it: the
// lookup of the span, alone.
//
//	go test -run XXX -bench TraceVerdictOff -benchmem .
func BenchmarkTraceVerdictOff(b *testing.B) {
	r := httptest.NewRequest("GET", "/", nil)
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), newBenchWriter(), &caddyhttp.Server{})
	a := &admission{r: r}
	b.ReportAllocs()
	for b.Loop() {
		a.traceVerdict()
	}
}
