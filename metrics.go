package sluice

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The collectors are created once per process and registered in the
// registry of every configuration that loads (Caddy makes a new registry per
// config), so their values carry across reloads. Labels are bounded: the
// zone (a config-defined name) and a fixed set of outcomes or kinds; never a
// key.
var metrics = struct {
	once          sync.Once
	decisions     *prometheus.CounterVec
	storeDuration *prometheus.HistogramVec
	storeErrors   *prometheus.CounterVec
	fallbacks     *prometheus.CounterVec
	refunds       *prometheus.CounterVec
	delays        *prometheus.HistogramVec
	abandoned     *prometheus.CounterVec
	waiting       prometheus.Gauge
	// concurrentSlots: see concurrency.go.
	concurrentSlots *prometheus.GaugeVec
	// settled and settleMissing: see settle.go.
	settled, settleMissing *prometheus.CounterVec
	// adaptiveLimit, adaptiveBaseline, adaptiveLatency: see adaptive.go.
	adaptiveLimit, adaptiveBaseline, adaptiveLatency *prometheus.GaugeVec
}{}

// Decision outcomes, the values of the outcome label.
const (
	outcomeAllowed      = "allowed"
	outcomeRefused      = "refused"
	outcomeVetoed       = "vetoed" // the zone allowed, another zone of the request refused
	outcomeReportOnly   = "report_only_refused"
	outcomeFailedOpen   = "failed_open"
	outcomeFailedClosed = "failed_closed"
	outcomeFailedLocal  = "failed_local"
	// The request carried a field its key reads (a header, a cookie, a
	// query argument) several times with different values: refused with
	// 400, nothing charged in any zone; in a report-only zone, passed and
	// not charged in that zone.
	outcomeAmbiguous           = "ambiguous_key"
	outcomeReportOnlyAmbiguous = "report_only_ambiguous_key"
	// An on_exceed pass zone would refuse: the request was forwarded,
	// marked (pass.go).
	outcomeExceededPassed = "exceeded_passed"
	// A zone with delay admitted the request later: it waited its turn
	// (delay.go).
	outcomeDelayed = "delayed"
)

func initMetrics(registry *prometheus.Registry) error {
	const ns, sub = "caddy", "rate_limit"
	metrics.once.Do(func() {
		metrics.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Rate limit decisions by zone and outcome (allowed, delayed, refused, vetoed, report_only_refused, exceeded_passed, failed_open, failed_closed, failed_local, ambiguous_key, report_only_ambiguous_key).",
		}, []string{"zone", "outcome"})
		metrics.storeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
			Help:    "Time of one store call (every zone of one request), by store.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5},
		}, []string{"store"})
		metrics.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_errors_total",
			Help: "Store calls that failed, by store and kind (timeout, connection, tls, readonly, noreplicas, oom, noscript, noperm, circuit_open, other).",
		}, []string{"store", "kind"})
		metrics.fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "dynamic_fallbacks_total",
			Help: "Per-request values (events, window, burst, cost) that were empty or unusable, or resolved to an invalid limit (limit), so the zone's default applied; by zone and field.",
		}, []string{"zone", "field"})
		metrics.refunds = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "refunds_total",
			Help: "Charges given back by a zone with count or settle: requests whose response status the zone does not count (count) or charge (settle free), by zone.",
		}, []string{"zone"})
		metrics.delays = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "delay_seconds",
			Help:    "Requests that waited their turn (zones with delay) and how long, by the zone that made them wait longest.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"zone"})
		metrics.abandoned = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "delay_abandoned_total",
			Help: "Waiting requests whose client went away (or whose server shut down) before their turn: their reservations were given back.",
		}, []string{"zone"})
		metrics.waiting = prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "waiting",
			Help: "Requests waiting for their turn now (zones with delay), in this process.",
		})
		metrics.concurrentSlots = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "concurrent_slots",
			Help: "Concurrency slots held by this instance's running requests, by zone (requests admitted by a concurrency zone that have not ended).",
		}, []string{"zone"})
		metrics.settled = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "settled_units_total",
			Help: "Units a zone with settle charged as its responses reported them (the actual amounts, estimates replaced), by zone.",
		}, []string{"zone"})
		metrics.settleMissing = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "settle_missing_total",
			Help: "Responses of a zone with settle that told no usable amount (missing, not a whole number, negative, above 2^53, the client gone first): a 2xx response charged by the zone's unknown rule, another keeping the estimate, by zone.",
		}, []string{"zone"})
		metrics.adaptiveLimit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "adaptive_limit",
			Help: "An adaptive concurrency zone's learnt limit on this instance, by zone (of the key whose window of latencies closed last).",
		}, []string{"zone"})
		metrics.adaptiveBaseline = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "adaptive_baseline_seconds",
			Help: "An adaptive concurrency zone's baseline latency, what its controller takes for unloaded, by zone (of the key whose window closed last).",
		}, []string{"zone"})
		metrics.adaptiveLatency = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "adaptive_latency_seconds",
			Help: "An adaptive concurrency zone's sample latency: the mean time to the first byte of the last window's responses, by zone.",
		}, []string{"zone"})
	})
	for _, c := range []prometheus.Collector{metrics.decisions, metrics.storeDuration, metrics.storeErrors, metrics.fallbacks, metrics.refunds, metrics.delays, metrics.abandoned, metrics.waiting, metrics.concurrentSlots,
		metrics.settled, metrics.settleMissing, metrics.adaptiveLimit, metrics.adaptiveBaseline, metrics.adaptiveLatency} {
		if err := registry.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return nil
}

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
	c := func(outcome string) prometheus.Counter { return metrics.decisions.WithLabelValues(zone, outcome) }
	m := &zoneMetrics{
		allowed: c(outcomeAllowed), refused: c(outcomeRefused), vetoed: c(outcomeVetoed), reportOnly: c(outcomeReportOnly),
		failedOpen: c(outcomeFailedOpen), failedClosed: c(outcomeFailedClosed), failedLocal: c(outcomeFailedLocal),
		ambiguous: c(outcomeAmbiguous), reportOnlyAmbiguous: c(outcomeReportOnlyAmbiguous),
		passed: c(outcomeExceededPassed), refunded: metrics.refunds.WithLabelValues(zone),
		delayed: c(outcomeDelayed), abandoned: metrics.abandoned.WithLabelValues(zone), delay: metrics.delays.WithLabelValues(zone),
	}
	if perRequest {
		m.fallbacks = new([numFields]prometheus.Counter)
		for f, name := range fieldNames {
			m.fallbacks[f] = metrics.fallbacks.WithLabelValues(zone, name)
		}
	}
	return m
}

// storeMetrics observe one store's calls.
type storeMetrics struct {
	name     string
	duration prometheus.Observer
}

func newStoreMetrics(name string) *storeMetrics {
	return &storeMetrics{name: name, duration: metrics.storeDuration.WithLabelValues(name)}
}

func (m *storeMetrics) observe(start time.Time) {
	m.duration.Observe(time.Since(start).Seconds())
}

func (m *storeMetrics) failed(err error) {
	metrics.storeErrors.WithLabelValues(m.name, errorKind(err)).Inc()
}

// errorKind is a store error's kind label: the kind the error names itself
// (StoreErrorKind; redisstore's: timeout, connection, tls, readonly,
// noreplicas, oom, noscript, noperm, circuit_open, other), else timeout for
// a deadline, else other.
func errorKind(err error) string {
	var k interface{ StoreErrorKind() string }
	switch {
	case errors.As(err, &k):
		return k.StoreErrorKind()
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "other"
}

// countDecisions records the outcome of every zone of a decided request.
func countDecisions(s *admission, refused bool) {
	if len(s.zones) > 0 && s.zones[0].metrics != nil {
		recordActivity(s, refused) // for the live page (recent.go)
	}
	for i, z := range s.zones {
		if z.metrics == nil {
			return
		}
		wouldRefuse := !s.decs[i].Allowed
		switch {
		case wouldRefuse && z.pass:
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
