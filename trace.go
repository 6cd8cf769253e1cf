package sluice

import (
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/caddy-sluice/telemetry"
)

// The attributes a request's span carries of its decision, when Caddy's
// `tracing` directive records it (docs/operating.md, Tracing). OpenTelemetry
// has no convention for a rate limiter's decision (its aspnetcore.rate_limiting.*
// attributes are ASP.NET Core's own), so they follow its naming rules: the
// domain's namespace, lower case, snake_case words, durations in seconds.
const (
	attrZones      = "rate_limit.zones"
	attrZone       = "rate_limit.zone"
	attrOutcome    = "rate_limit.outcome"
	attrKey        = "rate_limit.key"
	attrLimit      = "rate_limit.limit"
	attrRemaining  = "rate_limit.remaining"
	attrRetryAfter = "rate_limit.retry_after"
	attrStoreTime  = "rate_limit.store.duration"
	attrStoreError = "rate_limit.store.error.type"
	attrDelay      = "rate_limit.delay.duration"
)

// traceVerdict puts the request's decision on its span, once the verdict
// is known (before the response, a refusal's included, and before a wait
// for its turn). A span that is not recording (no tracing) costs one
// context lookup. A request no zone decided, or whose client left before
// its decision, carries nothing; of two directives on one request, the
// later one's attributes replace the earlier one's.
func (a *admission) traceVerdict() {
	span := trace.SpanFromContext(a.r.Context())
	if !span.IsRecording() {
		return
	}
	var outcome string
	switch {
	case len(a.zones) == 0:
		return
	case a.out == refuse:
		outcome = telemetry.OutcomeRefused
	case a.out == failClosed:
		outcome = telemetry.OutcomeFailedClosed
	case a.out == unmetered && a.storeErr != nil:
		outcome = telemetry.OutcomeFailedOpen
	case a.out == unmetered:
		return // the client left before its decision
	case a.turn.wait > 0:
		outcome = telemetry.OutcomeDelayed
	case a.pass.at > 0:
		outcome = telemetry.OutcomeExceededPassed
	default:
		outcome = telemetry.OutcomeAllowed
	}
	zones := make([]string, len(a.zones))
	for i, z := range a.zones {
		zones[i] = z.name
	}
	bp := attrPool.Get().(*[]attribute.KeyValue)
	defer attrPool.Put(bp)
	attrs := append((*bp)[:0],
		attribute.String(attrOutcome, outcome),
		attribute.StringSlice(attrZones, zones),
		attribute.Float64(attrStoreTime, a.took.Seconds()))
	if a.storeErr != nil {
		attrs = append(attrs, attribute.String(attrStoreError, telemetry.ErrorKind(a.storeErr)))
	}
	if a.out != unmetered { // a verdict: its zone, its key and its numbers
		attrs = append(attrs,
			attribute.String(attrZone, a.v.zone.name),
			attribute.String(attrKey, a.v.key.String()),
			attribute.Int64(attrLimit, a.v.Limit))
	}
	switch a.out {
	case allow:
		attrs = append(attrs,
			attribute.Int64(attrRemaining, a.v.Remaining),
			attribute.Float64(attrDelay, a.turn.wait.Seconds()))
	case refuse:
		attrs = append(attrs,
			attribute.Int64(attrRemaining, a.v.Remaining),
			attribute.Float64(attrRetryAfter, a.v.RetryAfter.Seconds()))
	case failClosed:
		attrs = append(attrs, attribute.Float64(attrRetryAfter, a.v.RetryAfter.Seconds()))
	}
	span.SetAttributes(attrs...) // copied by the span
	*bp = attrs[:0]
}

// attrPool holds the attribute lists handed to the span, which escape.
var attrPool = sync.Pool{New: func() any {
	s := make([]attribute.KeyValue, 0, 10)
	return &s
}}
