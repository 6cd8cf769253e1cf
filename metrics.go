package sluice

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/caddy-sluice/telemetry"
)

// zoneMetrics are one zone's counters, resolved once at Provision so the hot
// path only does an atomic add.
type zoneMetrics struct {
	allowed, refused, vetoed, reportOnly, failedOpen, failedClosed, failedLocal prometheus.Counter
	// ambiguous counts requests whose key was ambiguous (refused with 400,
	// or passed uncharged in a report-only zone: reportOnlyAmbiguous).
	ambiguous, reportOnlyAmbiguous prometheus.Counter
	// passed counts would-be refusals of an on_exceed pass zone; refunded,
	// a count zone's charges given back.
	passed, refunded prometheus.Counter
	// delayed counts a delay zone's admissions with a wait; delay observes
	// the waits it imposed (the longest of a request's); abandoned, the
	// waits whose client went away.
	delayed, abandoned prometheus.Counter
	delay              prometheus.Observer
	// fallbacks counts unusable per-request values by field; nil for a
	// zone with nothing chosen per request.
	fallbacks *[numFields]prometheus.Counter
}

func newZoneMetrics(zone string, perRequest bool) *zoneMetrics {
	c := func(outcome string) prometheus.Counter {
		return telemetry.Metrics.Decisions.WithLabelValues(zone, outcome)
	}
	m := &zoneMetrics{
		allowed: c(telemetry.OutcomeAllowed), refused: c(telemetry.OutcomeRefused), vetoed: c(telemetry.OutcomeVetoed), reportOnly: c(telemetry.OutcomeReportOnly),
		failedOpen: c(telemetry.OutcomeFailedOpen), failedClosed: c(telemetry.OutcomeFailedClosed), failedLocal: c(telemetry.OutcomeFailedLocal),
		ambiguous: c(telemetry.OutcomeAmbiguous), reportOnlyAmbiguous: c(telemetry.OutcomeReportOnlyAmbiguous),
		passed: c(telemetry.OutcomeExceededPassed), refunded: telemetry.Metrics.Refunds.WithLabelValues(zone),
		delayed: c(telemetry.OutcomeDelayed), abandoned: telemetry.Metrics.Abandoned.WithLabelValues(zone), delay: telemetry.Metrics.Delays.WithLabelValues(zone),
	}
	if perRequest {
		m.fallbacks = new([numFields]prometheus.Counter)
		for f, name := range fieldNames {
			m.fallbacks[f] = telemetry.Metrics.Fallbacks.WithLabelValues(zone, name)
		}
	}
	return m
}

// countDecisions records the outcome of every zone of a decided request.
func countDecisions(s *admission, refused bool) {
	if len(s.zones) > 0 && s.zones[0].metrics != nil {
		recordActivity(s, refused) // for the live page (admin.go)
	}
	for i, z := range s.zones {
		if z.metrics == nil {
			return
		}
		wouldRefuse := !s.decs[i].Allowed
		switch {
		case wouldRefuse && z.pass.forward:
			z.metrics.passed.Inc()
		case wouldRefuse && s.reqs[i].ReportOnly:
			z.metrics.reportOnly.Inc()
		case !refused && s.decs[i].Delay > 0:
			z.metrics.delayed.Inc()
		case !refused:
			z.metrics.allowed.Inc()
		case wouldRefuse:
			z.metrics.refused.Inc()
		default:
			z.metrics.vetoed.Inc()
		}
	}
}
