package sluice

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/telemetry"
)

// concurrencyControl: `concurrent <n>` limits how many requests of one key
// are in flight at once. A request is given a slot at admission, in the one
// Store.Take with its other zones, under its holder id (algorithms.Request.Holder),
// and gives exactly that slot back on every exit (the exit hook). A
// refusal's Retry-After is raised to a hint from the hold times seen here.
// docs/architecture.md says how it combines with count, delay and pass.
var concurrencyControl = control{
	name: "concurrency",
	compile: func(z *zone, cfg *Zone) error {
		if cfg.Adaptive == nil { // adaptive.go
			z.compileConcurrency()
		}
		return nil
	},
	provision: provisionConcurrency,
	admin:     concurrencyInfo,
	hooks: hooks{
		plan:    func(_ *admission, z *zone, rq *algorithms.Request) { rq.Holder = z.holder() },
		rank:    concurrencyHints,
		verdict: func(a *admission) { holdSlots(a.reserve()) },
		exit:    releaseHeld,
	},
}

// maxConcurrencyRetry caps the Retry-After a concurrency refusal derives
// from observed hold times (concurrencyZone.retryHint).
const maxConcurrencyRetry = time.Minute

// concurrencyZone is what a concurrency zone keeps at run time.
type concurrencyZone struct {
	// hold is a moving average of the time its requests held a slot on
	// this instance, in nanoseconds (0: none seen yet).
	hold atomic.Int64
	// slots is caddy_rate_limit_concurrent_slots{zone}; nil without
	// metrics.
	slots prometheus.Gauge
}

// compileConcurrency sets up a concurrency zone's run time; nothing for a
// rate zone. (Its limit and concurrent_from: zonemodel.)
func (z *zone) compileConcurrency() {
	if z.limit.Algorithm == algorithms.Concurrency {
		z.conc = new(concurrencyZone)
		z.giver = z.conc
	}
}

// concurrencyPolicyItem is a concurrency zone's RateLimit-Policy member
// (draft-ietf-httpapi-ratelimit-headers-11): the quota q in the registered
// unit concurrent-requests, and no window (it has none).
func (z *zone) concurrencyPolicyItem(l algorithms.Limit) string {
	return z.sfName + ";q=" + strconv.FormatInt(l.Events, 10) + `;qu="concurrent-requests"`
}

// holder returns a new holder id for a request's slot in zone z (never
// 0), or 0 in a rate zone. Random 64-bit ids: two requests of one key in
// flight at once rarely share one (about n²/2^65).
func (z *zone) holder() uint64 {
	if z.conc == nil {
		return 0
	}
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

// retryHint is a concurrency refusal's Retry-After, from the hold times
// this instance observed in the zone: a slot frees, on average, every
// (average hold time) / n when all n are busy. At least the store's
// (algorithms.ConcurrencyRetry, one second), at most maxConcurrencyRetry.
func (c *concurrencyZone) retryHint(n int64) time.Duration {
	return min(time.Duration(c.hold.Load()/max(n, 1)), maxConcurrencyRetry)
}

// observe folds one hold time into the zone's moving average (weight 1/8:
// about the last dozen requests). Concurrent updates may lose one another's
// sample, which an estimate can afford.
func (c *concurrencyZone) observe(d time.Duration) {
	old := c.hold.Load()
	if old == 0 {
		c.hold.Store(int64(d))
		return
	}
	c.hold.Store(old + (int64(d)-old)/8)
}

// concurrencyHints raises the RetryAfter (and ResetAfter) of the
// concurrency refusals among s's decisions to the zone's retryHint.
func concurrencyHints(s *admission) {
	for i := range s.decs {
		d, z := &s.decs[i], s.zones[i]
		if d.Allowed || z.conc == nil {
			continue
		}
		if hint := z.conc.retryHint(s.reqs[i].Limit.Events); hint > d.RetryAfter {
			d.RetryAfter, d.ResetAfter = hint, hint
		}
	}
}

// holdSlots counts the slots reserved in rs as held from now (the slots
// gauge, and the hold time that feeds the Retry-After hint).
func holdSlots(rs *reservation) {
	var now time.Time
	for i := range rs.charges {
		c := &rs.charges[i]
		cz, ok := c.back.(*concurrencyZone)
		if !ok || !c.since.IsZero() {
			continue
		}
		if now.IsZero() {
			now = time.Now()
		}
		if cz.slots != nil {
			cz.slots.Inc()
		}
		c.since = now
	}
}

// give releases a concurrency zone's slot when the request ends or is
// called off (reservation.go), recording how long a held one was held.
func (cz *concurrencyZone) give(c *charge, why giving, _ int, _ *algorithms.Refund) gift {
	if why&giveRelease == 0 {
		return keep
	}
	if !c.since.IsZero() {
		cz.observe(max(time.Since(c.since), 1))
		if cz.slots != nil {
			cz.slots.Dec()
		}
	}
	return release
}

// releaseHeld gives an allowed request's slots back to the store that
// granted them (its reservation) and records how long they were held.
func releaseHeld(a *admission) {
	if err := a.res.give(giveRelease, 0); err != nil {
		a.h.storeErrors.Log(a.h.logger, zap.ErrorLevel, "rate limit store failed to release concurrency slots; they end with their lease", zap.Error(err))
	}
}

// provisionConcurrency checks that the stores of a handler with
// concurrency zones can hold slots, sets up their metrics, and has the
// store inherit the slots held elsewhere in its zones.
func provisionConcurrency(h *Handler) (stages, error) {
	var names []string
	for _, z := range h.zones {
		if z.conc == nil {
			continue
		}
		names = append(names, z.name)
		if _, ok := h.store.(releaser); !ok {
			return 0, zoneErr(z.name, fmt.Errorf("concurrent: the store (%T) cannot hold concurrency slots", h.store))
		}
		if z.metrics != nil {
			z.conc.slots = telemetry.Metrics.ConcurrentSlots.WithLabelValues(z.name)
		}
	}
	if _, ok := h.local.(releaser); names != nil && h.local != nil && !ok {
		return 0, fmt.Errorf("concurrent: the fail-local store (%T) cannot hold concurrency slots", h.local)
	}
	if heir, ok := h.store.(slotHeir); ok && names != nil {
		heir.InheritSlots(names)
	}
	if names == nil {
		return 0, nil
	}
	return joins(atPlan, atRank, atVerdict, atExit), nil
}

// concurrencyInfo fills in a concurrency zone's fields of the admin API's
// listing.
func concurrencyInfo(z *zone, i *adminZoneInfo) {
	if z.conc == nil {
		return
	}
	lease := time.Duration(z.limit.Window) * time.Millisecond
	i.Concurrent, i.Lease, i.LeaseMs = z.limit.Events, lease.String(), z.limit.Window
	i.Events, i.Window, i.WindowMs, i.Burst = 0, "", 0, 0
}
