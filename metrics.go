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
	// concurrentSlots: see concurrency.go.
	concurrentSlots *prometheus.GaugeVec
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
)

func initMetrics(registry *prometheus.Registry) error {
	const ns, sub = "caddy", "rate_limit"
	metrics.once.Do(func() {
		metrics.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Rate limit decisions by zone and outcome (allowed, refused, vetoed, report_only_refused, failed_open, failed_closed, failed_local, ambiguous_key, report_only_ambiguous_key).",
		}, []string{"zone", "outcome"})
		metrics.storeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
			Help:    "Time of one store call (every zone of one request), by store.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5},
		}, []string{"store"})
		metrics.storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_errors_total",
			Help: "Store calls that failed, by store and kind (timeout, connection, readonly, oom, noscript, circuit_open, other).",
		}, []string{"store", "kind"})
		metrics.fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "dynamic_fallbacks_total",
			Help: "Per-request values (events, window, burst, cost) that were empty or unusable, or resolved to an invalid limit (limit), so the zone's default applied; by zone and field.",
		}, []string{"zone", "field"})
		metrics.concurrentSlots = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "concurrent_slots",
			Help: "Concurrency slots held by this instance's running requests, by zone (requests admitted by a concurrency zone that have not ended).",
		}, []string{"zone"})
	})
	for _, c := range []prometheus.Collector{metrics.decisions, metrics.storeDuration, metrics.storeErrors, metrics.fallbacks, metrics.concurrentSlots} {
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
// (StoreErrorKind; redisstore's: timeout, connection, readonly, oom,
// noscript, circuit_open, other), else timeout for a deadline, else other.
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
func countDecisions(s *scratch, refused bool) {
	for i, z := range s.zones {
		if z.metrics == nil {
			return
		}
		wouldRefuse := !s.decs[i].Allowed
		switch {
		case wouldRefuse && s.reqs[i].ReportOnly:
			z.metrics.reportOnly.Inc()
		case !refused:
			z.metrics.allowed.Inc()
		case wouldRefuse:
			z.metrics.refused.Inc()
		default:
			z.metrics.vetoed.Inc()
		}
	}
}
