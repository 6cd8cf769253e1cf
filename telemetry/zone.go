package telemetry

import "github.com/prometheus/client_golang/prometheus"

// ZoneMetrics are one zone's counters, resolved once at Provision so the
// hot path only does an atomic add.
type ZoneMetrics struct {
	Allowed, Refused, Vetoed, ReportOnly, FailedOpen, FailedClosed, FailedLocal prometheus.Counter
	// Ambiguous counts requests whose key was ambiguous (refused with 400,
	// or passed uncharged in a report-only zone: ReportOnlyAmbiguous).
	Ambiguous, ReportOnlyAmbiguous prometheus.Counter
	// Passed counts would-be refusals of an on_exceed pass zone; Refunded,
	// a count zone's charges given back.
	Passed, Refunded prometheus.Counter
	// Delayed counts a delay zone's admissions with a wait; Delay observes
	// the waits it imposed (the longest of a request's); Abandoned, the
	// waits whose client went away.
	Delayed, Abandoned prometheus.Counter
	Delay              prometheus.Observer
	// Fallbacks counts unusable per-request values, by field (the index of
	// the field in the names given to NewZoneMetrics); nil for a zone with
	// nothing chosen per request.
	Fallbacks []prometheus.Counter
}

// NewZoneMetrics resolves zone's counters; fields names the values chosen
// per request (nil: none), whose fallbacks are counted.
func NewZoneMetrics(zone string, fields []string) *ZoneMetrics {
	c := func(outcome string) prometheus.Counter {
		return Metrics.Decisions.WithLabelValues(zone, outcome)
	}
	m := &ZoneMetrics{
		Allowed: c(OutcomeAllowed), Refused: c(OutcomeRefused), Vetoed: c(OutcomeVetoed), ReportOnly: c(OutcomeReportOnly),
		FailedOpen: c(OutcomeFailedOpen), FailedClosed: c(OutcomeFailedClosed), FailedLocal: c(OutcomeFailedLocal),
		Ambiguous: c(OutcomeAmbiguous), ReportOnlyAmbiguous: c(OutcomeReportOnlyAmbiguous),
		Passed: c(OutcomeExceededPassed), Refunded: Metrics.Refunds.WithLabelValues(zone),
		Delayed: c(OutcomeDelayed), Abandoned: Metrics.Abandoned.WithLabelValues(zone), Delay: Metrics.Delays.WithLabelValues(zone),
	}
	for _, name := range fields {
		m.Fallbacks = append(m.Fallbacks, Metrics.Fallbacks.WithLabelValues(zone, name))
	}
	return m
}
