package telemetry

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the collectors, created once per process and registered in the
// registry of every configuration that loads (Caddy makes a new registry per
// config), so their values carry across reloads. Labels are bounded: the
// zone (a config-defined name) and a fixed set of outcomes or kinds; never a
// key.
var Metrics = struct {
	once          sync.Once
	Decisions     *prometheus.CounterVec
	StoreDuration *prometheus.HistogramVec
	StoreErrors   *prometheus.CounterVec
	Fallbacks     *prometheus.CounterVec
	Refunds       *prometheus.CounterVec
	Delays        *prometheus.HistogramVec
	Abandoned     *prometheus.CounterVec
	Waiting       prometheus.Gauge
	// ConcurrentSlots: see the root's concurrency.go.
	ConcurrentSlots *prometheus.GaugeVec
	// Settled and SettleMissing: see the root's settle.go.
	Settled, SettleMissing *prometheus.CounterVec
	// AdaptiveLimit, AdaptiveBaseline, AdaptiveLatency: see the root's adaptive.go.
	AdaptiveLimit, AdaptiveBaseline, AdaptiveLatency *prometheus.GaugeVec
	// AdaptiveMinimum, AdaptiveMaximum: an adaptive zone's bounds, so an
	// alert can tell a limit pinned at its minimum.
	AdaptiveMinimum, AdaptiveMaximum *prometheus.GaugeVec
	// Overrides: see the root's overrides.go.
	Overrides *prometheus.GaugeVec
}{}

// Decision outcomes, the values of the outcome label.
const (
	OutcomeAllowed      = "allowed"
	OutcomeRefused      = "refused"
	OutcomeVetoed       = "vetoed" // the zone allowed, another zone of the request refused
	OutcomeReportOnly   = "report_only_refused"
	OutcomeFailedOpen   = "failed_open"
	OutcomeFailedClosed = "failed_closed"
	OutcomeFailedLocal  = "failed_local"
	// The request carried a field its key reads (a header, a cookie, a
	// query argument) several times with different values: refused with
	// 400, nothing charged in any zone; in a report-only zone, passed and
	// not charged in that zone.
	OutcomeAmbiguous           = "ambiguous_key"
	OutcomeReportOnlyAmbiguous = "report_only_ambiguous_key"
	// An on_exceed pass zone would refuse: the request was forwarded,
	// marked (pass.go).
	OutcomeExceededPassed = "exceeded_passed"
	// A zone with delay admitted the request later: it waited its turn
	// (delay.go).
	OutcomeDelayed = "delayed"
)

// Register creates the collectors (once per process) and registers them
// in registry (a configuration's).
func Register(registry *prometheus.Registry) error {
	const ns, sub = "caddy", "rate_limit"
	Metrics.once.Do(func() {
		Metrics.Decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Rate limit decisions by zone and outcome (allowed, delayed, refused, vetoed, report_only_refused, exceeded_passed, failed_open, failed_closed, failed_local, ambiguous_key, report_only_ambiguous_key).",
		}, []string{"zone", "outcome"})
		Metrics.StoreDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "store_duration_seconds",
			Help:    "Time of one store call (every zone of one request), by store.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5},
		}, []string{"store"})
		Metrics.StoreErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_errors_total",
			Help: "Store calls that failed, by store and kind (timeout, connection, tls, readonly, noreplicas, oom, noscript, noperm, circuit_open, other).",
		}, []string{"store", "kind"})
		Metrics.Fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "dynamic_fallbacks_total",
			Help: "Per-request values (events, window, burst, cost) that were empty or unusable, or resolved to an invalid limit (limit), so the zone's default applied; by zone and field.",
		}, []string{"zone", "field"})
		Metrics.Refunds = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "refunds_total",
			Help: "Charges given back by a zone with count or settle: requests whose response status the zone does not count (count) or charge (settle free), by zone.",
		}, []string{"zone"})
		Metrics.Delays = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "delay_seconds",
			Help:    "Requests that waited their turn (zones with delay) and how long, by the zone that made them wait longest.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"zone"})
		Metrics.Abandoned = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "delay_abandoned_total",
			Help: "Waiting requests whose client went away (or whose server shut down) before their turn: their reservations were given back.",
		}, []string{"zone"})
		Metrics.Waiting = prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "waiting",
			Help: "Requests waiting for their turn now (zones with delay), in this process.",
		})
		Metrics.ConcurrentSlots = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "concurrent_slots",
			Help: "Concurrency slots held by this instance's running requests, by zone (requests admitted by a concurrency zone that have not ended).",
		}, []string{"zone"})
		Metrics.Settled = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "settled_units_total",
			Help: "Units a zone with settle charged as its responses reported them (the actual amounts, estimates replaced), by zone.",
		}, []string{"zone"})
		Metrics.SettleMissing = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "settle_missing_total",
			Help: "Responses of a zone with settle that told no usable amount (missing, not a whole number, negative, above 2^53, the client gone first): a 2xx response charged by the zone's unknown rule, another keeping the estimate, by zone.",
		}, []string{"zone"})
		Metrics.AdaptiveLimit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "adaptive_limit",
			Help: "An adaptive concurrency zone's learnt limit on this instance, by zone (of the key whose window of latencies closed last).",
		}, []string{"zone"})
		Metrics.AdaptiveBaseline = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "adaptive_baseline_seconds",
			Help: "An adaptive concurrency zone's baseline latency, what its controller takes for unloaded, by zone (of the key whose window closed last).",
		}, []string{"zone"})
		Metrics.AdaptiveLatency = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "adaptive_latency_seconds",
			Help: "An adaptive concurrency zone's sample latency: the mean time to the first byte of the last window's responses, by zone.",
		}, []string{"zone"})
		Metrics.AdaptiveMinimum = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "adaptive_minimum",
			Help: "An adaptive concurrency zone's minimum setting, the least its limit falls to, by zone.",
		}, []string{"zone"})
		Metrics.AdaptiveMaximum = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "adaptive_maximum",
			Help: "An adaptive concurrency zone's maximum setting, the most its limit grows to, by zone.",
		}, []string{"zone"})
		Metrics.Overrides = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "overrides",
			Help: "Overrides in force in a zone (set through the admin API), as last read from its store (every 5s, and at each set, delete or listing), by zone.",
		}, []string{"zone"})
	})
	for _, c := range []prometheus.Collector{Metrics.Overrides, Metrics.Decisions, Metrics.StoreDuration, Metrics.StoreErrors, Metrics.Fallbacks, Metrics.Refunds, Metrics.Delays, Metrics.Abandoned, Metrics.Waiting, Metrics.ConcurrentSlots,
		Metrics.Settled, Metrics.SettleMissing, Metrics.AdaptiveLimit, Metrics.AdaptiveBaseline, Metrics.AdaptiveLatency, Metrics.AdaptiveMinimum, Metrics.AdaptiveMaximum} {
		if err := registry.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return err
		}
	}
	return nil
}

// StoreMetrics observe one store's calls.
type StoreMetrics struct {
	name     string
	duration prometheus.Observer
}

// NewStoreMetrics returns the metrics of the store named.
func NewStoreMetrics(name string) *StoreMetrics {
	return &StoreMetrics{name: name, duration: Metrics.StoreDuration.WithLabelValues(name)}
}

// Observe observes the time a store call took.
func (m *StoreMetrics) Observe(took time.Duration) {
	m.duration.Observe(took.Seconds())
}

// Failed counts a failed store call by its error's kind.
func (m *StoreMetrics) Failed(err error) {
	Metrics.StoreErrors.WithLabelValues(m.name, ErrorKind(err)).Inc()
}

// ErrorKind is a store error's kind (its label, and a span's
// rate_limit.store.error.type): the kind the error names itself
// (StoreErrorKind; redisstore's: timeout, connection, tls, readonly,
// noreplicas, oom, noscript, noperm, circuit_open, other), else timeout for
// a deadline, else other.
func ErrorKind(err error) string {
	var k interface{ StoreErrorKind() string }
	switch {
	case errors.As(err, &k):
		return k.StoreErrorKind()
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "other"
}
